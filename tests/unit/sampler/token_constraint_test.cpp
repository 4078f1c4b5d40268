// Token masks of the tool-call constraint on the real Qwen3.5 tokenizer (248,077 ids): every
// mask equals the brute-force answer (each token's text walked through the automaton), and
// sampling random logits under the mask yields output that parses into valid tool calls.
#include "runtime/token_constraint.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>

#include "runtime/sampler.h"
#include "runtime/structured_constraint.h"
#include "text/json_schema_compiler.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"
#include "../tokenizer/qwen35_tokenizer.h"

namespace sparkserve {
namespace {

struct Fixture {
  Tokenizer tok;
  std::shared_ptr<const VocabTexts> vocab;
};

const Fixture& fixture() {
  static const Fixture* f = [] {
    auto t = testing::load_qwen35_tokenizer();
    if (!t.ok()) {
      ADD_FAILURE() << t.message();
      std::abort();
    }
    auto* fx = new Fixture{std::move(*t), nullptr};
    auto t0 = std::chrono::steady_clock::now();
    fx->vocab = VocabTexts::build(fx->tok);
    std::printf("VocabTexts::build: %.1f ms for %zu tokens\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                fx->vocab->size());
    return fx;
  }();
  return *f;
}

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string","enum":["Paris","Rome"]},"days":{"type":"integer"}},"required":["city"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
     "query":{"type":"string"},"limit":{"type":"number"}}}}}
])";

ToolCallGrammar grammar(bool thinking, std::optional<std::string> only = std::nullopt) {
  ToolCallGrammarOptions o;
  o.thinking = thinking;
  o.only_function = std::move(only);
  return std::move(ToolCallGrammar::build(OrderedJson::parse(kTools), o)).value();
}

std::vector<int32_t> end_ids(const Tokenizer& tok) {
  return {*tok.token_to_id("<|im_end|>"), *tok.token_to_id("<|endoftext|>")};
}

// Compares a mask with brute force: end ids allowed iff `accepting`, special and empty tokens
// never, every other token iff `walks(bytes)`. Prints the count and the mask's time.
void expect_mask_equals(const std::vector<uint8_t>& mask, double ms, const std::string& label, bool accepting,
                        const std::function<bool(std::string_view)>& walks) {
  const Fixture& f = fixture();
  size_t allowed = 0, mismatches = 0;
  const auto ends = end_ids(f.tok);
  for (size_t id = 0; id < mask.size(); ++id) {
    const auto tid = static_cast<int32_t>(id);
    bool expect;
    if (std::find(ends.begin(), ends.end(), tid) != ends.end()) expect = accepting;
    else if (f.tok.is_special(tid) || f.vocab->bytes(tid).empty()) expect = false;
    else expect = walks(f.vocab->bytes(tid));
    allowed += mask[id];
    if (static_cast<bool>(mask[id]) != expect && ++mismatches <= 5)
      ADD_FAILURE() << "token " << id << " '" << f.vocab->bytes(tid) << "': mask " << int(mask[id])
                    << ", automaton " << expect << " after '" << label << "'";
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(allowed, 0u);
  std::printf("mask after %-60s %6zu allowed, %.2f ms\n", ("'" + label + "'").substr(0, 60).c_str(), allowed, ms);
}

// The mask after feeding `prefix` (as token texts would: byte by byte) against brute force.
void expect_mask_matches_brute_force(bool thinking, const std::string& prefix, std::optional<std::string> only = {}) {
  const Fixture& f = fixture();
  ToolCallGrammar g = grammar(thinking, only);
  ToolCallConstraint c(g, f.vocab, end_ids(f.tok));
  ToolCallState s = g.initial();
  ASSERT_TRUE(g.step_all(s, prefix)) << prefix;
  // Drive the constraint with single-byte tokens (they exist for every byte in byte-level BPE).
  for (char ch : prefix) {
    // Byte-level BPE spells '\n' and ' ' as U+010A and U+0120.
    auto id = f.tok.token_to_id(ch == '\n' ? "\xc4\x8a" : ch == ' ' ? "\xc4\xa0" : std::string(1, ch));
    ASSERT_TRUE(id.has_value()) << int(ch);
    c.accept(*id);
  }
  ASSERT_EQ(c.state().phase, s.phase) << prefix;
  std::vector<uint8_t> mask(f.vocab->size());
  auto t0 = std::chrono::steady_clock::now();
  c.allowed_tokens(mask);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  expect_mask_equals(mask, ms, prefix, g.accepting(s), [&](std::string_view b) {
    ToolCallState t = s;
    return g.step_all(t, b);
  });
}

TEST(ToolCallConstraint, MasksEqualBruteForceAlongACall) {
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</parameter>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>";
  // States: start, partial tag, function name, parameter choice, number, enum, end, accepting.
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{24}, size_t{30}, size_t{38}, size_t{50}, size_t{52},
                   size_t{54}, size_t{73}, size_t{80}, size_t{100}, call.size()})
    expect_mask_matches_brute_force(false, call.substr(0, n));
}

TEST(ToolCallConstraint, MasksEqualBruteForceInFreeText) {
  const std::string open = "<tool_call>\n<function=search>\n<parameter=query>\n";
  for (const char* tail : {"", "some text", "x <", "x\n", "x\n</par", "a</", "<parameter"})
    expect_mask_matches_brute_force(false, open + tail);
  for (const char* thought : {"", "thinking", "thinking </th", "done\n</think>", "done</think>\n\n<tool"})
    expect_mask_matches_brute_force(true, thought);
  expect_mask_matches_brute_force(false, "", std::string("search"));
}

TEST(ToolCallConstraint, WholeTagTokensAreAllowed) {
  const Fixture& f = fixture();
  auto tc = f.tok.token_to_id("<tool_call>");
  ASSERT_TRUE(tc.has_value());
  ToolCallConstraint c(grammar(false), f.vocab, end_ids(f.tok));
  std::vector<uint8_t> mask(f.vocab->size());
  c.allowed_tokens(mask);
  EXPECT_TRUE(mask[static_cast<size_t>(*tc)]);
  EXPECT_FALSE(mask[static_cast<size_t>(end_ids(f.tok)[0])]);  // no EOS before a call
  auto think_end = f.tok.token_to_id("</think>");
  ASSERT_TRUE(think_end.has_value());
  EXPECT_FALSE(mask[static_cast<size_t>(*think_end)]);
  ToolCallConstraint thinking(grammar(true), f.vocab, end_ids(f.tok));
  thinking.allowed_tokens(mask);
  EXPECT_TRUE(mask[static_cast<size_t>(*think_end)]);
  EXPECT_FALSE(mask[static_cast<size_t>(*tc)]);
}

// Samples random logits (a stand-in for a random-weight model) under constraint c until an end
// token or max_steps: the tokens before the end, whether it ended, and the masks' time.
struct Sampled {
  std::vector<int32_t> out;
  bool ended = false;
};
Sampled sample_under(TokenConstraint& c, bool thinking, uint64_t seed, int max_steps, std::mt19937& rng,
                     double& total_ms, int& steps) {
  const Fixture& f = fixture();
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(f.vocab->size());
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  sp.eos_token_ids = end_ids(f.tok);
  if (thinking) sp.logit_bias = {{*f.tok.token_to_id("</think>"), 30.0f}};  // end the thought soon
  Sampled s;
  std::vector<uint8_t> mask(f.vocab->size());
  for (int i = 0; i < max_steps && !s.ended; ++i) {
    for (float& x : logits) x = normal(rng);
    auto t0 = std::chrono::steady_clock::now();
    c.allowed_tokens(mask);
    total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++steps;
    SampleResult r = sample_token(logits, sp, {}, s.out, mask);
    c.accept(r.token);
    s.ended = sp.is_stop_token(r.token);
    if (!s.ended) s.out.push_back(r.token);
  }
  return s;
}

// Random logits (a stand-in for a random-weight model) under the mask: the sampled output is
// always a complete call of the named function with schema-conforming arguments.
TEST(ToolCallConstraint, RandomLogitsUnderTheMaskGiveValidCalls) {
  const Fixture& f = fixture();
  std::mt19937 rng(11);
  double total_ms = 0;
  int steps = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const bool thinking = trial % 2 == 1;
    ToolCallConstraint c(grammar(thinking, std::string("get_weather")), f.vocab, end_ids(f.tok));
    auto [out, ended] = sample_under(c, thinking, static_cast<uint64_t>(trial), 200, rng, total_ms, steps);
    ASSERT_TRUE(ended) << "no EOS in 200 tokens: " << f.tok.decode(out);
    OutputParserOptions po;
    po.thinking_enabled = thinking;
    po.parse_tools = true;
    po.tool_schemas = ToolSchemas::from_openai_tools(OrderedJson::parse(kTools));
    const std::string text = f.tok.decode(out);
    ParsedOutput p = parse_output(text, po);
    ASSERT_EQ(p.tool_calls.size(), 1u) << text;
    EXPECT_EQ(p.tool_calls[0].name, "get_weather");
    auto args = OrderedJson::parse(p.tool_calls[0].arguments);
    ASSERT_TRUE(args.contains("city")) << text;
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome");
    if (args.contains("days")) EXPECT_TRUE(args["days"].is_number_integer()) << text;
  }
  std::printf("mean mask time over %d sampled steps: %.2f ms\n", steps, total_ms / steps);
}


// ---- structured outputs (runtime/structured_constraint.h) ---------------------------------------

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "tags":{"type":"array","items":{"enum":["a","bb","c d"]},"maxItems":3},
  "score":{"anyOf":[{"type":"number"},{"type":"null"}]},
  "ok":{"type":"boolean"}},"required":["name","ok"],"additionalProperties":false})";

std::shared_ptr<const JsonGrammar> schema_grammar(const char* schema) {
  auto g = compile_json_schema(OrderedJson::parse(schema));
  if (!g.ok()) ADD_FAILURE() << g.message();
  return *g;
}

// The mask after `prefix` (fed through single-byte tokens) against walking every token's bytes.
void expect_structured_mask(const std::shared_ptr<const JsonGrammar>& g, bool thinking, const std::string& prefix) {
  const Fixture& f = fixture();
  StructuredConstraint c(g, thinking, f.vocab, end_ids(f.tok));
  static const std::vector<int32_t> byte_token = [&] {  // the single-byte token of every byte
    std::vector<int32_t> t(256, -1);
    for (size_t id = 0; id < f.vocab->size(); ++id) {
      const auto b = f.vocab->bytes(static_cast<int32_t>(id));
      if (b.size() == 1 && !f.tok.is_special(static_cast<int32_t>(id)) && t[static_cast<uint8_t>(b[0])] < 0)
        t[static_cast<uint8_t>(b[0])] = static_cast<int32_t>(id);
    }
    return t;
  }();
  for (char ch : prefix) {
    const int32_t id = byte_token[static_cast<uint8_t>(ch)];
    ASSERT_GE(id, 0) << int(ch);
    c.accept(id);
  }
  ASSERT_FALSE(c.state().dead) << prefix;
  const StructuredConstraint::State s = c.state();
  std::vector<uint8_t> mask(f.vocab->size());
  auto t0 = std::chrono::steady_clock::now();
  c.allowed_tokens(mask);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  expect_mask_equals(mask, ms, prefix, c.accepting(s), [&](std::string_view b) {
    StructuredConstraint::State t = s;
    return c.step_text(t, b);
  });
}

TEST(StructuredConstraint, MasksEqualBruteForce) {
  auto g = schema_grammar(kSchema);
  const std::string doc = R"({"name": "Zoé", "age": 42, "tags": ["a", "c d"], "score": -1.5e3, "ok": true})";
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{9}, size_t{12}, size_t{13}, size_t{20}, size_t{25},
                   size_t{33}, size_t{38}, size_t{45}, size_t{60}, size_t{66}, doc.size() - 1, doc.size()})
    expect_structured_mask(g, false, doc.substr(0, n));
  for (const char* thought : {"", "hmm", "hmm </thi", "done</think>\n\n", "done</think>\n\n{\"na"})
    expect_structured_mask(g, true, thought);
  expect_structured_mask(json_object_grammar(), false, "{\"a\": [1, {\"b\": \"x");
  expect_structured_mask(json_object_grammar(), false, "{\"a\": 1, \"ke");  // a free key: the fast path
  auto re = regex_grammar("(yes|no) [0-9]{2}");
  ASSERT_TRUE(re.ok());
  expect_structured_mask(*re, false, "");
  expect_structured_mask(*re, false, "ye");
  expect_structured_mask(*re, false, "no 1");
}

// Random logits under the mask: every sampled output that ends is a document the grammar accepts
// (nlohmann parses it; the Python suite validates with jsonschema).
TEST(StructuredConstraint, RandomLogitsUnderTheMaskGiveValidJson) {
  const Fixture& f = fixture();
  auto g = schema_grammar(kSchema);
  std::mt19937 rng(5);
  double total_ms = 0;
  int steps = 0, finished = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const bool thinking = trial % 2 == 1;
    StructuredConstraint c(g, thinking, f.vocab, end_ids(f.tok));
    auto [out, ended] = sample_under(c, thinking, static_cast<uint64_t>(trial), 300, rng, total_ms, steps);
    ASSERT_TRUE(ended) << "no EOS in 300 tokens: " << f.tok.decode(out);
    ++finished;
    std::string text = f.tok.decode(out);
    if (thinking) text = text.substr(text.find("</think>") + 8);
    auto doc = OrderedJson::parse(text);
    EXPECT_TRUE(doc.contains("name") && doc.contains("ok")) << text;
    EXPECT_FALSE(c.state().dead);
  }
  EXPECT_EQ(finished, 4);
  std::printf("mean structured mask time over %d sampled steps: %.2f ms\n", steps, total_ms / steps);
}

}  // namespace
}  // namespace sparkserve
