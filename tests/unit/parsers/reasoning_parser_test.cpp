#include "text/reasoning_parser.h"

#include "parser_test_util.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

ReasoningOptions thinking(bool on) {
  ReasoningOptions o;
  o.thinking_enabled = on;
  return o;
}

TEST(ReasoningParserTest, ThinkEndSplits) {
  // Qwen3.5: `<think>\n` is in the prompt, the output starts inside the reasoning.
  ReasoningResult r = parse_reasoning("Let me think.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(r.reasoning, "Let me think.\n");
  EXPECT_EQ(r.content, "\n\nThe answer is 4.");  // vLLM keeps the text after </think> as is
}

TEST(ReasoningParserTest, GeneratedThinkIsStripped) {
  ReasoningResult r = parse_reasoning("<think>\nhmm\n</think>\n\nok");
  EXPECT_EQ(r.reasoning, "\nhmm\n");
  EXPECT_EQ(r.content, "\n\nok");
  // Only a leading one.
  r = parse_reasoning("a<think>b</think>c");
  EXPECT_EQ(r.reasoning, "a<think>b");
  EXPECT_EQ(r.content, "c");
}

TEST(ReasoningParserTest, EmptyPartsAreNull) {
  ReasoningResult r = parse_reasoning("</think>only content");
  EXPECT_FALSE(r.reasoning.has_value());
  EXPECT_EQ(r.content, "only content");
  r = parse_reasoning("only reasoning</think>");
  EXPECT_EQ(r.reasoning, "only reasoning");
  EXPECT_FALSE(r.content.has_value());
  r = parse_reasoning("");
  EXPECT_FALSE(r.reasoning.has_value());
  EXPECT_FALSE(r.content.has_value());
}

TEST(ReasoningParserTest, TruncatedMidThoughtIsAllReasoning) {
  ReasoningResult r = parse_reasoning("I was thinking about </thi");
  EXPECT_EQ(r.reasoning, "I was thinking about </thi");
  EXPECT_FALSE(r.content.has_value());
}

TEST(ReasoningParserTest, ThinkingDisabledIsAllContent) {
  ReasoningResult r = parse_reasoning("Hello </think> there", thinking(false));
  EXPECT_FALSE(r.reasoning.has_value());
  EXPECT_EQ(r.content, "Hello </think> there");
}

TEST(ReasoningParserTest, ToolCallEndsReasoning) {
  std::string call = "<tool_call>\n<function=f>\n</function>\n</tool_call>";
  ReasoningResult r = parse_reasoning("I need the weather.\n" + call);
  EXPECT_EQ(r.reasoning, "I need the weather.\n");
  EXPECT_EQ(r.content, call);
  // Even with a later </think>: the call must not be buried in the reasoning.
  r = parse_reasoning("plan\n" + call + "\n</think>\n\ndone");
  EXPECT_EQ(r.reasoning, "plan\n");
  EXPECT_EQ(r.content, call + "\n</think>\n\ndone");
  // Whitespace between the tags.
  r = parse_reasoning("x<tool_call> \n\t<function=f>");
  EXPECT_EQ(r.reasoning, "x");
  EXPECT_EQ(r.content, "<tool_call> \n\t<function=f>");
}

TEST(ReasoningParserTest, ToolCallMentionIsNotAnEnd) {
  // A <tool_call> not followed by <function= is reasoning text.
  ReasoningResult r = parse_reasoning("I could use <tool_call> tags. <tool_call>x</think>answer");
  EXPECT_EQ(r.reasoning, "I could use <tool_call> tags. <tool_call>x");
  EXPECT_EQ(r.content, "answer");
  r = parse_reasoning("ends with <tool_call>\n<func");
  EXPECT_EQ(r.reasoning, "ends with <tool_call>\n<func");
  EXPECT_FALSE(r.content.has_value());
}

TEST(ReasoningParserTest, ImplicitEndCanBeDisabled) {
  ReasoningOptions o;
  o.tool_call_ends_reasoning = false;
  ReasoningResult r = parse_reasoning("a<tool_call><function=f></function></tool_call></think>b", o);
  EXPECT_EQ(r.reasoning, "a<tool_call><function=f></function></tool_call>");
  EXPECT_EQ(r.content, "b");
}

std::vector<std::string> reasoning_corpus() {
  return {
      "",
      "<think>",
      "<think>\n",
      "<thin",
      "<thinking about it",
      "Simple reasoning\n</think>\n\nAnswer ✓ 日本語",
      "<think>\nreasoning with </thin partial and </think>content with </think> again",
      "no end at all, truncated mid-thought <tool_c",
      "tool in thought <tool_call>\n<function=get>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call> rest",
      "mention <tool_call> then </think> content <tool_call>\n<function=x>",
      "<tool_call>   \n\n  <function=at_start>",
      "<tool_call>   \n\n  <functio",
      "<tool_call><tool_call><function=double>",
      "</think></think>",
      "<<//think>></think>>",
      "<think><think></think>",
  };
}

TEST(ReasoningStreamingTest, EverySplitEqualsOneShot) {
  for (bool on : {true, false}) {
    for (bool tool_ends : {true, false}) {
      ReasoningOptions o = thinking(on);
      o.tool_call_ends_reasoning = tool_ends;
      for (const auto& text : reasoning_corpus()) {
        ReasoningResult one = parse_reasoning(text, o);
        for (const auto& plan : testing::split_plans(text, 100, 11)) {
          StreamingReasoningParser p(o);
          std::string reasoning, content;
          for (const auto& piece : plan) {
            ReasoningDelta d = p.feed(piece);
            reasoning += d.reasoning;
            content += d.content;
          }
          ReasoningDelta d = p.finish();
          reasoning += d.reasoning;
          content += d.content;
          ASSERT_EQ(reasoning, one.reasoning.value_or("")) << text << " | first piece: " << plan[0];
          ASSERT_EQ(content, one.content.value_or("")) << text << " | first piece: " << plan[0];
        }
      }
    }
  }
}

TEST(ReasoningStreamingTest, HoldsPartialTagsOnly) {
  StreamingReasoningParser p;
  EXPECT_EQ(p.feed("<thi").reasoning, "");  // could be <think>
  EXPECT_EQ(p.feed("nk>abc</thi").reasoning, "abc");
  ReasoningDelta d = p.feed("nk>\n\nHi");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "\n\nHi");
  EXPECT_FALSE(p.in_reasoning());
}

TEST(ReasoningStreamingTest, ToolCallHeldUntilConfirmed) {
  StreamingReasoningParser p;
  EXPECT_EQ(p.feed("think <tool_call>\n").reasoning, "think ");
  ReasoningDelta d = p.feed("<function=f>");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "<tool_call>\n<function=f>");
  StreamingReasoningParser q;
  q.feed("think <tool_call>");
  d = q.feed(" not a call");
  EXPECT_EQ(d.reasoning, "<tool_call> not a call");
}

}  // namespace
}  // namespace sparkserve
