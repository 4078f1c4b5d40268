// The tool-call automaton (tool_choice required / named): strings it must accept and reject,
// and a random walk whose every accepted output the real tool parser turns into calls that
// satisfy the schema.
#include "text/tool_call_grammar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "text/output_parser.h"
#include "text/tool_parser.h"

namespace sparkserve {
namespace {

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string","enum":["Paris","Rome"]},"days":{"type":"integer"}},"required":["city"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
     "query":{"type":"string"},"limit":{"type":"number"},"exact":{"type":"boolean"}}}}},
  {"type":"function","function":{"name":"ping"}}
])";

OrderedJson tools() { return OrderedJson::parse(kTools); }

ToolCallGrammar grammar(bool thinking = false, std::optional<std::string> only = std::nullopt, bool parallel = true) {
  ToolCallGrammarOptions o;
  o.thinking = thinking;
  o.only_function = std::move(only);
  o.parallel_tool_calls = parallel;
  auto g = ToolCallGrammar::build(tools(), o);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::move(g).value();
}

// Accepted: every byte stays in the language; complete: and EOS may follow.
struct Outcome {
  bool accepted;
  bool complete;
};
Outcome run(const ToolCallGrammar& g, std::string_view text) {
  ToolCallState s = g.initial();
  for (char c : text)
    if (!g.step(s, static_cast<uint8_t>(c))) return {false, false};
  return {true, g.accepting(s)};
}

const std::string kWeatherParis =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>";
const std::string kPing = "<tool_call>\n<function=ping>\n</function>\n</tool_call>";

TEST(ToolCallGrammar, AcceptsTemplateFormCalls) {
  auto g = grammar();
  EXPECT_TRUE(run(g, kWeatherParis).complete);
  EXPECT_TRUE(run(g, kPing).complete);
  EXPECT_TRUE(run(g, "\n\n" + kPing).complete);
  EXPECT_TRUE(run(g, kWeatherParis + "\n" + kPing).complete);       // the template's separator
  EXPECT_TRUE(run(g, kPing + "\n\n" + kPing + kPing).complete);
  // Any order of parameters; optional ones may be left out.
  EXPECT_TRUE(run(g, "<tool_call>\n<function=get_weather>\n<parameter=days>\n-12\n</parameter>\n<parameter=city>\n"
                     "Rome\n</parameter>\n</function>\n</tool_call>").complete);
  EXPECT_TRUE(run(g, "<tool_call>\n<function=search>\n<parameter=query>\nfree <b>text</b> with \"quotes\" & "
                     "\xe2\x82\xac\n\n</parameter>\n<parameter=exact>\nfalse\n</parameter>\n<parameter=limit>\n"
                     "-0.25e+30\n</parameter>\n</function>\n</tool_call>").complete);
  EXPECT_TRUE(run(g, "<tool_call>\n<function=search>\n<parameter=query>\n\n</parameter>\n</function>\n</tool_call>")
                  .complete);  // empty text value
}

TEST(ToolCallGrammar, PrefixesAreAcceptedButNotComplete) {
  auto g = grammar();
  for (size_t n = 0; n < kWeatherParis.size(); ++n) {
    Outcome r = run(g, kWeatherParis.substr(0, n));
    EXPECT_TRUE(r.accepted) << n;
    EXPECT_FALSE(r.complete) << n;
  }
  EXPECT_FALSE(run(g, kPing + "\n").complete);  // EOS only right after </tool_call>
  EXPECT_TRUE(run(g, kPing + "\n").accepted);
}

TEST(ToolCallGrammar, RejectsWhatIsNotACallOfAnOfferedFunction) {
  auto g = grammar();
  const char* bad[] = {
      "Hello",                                                    // content instead of a call
      "\n\n\n<tool_call>",                                        // more than two newlines
      " <tool_call>",                                             // other whitespace
      "<tool_call><function=ping>",                               // not the template's layout
      "<tool_call>\n<function=unknown>",                          // not offered
      "<tool_call>\n<function=pin>\n",                            // prefix of a name only
      "<tool_call>\n<function=get_weather>\n</function>",         // required "city" missing
      "<tool_call>\n<function=get_weather>\n<parameter=town>",    // not a property
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nLondon",  // not in the enum
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=city>",  // twice
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n03",      // leading zero
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n1.5",     // not an integer
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n\n",      // empty integer
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n1234567890123456789",  // 19 digits
      "<tool_call>\n<function=search>\n<parameter=limit>\n1.\n",        // no fraction digits
      "<tool_call>\n<function=search>\n<parameter=limit>\n1e\n",
      "<tool_call>\n<function=search>\n<parameter=limit>\n1e999",     // would overflow to inf
      "<tool_call>\n<function=search>\n<parameter=exact>\nyes",
      "<tool_call>\n<function=search>\n<parameter=query>\nx</parameter>",        // no newline before it
      "<tool_call>\n<function=search>\n<parameter=query>\nx<parameter=",        // would split the value
      "<tool_call>\n<function=search>\n<parameter=query>\nx</function>",
      "<tool_call>\n<function=search>\n<parameter=query>\nx</tool_call>",
      "<tool_call>\n<function=search>\n<parameter=query>\nx<tool_call>",
      "<tool_call>\n<function=search>\n<parameter=query>\nx<function=",
      "<tool_call>\n<function=ping>\n</function>\n</tool_call>x",
      "</think>",                                                 // thinking is off
  };
  for (const char* t : bad) EXPECT_FALSE(run(g, t).accepted) << t;
}

TEST(ToolCallGrammar, NamedFunctionAndSingleCall) {
  auto named = grammar(false, "search");
  EXPECT_FALSE(run(named, "<tool_call>\n<function=ping").accepted);
  const std::string search = "<tool_call>\n<function=search>\n</function>\n</tool_call>";
  EXPECT_TRUE(run(named, search).complete);
  EXPECT_FALSE(run(named, search + "\n").accepted);  // exactly one call
  auto single = grammar(false, std::nullopt, /*parallel=*/false);
  EXPECT_TRUE(run(single, kPing).complete);
  EXPECT_FALSE(run(single, kPing + "\n").accepted);
  EXPECT_FALSE(run(single, kPing + kPing).accepted);
}

TEST(ToolCallGrammar, ThinkingComesFirstAndEndsAtThinkClose) {
  auto g = grammar(true);
  EXPECT_TRUE(run(g, "any thought <b> \n </thin k>").accepted);
  EXPECT_FALSE(run(g, "any thought").complete);
  EXPECT_FALSE(run(g, kPing).accepted);  // inside the reasoning a call is refused
  EXPECT_FALSE(run(g, "thought<tool_call>").accepted);
  EXPECT_TRUE(run(g, "thought\n</think>\n\n" + kPing).complete);
  EXPECT_TRUE(run(g, "</think>" + kPing).complete);
  EXPECT_FALSE(run(g, "</think>\n\nok").accepted);
}

TEST(ToolCallGrammar, BuildErrorsNameTheProblem) {
  ToolCallGrammarOptions o;
  o.only_function = "nope";
  auto e = ToolCallGrammar::build(tools(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("\"nope\" is not among the tools"), std::string::npos) << e.message();
  auto spaced = ToolCallGrammar::build(
      OrderedJson::parse(R"([{"type":"function","function":{"name":"two words"}}])"), {});
  ASSERT_FALSE(spaced.ok());
  EXPECT_NE(spaced.message().find("two words"), std::string::npos);
  auto req = ToolCallGrammar::build(OrderedJson::parse(R"([{"type":"function","function":{"name":"f","parameters":
      {"type":"object","properties":{"a":{}},"required":["b"]}}}])"), {});
  ASSERT_FALSE(req.ok());
  EXPECT_NE(req.message().find("requires \"b\""), std::string::npos) << req.message();
  EXPECT_FALSE(ToolCallGrammar::build(OrderedJson::array(), {}).ok());
}

// Random walks through the language (bytes chosen among those the automaton allows, text values
// cut short with their terminator) give outputs that the tool parser reads back as calls of
// offered functions with schema-conforming arguments.
TEST(ToolCallGrammar, RandomAcceptedOutputsParseIntoValidCalls) {
  std::mt19937 rng(7);
  int complete = 0, calls = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool thinking = trial % 2 == 1;
    std::optional<std::string> only;
    if (trial % 5 == 0) only = "get_weather";
    auto g = grammar(thinking, only, trial % 3 != 0);
    ToolCallState s = g.initial();
    std::string out;
    for (int steps = 0; steps < 4000 && s.phase != ToolCallState::Phase::kDone; ++steps) {
      if (g.accepting(s) && rng() % 3 == 0) break;  // EOS
      if ((s.phase == ToolCallState::Phase::kText && rng() % 8 == 0) ||
          (s.phase == ToolCallState::Phase::kReasoning && rng() % 8 == 0)) {
        const std::string end = s.phase == ToolCallState::Phase::kText ? "\n</parameter>" : "</think>";
        ASSERT_TRUE(g.step_all(s, end)) << out;
        out += end;
        continue;
      }
      // ASCII only (plus a whole "é" now and then): the server's parser sees valid UTF-8, the
      // detokenizer replaces anything else.
      if (s.phase == ToolCallState::Phase::kText && rng() % 10 == 0) {
        ASSERT_TRUE(g.step_all(s, "\xc3\xa9"));
        out += "\xc3\xa9";
        continue;
      }
      std::vector<uint8_t> ok;
      for (int b = 0; b < 128; ++b) {
        ToolCallState t = s;
        if (g.step(t, static_cast<uint8_t>(b))) ok.push_back(static_cast<uint8_t>(b));
      }
      ASSERT_FALSE(ok.empty()) << "dead end after: " << out;
      // Favour the structural bytes so that walks finish: the last allowed bytes of a literal.
      uint8_t b = ok[rng() % ok.size()];
      if (ok.size() > 20 && rng() % 2 == 0) b = static_cast<uint8_t>("abc <>/\n=x"[rng() % 11]);
      if (!g.step(s, b)) continue;
      out.push_back(static_cast<char>(b));
    }
    if (!g.accepting(s)) continue;  // walk cut at its step limit
    ++complete;
    calls += static_cast<int>(s.calls);
    OutputParserOptions po;
    po.thinking_enabled = thinking;
    po.parse_tools = true;
    po.tool_schemas = ToolSchemas::from_openai_tools(tools());
    ParsedOutput parsed = parse_output(out, po);
    ASSERT_EQ(parsed.tool_calls.size(), s.calls) << out;
    // Content is at most the newlines before the first <tool_call> (kept, as vLLM does).
    EXPECT_EQ(parsed.content.value_or("").find_first_not_of('\n'), std::string::npos) << out;
    for (const ToolCall& c : parsed.tool_calls) {
      if (only) EXPECT_EQ(c.name, *only);
      auto args = OrderedJson::parse(c.arguments);
      if (c.name == "get_weather") {
        ASSERT_TRUE(args.contains("city")) << out;
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << out;
        if (args.contains("days")) EXPECT_TRUE(args["days"].is_number_integer()) << out;
      } else if (c.name == "search") {
        if (args.contains("limit")) EXPECT_TRUE(args["limit"].is_number()) << out;
        if (args.contains("exact")) EXPECT_TRUE(args["exact"].is_boolean()) << out;
        if (args.contains("query")) EXPECT_TRUE(args["query"].is_string() || args["query"].is_null()) << out;
      } else {
        EXPECT_EQ(c.name, "ping");
        EXPECT_TRUE(args.empty()) << out;
      }
    }
  }
  EXPECT_GT(complete, 200) << "too few walks reached the end to test anything";
  std::printf("%d of 300 walks complete, %d calls\n", complete, calls);
}

}  // namespace
}  // namespace sparkserve
