#include "text/output_parser.h"

#include "parser_test_util.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

using testing::Assembled;
using testing::counter_ids;

OutputParserOptions options(bool thinking, bool tools) {
  OutputParserOptions o;
  o.thinking_enabled = thinking;
  o.parse_tools = tools;
  o.tool_schemas = ToolSchemas::from_openai_tools(OrderedJson::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"}}}}}])"));
  o.tool_call_ids = counter_ids();
  return o;
}

const std::string kCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>";

TEST(OutputParserTest, ReasoningThenToolCall) {
  ParsedOutput r = parse_output("I should check.\n</think>\n\nChecking.\n\n" + kCall, options(true, true));
  EXPECT_EQ(r.reasoning, "I should check.\n");
  EXPECT_EQ(r.content, "\n\nChecking.\n\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(r.finish_reason("stop"), "tool_calls");
}

TEST(OutputParserTest, ToolCallInsideReasoningIsStillACall) {
  // The users' top complaint with other engines: the call is emitted before </think>.
  ParsedOutput r = parse_output("Need weather data.\n" + kCall, options(true, true));
  EXPECT_EQ(r.reasoning, "Need weather data.\n");
  EXPECT_FALSE(r.content.has_value());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  // ... and with a stray </think> after it.
  r = parse_output("Need weather data.\n" + kCall + "\n</think>\n\n", options(true, true));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.reasoning, "Need weather data.\n");
}

TEST(OutputParserTest, ThinkingDisabled) {
  ParsedOutput r = parse_output("Sure.\n\n" + kCall, options(false, true));
  EXPECT_FALSE(r.reasoning.has_value());
  EXPECT_EQ(r.content, "Sure.\n\n");
  EXPECT_EQ(r.tool_calls.size(), 1u);
}

TEST(OutputParserTest, ToolsNotParsedWhenToolChoiceNone) {
  ParsedOutput r = parse_output("x</think>" + kCall, options(true, false));
  EXPECT_EQ(r.content, kCall);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.finish_reason("stop"), "stop");
}

TEST(OutputParserTest, MaxTokensInsideReasoning) {
  ParsedOutput r = parse_output("still thinking about the </th", options(true, true));
  EXPECT_EQ(r.reasoning, "still thinking about the </th");
  EXPECT_FALSE(r.content.has_value());
  EXPECT_EQ(r.finish_reason("length"), "length");
}

TEST(OutputParserTest, MaxTokensInsideToolCall) {
  ParsedOutput r = parse_output("r</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", options(true, true));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Par"})");
  EXPECT_EQ(r.content, "\n\n");
}

std::vector<std::string> output_corpus() {
  return {
      "",
      "Plain thinking, cut off",
      "<think>\nA\n</think>\n\nB",
      "I should check.\n</think>\n\nChecking.\n\n" + kCall,
      "Need weather data.\n" + kCall,
      "Need weather data.\n" + kCall + "\n" + kCall + "\n</think>\n\ntext",
      "think <tool_call> mention</think>\n\n" + kCall + " trailing",
      "r</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
      "r</think>answer with <tool_c partial and <function",
      "<think><tool_call>\n\n<function=get_weather><parameter=days>x</parameter>",
      "日本語の推論</think>答え🙂<tool_call><function=get_weather></function></tool_call>",
  };
}

TEST(OutputStreamingTest, EverySplitEqualsOneShot) {
  for (bool thinking : {true, false}) {
    for (bool tools : {true, false}) {
      for (const auto& text : output_corpus()) {
        ParsedOutput one = parse_output(text, options(thinking, tools));
        for (const auto& plan : testing::split_plans(text, 60, 5)) {
          StreamingOutputParser p(options(thinking, tools));
          Assembled got;
          for (const auto& piece : plan) got.add(p.feed(piece));
          got.add(p.finish());
          std::string where = text + " | thinking=" + std::to_string(thinking) + " tools=" + std::to_string(tools);
          ASSERT_EQ(got.reasoning, one.reasoning.value_or("")) << where;
          ASSERT_EQ(got.content, one.content.value_or("")) << where;
          ASSERT_EQ(got.calls.size(), one.tool_calls.size()) << where;
          for (size_t i = 0; i < got.calls.size(); ++i) {
            EXPECT_EQ(got.calls[i].id, one.tool_calls[i].id);
            EXPECT_EQ(got.calls[i].name, one.tool_calls[i].name);
            ASSERT_EQ(got.calls[i].arguments, one.tool_calls[i].arguments) << where;
          }
          const ParsedOutput& res = p.result();
          EXPECT_EQ(res.reasoning, one.reasoning);
          EXPECT_EQ(res.content, one.content);
          ASSERT_EQ(res.tool_calls.size(), one.tool_calls.size());
          for (size_t i = 0; i < res.tool_calls.size(); ++i)
            EXPECT_EQ(res.tool_calls[i].arguments, one.tool_calls[i].arguments);
        }
      }
    }
  }
}

TEST(OutputStreamingTest, DeltasAreOpenAiShaped) {
  StreamingOutputParser p(options(true, true));
  OutputDelta d = p.feed("Hmm.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n");
  EXPECT_EQ(d.reasoning, "Hmm.\n");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 2u);  // header, then the first argument fragment
  EXPECT_EQ(d.tool_calls[0].to_openai().dump(),
            R"({"index":0,"id":"call_000000000000000000000000","type":"function","function":{"name":"get_weather","arguments":""}})");
  EXPECT_EQ(d.tool_calls[1].to_openai().dump(), R"({"index":0,"function":{"arguments":"{\"city\": \"Paris\""}})");
  d = p.finish();
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "}");
  EXPECT_EQ(p.result().finish_reason("length"), "tool_calls");
}

TEST(OutputStreamingTest, MalformedInputNeverBreaksInvariants) {
  // Random soup of tag fragments: no crash, and streaming equals one-shot.
  const char* atoms[] = {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
                         "<think>", "</think>", ">", "<", "\n", " ", "get_weather", "city", "days", "7", "x", "é",
                         "{", "}", "'", "\"", "null", "True"};
  std::mt19937 rng(42);
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    int n = static_cast<int>(rng() % 25);
    for (int i = 0; i < n; ++i) text += atoms[rng() % (sizeof atoms / sizeof atoms[0])];
    for (bool thinking : {true, false}) {
      ParsedOutput one = parse_output(text, options(thinking, true));
      for (const auto& plan : testing::split_plans(text, 5, static_cast<uint32_t>(trial))) {
        StreamingOutputParser p(options(thinking, true));
        Assembled got;
        for (const auto& piece : plan) got.add(p.feed(piece));
        got.add(p.finish());
        ASSERT_EQ(got.reasoning, one.reasoning.value_or("")) << text;
        ASSERT_EQ(got.content, one.content.value_or("")) << text;
        ASSERT_EQ(got.calls.size(), one.tool_calls.size()) << text;
        for (size_t i = 0; i < got.calls.size(); ++i) {
          ASSERT_EQ(got.calls[i].arguments, one.tool_calls[i].arguments) << text;
          ASSERT_TRUE(OrderedJson::accept(got.calls[i].arguments)) << text;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparkserve
