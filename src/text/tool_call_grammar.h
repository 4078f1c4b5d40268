// The output that tool_choice "required" or a named function allows, as a byte-level automaton
// that constrained decoding walks alongside the model (runtime/tool_call_constraint.h). The
// language is the qwen3_coder XML the Qwen3.5 chat template writes for assistant tool calls:
//
//   [REASONING </think>] \n{0,2} CALL (\n{0,2} CALL)* EOS
//   CALL  = <tool_call>\n<function=NAME>\n PARAM* </function>\n</tool_call>
//   PARAM = <parameter=P>\n VALUE \n</parameter>\n
//
//  - REASONING (thinking enabled: the prompt ends inside `<think>`) is free text up to the first
//    `</think>`; it may not contain `<tool_call>` (the reasoning parser would end the reasoning
//    there, outside the constraint).
//  - NAME is one of the offered functions (named tool_choice: only that one). P is a property of
//    that function's `parameters.properties`, each at most once, in any order; `</function>` is
//    allowed only when every name in `parameters.required` was written.
//  - VALUE follows the property's schema as far as the tool parser converts it
//    (convert_tool_param_value): `enum` -> one of its values; integer -> -?(0|[1-9][0-9]{0,17});
//    number -> JSON number (at most 18 integer, 18 fraction and 2 exponent digits: always finite); boolean ->
//    true|false; null -> null; anything else -> free text that contains none of `</parameter>`,
//    `<parameter=`, `</function>`, `<function=`, `<tool_call>`, `</tool_call>` (each would change
//    how the parser splits the call).
//  - At most one CALL for a named function or parallel_tool_calls=false; otherwise one or more.
//  - EOS is allowed only right after `</tool_call>` (no trailing newlines).
// Bytes, not characters: token texts may end inside a UTF-8 sequence; free text takes any byte.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/py_json.h"

namespace sparkserve {

struct ToolCallGrammarOptions {
  bool thinking = true;                      // the output starts inside the reasoning block
  std::optional<std::string> only_function;  // named tool_choice
  bool parallel_tool_calls = true;           // false: exactly one call
};

enum class ToolValueKind : uint8_t { kText, kInteger, kNumber, kLiterals };

struct ToolParamSpec {
  std::string name;
  ToolValueKind kind = ToolValueKind::kText;
  std::vector<std::string> literals;  // kLiterals: the allowed values as written
};

struct ToolFunctionSpec {
  std::string name;
  std::vector<ToolParamSpec> params;
  uint64_t required_mask = 0;  // bit i: params[i] is required
};

// Where the automaton is. Copyable and small: the mask computation copies it per token.
struct ToolCallState {
  enum class Phase : uint8_t { kReasoning, kGap, kLiteral, kText, kNumber, kDone, kDead };
  enum class Literal : uint8_t { kOpen, kFunctionName, kParamOrEnd, kValue, kParamClose, kNewline };
  Phase phase = Phase::kGap;
  Literal literal = Literal::kOpen;
  uint8_t newlines = 0;   // kGap: newlines since the last call (or </think>)
  uint8_t number = 0;     // kNumber: position in the number grammar
  uint8_t digits = 0;     // kNumber: digits in the current digit run
  int16_t function = -1;  // index into functions()
  int16_t param = -1;     // index into functions()[function].params
  uint32_t calls = 0;     // complete calls so far
  uint64_t seen = 0;      // params written in the open call
  std::string buf;        // kLiteral: the matched prefix; kReasoning/kText: the pattern tail
};

class ToolCallGrammar {
 public:
  // tools: the request's validated OpenAI tools array. Errors name what cannot be constrained:
  // an unknown only_function, a function or parameter name containing '>' or a newline, more
  // than 64 properties in one function.
  static Expected<ToolCallGrammar> build(const OrderedJson& tools, const ToolCallGrammarOptions& options);

  ToolCallState initial() const;
  // Advances by one byte; false (state unchanged) when the byte leaves the language.
  bool step(ToolCallState& s, uint8_t byte) const;
  // Advances by every byte of `text`; false when one of them leaves the language.
  bool step_all(ToolCallState& s, std::string_view text) const;
  // EOS may come now.
  bool accepting(const ToolCallState& s) const;
  // Inside free text with no partial tag: any bytes without '<' and '\n' are accepted and keep
  // the state as it is (the mask computation's fast path).
  static bool free_idle(const ToolCallState& s) {
    return (s.phase == ToolCallState::Phase::kReasoning || s.phase == ToolCallState::Phase::kText) && s.buf.empty();
  }

  const std::vector<ToolFunctionSpec>& functions() const { return functions_; }

 private:
  bool step_literal(ToolCallState& s, uint8_t byte) const;
  bool step_tail(ToolCallState& s, uint8_t byte) const;
  bool step_number(ToolCallState& s, uint8_t byte) const;
  // The alternatives of s.literal in state s (computed on the fly from the open call).
  // Each option: its text and what completing it means (a function, a param, -1 = </function>,
  // a value literal's index).
  struct Option {
    std::string text;
    int tag;
  };
  void literal_options(const ToolCallState& s, std::vector<Option>& out) const;
  void complete_literal(ToolCallState& s, int tag) const;
  void after_call(ToolCallState& s) const;
  void enter_value(ToolCallState& s) const;

  std::vector<ToolFunctionSpec> functions_;
  std::vector<int16_t> allowed_functions_;  // indices NAME may take
  bool thinking_ = true;
  bool single_call_ = false;
};

}  // namespace sparkserve
