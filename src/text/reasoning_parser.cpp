#include "text/reasoning_parser.h"

#include <algorithm>

namespace sparkserve {
namespace {

constexpr std::string_view kThink = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kFunction = "<function=";
constexpr size_t npos = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

size_t partial_tag_overlap(std::string_view s, std::string_view tag) {
  size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t len = max; len > 0; --len)
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  return 0;
}

std::optional<std::string> non_empty(std::string_view s) {
  if (s.empty()) return std::nullopt;
  return std::string(s);
}

enum class ToolStart { kYes, kNo, kUndecided };

// Whether the `<tool_call>` at `at` is followed (after whitespace) by `<function=`. Undecided
// when the text ends before that is known (only possible while streaming).
ToolStart classify_tool_call(std::string_view s, size_t at, bool at_end) {
  size_t i = at + kToolCall.size();
  while (i < s.size() && is_space(s[i])) ++i;
  std::string_view rest = s.substr(i);
  if (rest.substr(0, kFunction.size()) == kFunction) return ToolStart::kYes;
  if (!at_end && rest.size() < kFunction.size() && kFunction.substr(0, rest.size()) == rest)
    return ToolStart::kUndecided;
  return ToolStart::kNo;
}

// Where reasoning ends in s (searching from `from`): {position, is_think_end}; npos if nowhere.
// `undecided` receives the first `<tool_call>` whose meaning is not known yet.
struct EndSearch {
  size_t end = npos;
  bool think_end = false;
  size_t undecided = npos;
};

EndSearch find_reasoning_end(std::string_view s, size_t from, bool tool_ends, bool at_end) {
  EndSearch r;
  size_t e = s.find(kThinkEnd, from);
  if (tool_ends) {
    size_t j = s.find(kToolCall, from);
    while (j != npos && (e == npos || j < e)) {
      ToolStart k = classify_tool_call(s, j, at_end);
      if (k == ToolStart::kYes) {
        r.end = j;
        return r;
      }
      if (k == ToolStart::kUndecided) {
        r.undecided = j;
        return r;
      }
      j = s.find(kToolCall, j + 1);
    }
  }
  if (e != npos) {
    r.end = e;
    r.think_end = true;
  }
  return r;
}

}  // namespace

ReasoningResult parse_reasoning(std::string_view text, const ReasoningOptions& options) {
  ReasoningResult r;
  if (!options.thinking_enabled) {
    r.content = non_empty(text);
    return r;
  }
  if (text.substr(0, kThink.size()) == kThink) text.remove_prefix(kThink.size());
  EndSearch end = find_reasoning_end(text, 0, options.tool_call_ends_reasoning, /*at_end=*/true);
  if (end.end == npos) {
    r.reasoning = non_empty(text);
    return r;
  }
  r.reasoning = non_empty(text.substr(0, end.end));
  r.content = non_empty(text.substr(end.end + (end.think_end ? kThinkEnd.size() : 0)));
  return r;
}

StreamingReasoningParser::StreamingReasoningParser(ReasoningOptions options)
    : options_(options), state_(options.thinking_enabled ? State::kStart : State::kContent) {}

ReasoningDelta StreamingReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  if (finished_) return out;
  buf_.append(text);
  process(false, out);
  return out;
}

ReasoningDelta StreamingReasoningParser::finish() {
  ReasoningDelta out;
  if (finished_) return out;
  process(true, out);
  finished_ = true;
  return out;
}

void StreamingReasoningParser::process(bool at_end, ReasoningDelta& out) {
  if (state_ == State::kStart) {
    std::string_view s = buf_;
    if (s.size() < kThink.size() && kThink.substr(0, s.size()) == s && !at_end) return;
    if (s.substr(0, kThink.size()) == kThink) buf_.erase(0, kThink.size());
    state_ = State::kReasoning;
  }
  if (state_ == State::kReasoning) {
    std::string_view s = buf_;
    EndSearch end = find_reasoning_end(s, 0, options_.tool_call_ends_reasoning, at_end);
    if (end.end != npos) {
      out.reasoning.append(s.substr(0, end.end));
      buf_.erase(0, end.end + (end.think_end ? kThinkEnd.size() : 0));
      state_ = State::kContent;
    } else {
      size_t hold = 0;
      if (end.undecided != npos) {
        hold = s.size() - end.undecided;
      } else if (!at_end) {
        hold = partial_tag_overlap(s, kThinkEnd);
        if (options_.tool_call_ends_reasoning) hold = std::max(hold, partial_tag_overlap(s, kToolCall));
      }
      out.reasoning.append(s.substr(0, s.size() - hold));
      buf_.erase(0, s.size() - hold);
      return;
    }
  }
  // Content: everything passes through.
  out.content.append(buf_);
  buf_.clear();
}

}  // namespace sparkserve
