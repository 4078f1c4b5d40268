// Constrained decoding: which vocabulary tokens a request may sample next. The engine asks the
// request's constraint for a mask before each sampled token (sampler: applied after the raw
// logprobs are read, before logit_bias) and reports the token that was chosen.
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
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

// The non-special tokens' bytes as a trie (children of a node share its bytes as their
// prefix), so that a mask can walk each common prefix once and drop whole subtrees at the
// first byte the constraint refuses.
class VocabTrie {
 public:
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  struct Node {
    uint32_t edge_begin = 0, edge_end = 0;    // into edges()
    uint32_t token_begin = 0, token_end = 0;  // into tokens(): tokens whose bytes end here
  };
  // tokens: the ids to index, texts: bytes of every id.
  VocabTrie(const std::vector<int32_t>& tokens, const std::function<std::string_view(int32_t)>& texts);
  const Node& node(uint32_t i) const { return nodes_[i]; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  size_t size() const { return nodes_.size(); }

 private:
  uint32_t build(std::vector<int32_t>::const_iterator begin, std::vector<int32_t>::const_iterator end, size_t depth,
                 const std::function<std::string_view(int32_t)>& texts);
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
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
  // Non-special, non-empty tokens that may go inside a JSON string as they are: no '"', '\\' or
  // control byte, well-formed UTF-8 from a character start (the last character may be cut).
  bool json_plain(int32_t id) const { return json_plain_[static_cast<size_t>(id)] != 0; }
  // Characters the token starts (bytes that are not UTF-8 continuation bytes).
  uint32_t chars(int32_t id) const { return chars_[static_cast<size_t>(id)]; }
  // Every non-special, non-empty token, as a trie (built on first use, then shared).
  const VocabTrie& trie() const;

 private:
  std::string data_;
  std::vector<uint32_t> offsets_;
  std::vector<uint32_t> marker_end_;
  std::array<std::vector<int32_t>, 256> by_first_;
  std::vector<int32_t> plain_, marked_;
  std::vector<uint8_t> json_plain_;
  std::vector<uint32_t> chars_;
  mutable std::once_flag trie_once_;
  mutable std::unique_ptr<VocabTrie> trie_;
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
