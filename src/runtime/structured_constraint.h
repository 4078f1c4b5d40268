// Structured outputs (response_format json_schema / json_object, structured_outputs json /
// choice / regex) as a token constraint: the output must be in the grammar's language
// (text/json_grammar.h), and may end (EOS / stop ids) only where the grammar accepts.
//
// With thinking on (the prompt ends inside `<think>`), the output first is free reasoning up to
// the first `</think>` (which may not be preceded by `<tool_call>`: the reasoning parser would
// end the reasoning there); the constraint starts right after it, so the structured text lands
// in `content`, never in the reasoning.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/token_constraint.h"
#include "text/json_grammar.h"

namespace sparkserve {

class StructuredConstraint : public TokenConstraint {
 public:
  StructuredConstraint(std::shared_ptr<const JsonGrammar> grammar, bool thinking,
                       std::shared_ptr<const VocabTexts> vocab, std::vector<int32_t> end_ids);
  void allowed_tokens(std::span<uint8_t> allowed) override;
  void accept(int32_t token) override;

  // Where the output is: reasoning (with the text that may start a tag), or the structured
  // part; dead after a token the constraint did not allow.
  struct State {
    bool reasoning = false;
    bool dead = false;
    std::string tail;  // reasoning: the longest suffix that starts `</think>` or `<tool_call>`
    JsonMatchState json;
  };
  const State& state() const { return state_; }
  // Advances by the bytes of `text`; false (state unchanged) when they leave the language.
  bool step_text(State& s, std::string_view text) const;
  bool accepting(const State& s) const { return !s.reasoning && !s.dead && matcher_.accepting(s.json); }

 private:
  bool step(State& s, uint8_t b) const;
  // Whether the bytes of token `id` from `from` on keep s alive (reasoning shortcut included).
  bool walk(State s, int32_t id) const;
  void walk_trie(uint32_t node, const State& s, std::span<uint8_t> allowed, bool& any) const;

  JsonMatcher matcher_;
  std::shared_ptr<const VocabTexts> vocab_;
  std::vector<int32_t> end_ids_;
  State state_;
  bool ended_ = false;
};

}  // namespace sparkserve
