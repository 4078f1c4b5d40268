// Splits Qwen3.5 output into reasoning and content (vLLM's current `qwen3` reasoning parser,
// reference notes serving-api.md §4.2), one-shot and incrementally:
//  - The template puts `<think>\n` in the prompt, so the output normally starts inside the
//    reasoning; a generated leading `<think>` is stripped.
//  - Reasoning ends at the first `</think>` (dropped; the text after it is content), or
//    implicitly at a `<tool_call>` followed (after optional whitespace) by `<function=`: the
//    content starts at that `<tool_call>`, so a tool call emitted inside the thinking block
//    still reaches the tool parser. This holds even when a `</think>` comes later (vLLM's
//    one-shot parser would bury such a call in the reasoning).
//  - With thinking disabled (the prompt already closed the think block) everything is content.
//  - No end at all (max_tokens hit mid-thought): everything is reasoning.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sparkserve {

struct ReasoningOptions {
  bool thinking_enabled = true;          // false: chat_template_kwargs.enable_thinking == false
  bool tool_call_ends_reasoning = true;  // `<tool_call>` + `<function=` ends reasoning
};

struct ReasoningResult {
  std::optional<std::string> reasoning;  // nullopt when empty
  std::optional<std::string> content;    // nullopt when empty
};

ReasoningResult parse_reasoning(std::string_view text, const ReasoningOptions& options = {});

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// Incremental form: feed text pieces of any size (tags may be split anywhere). Text that could
// still be part of a tag (`<thi`, `</thin`, `<tool_c`, or `<tool_call>` plus whitespace not yet
// followed by a decision) is held back until disambiguated or finish(). Over any split, the
// concatenated deltas equal parse_reasoning's result.
class StreamingReasoningParser {
 public:
  explicit StreamingReasoningParser(ReasoningOptions options = {});
  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();
  bool in_reasoning() const { return state_ != State::kContent; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void process(bool at_end, ReasoningDelta& out);

  ReasoningOptions options_;
  State state_;
  std::string buf_;  // held text not yet emitted
  bool finished_ = false;
};

}  // namespace sparkserve
