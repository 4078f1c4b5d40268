// Constrained decoding: which vocabulary tokens a request may sample next. The engine asks the
// request's constraint for a mask before each sampled token (sampler: applied after the raw
// logprobs are read, before logit_bias) and reports the token that was chosen.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tool_call_grammar.h"

namespace sparkserve {

class Tokenizer;

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed: [vocab] 0/1, fully overwritten.
  virtual void allowed_tokens(std::span<uint8_t> allowed) = 0;
  // The token the sequence took (sampled under the last mask).
  virtual void accept(int32_t token) = 0;
};

// The decoded bytes of every token, computed once per tokenizer (the server builds it at start
// and shares it between requests), indexed for the mask computation.
class VocabTexts {
 public:
  // bytes(id): what the detokenizer emits for id; special(id): dropped from the text (never
  // allowed by a text constraint, except as an end token).
  static std::shared_ptr<const VocabTexts> build(const Tokenizer& tokenizer);
  // For tests and other tokenizers.
  static std::shared_ptr<const VocabTexts> build(size_t vocab, const std::vector<std::string>& bytes,
                                                 const std::vector<bool>& special);

  size_t size() const { return offsets_.size() - 1; }
  std::string_view bytes(int32_t id) const {
    return std::string_view(data_).substr(offsets_[static_cast<size_t>(id)],
                                          offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)]);
  }
  // Non-special tokens with non-empty text, grouped by first byte.
  const std::vector<int32_t>& starting_with(uint8_t b) const { return by_first_[b]; }
  // Index past the last '<' or '\n' in the token's text (0 when there is none): the bytes
  // after it cannot start or continue a tag.
  uint32_t marker_end(int32_t id) const { return marker_end_[static_cast<size_t>(id)]; }
  // Non-special, non-empty tokens without '<' and '\n'.
  const std::vector<int32_t>& plain() const { return plain_; }
  // Non-special, non-empty tokens with a '<' or '\n'.
  const std::vector<int32_t>& marked() const { return marked_; }

 private:
  std::string data_;
  std::vector<uint32_t> offsets_;
  std::vector<uint32_t> marker_end_;
  std::array<std::vector<int32_t>, 256> by_first_;
  std::vector<int32_t> plain_, marked_;
};

// tool_choice "required" / named function: the output must be tool calls (tool_call_grammar.h).
// end_ids (EOS and request stop ids) are allowed only where the grammar accepts.
class ToolCallConstraint : public TokenConstraint {
 public:
  ToolCallConstraint(ToolCallGrammar grammar, std::shared_ptr<const VocabTexts> vocab, std::vector<int32_t> end_ids);
  void allowed_tokens(std::span<uint8_t> allowed) override;
  void accept(int32_t token) override;
  const ToolCallState& state() const { return state_; }

 private:
  // Whether the rest of the token's bytes from `from` keep the grammar alive, starting in s.
  bool accepts_rest(ToolCallState s, int32_t id, size_t from) const;

  ToolCallGrammar grammar_;
  std::shared_ptr<const VocabTexts> vocab_;
  std::vector<int32_t> end_ids_;
  ToolCallState state_;
  bool ended_ = false;  // an end token was accepted
};

}  // namespace sparkserve
