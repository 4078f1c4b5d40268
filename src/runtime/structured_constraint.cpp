#include "runtime/structured_constraint.h"

#include <algorithm>

namespace sparkserve {
namespace {

constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

StructuredConstraint::StructuredConstraint(std::shared_ptr<const JsonGrammar> grammar, bool thinking,
                                           std::shared_ptr<const VocabTexts> vocab, std::vector<int32_t> end_ids)
    : matcher_(std::move(grammar)), vocab_(std::move(vocab)), end_ids_(std::move(end_ids)) {
  state_.reasoning = thinking;
  state_.json = matcher_.initial();
}

bool StructuredConstraint::step(State& s, uint8_t b) const {
  if (!s.reasoning) return matcher_.step(s.json, b);
  std::string t = s.tail;
  t.push_back(static_cast<char>(b));
  const std::string_view tv(t);
  if (tv.size() >= kThinkEnd.size() && tv.substr(tv.size() - kThinkEnd.size()) == kThinkEnd) {
    s.reasoning = false;
    s.tail.clear();
    return true;
  }
  if (tv.size() >= kToolCall.size() && tv.substr(tv.size() - kToolCall.size()) == kToolCall) return false;
  // Keep the longest suffix that is a proper prefix of one of the tags.
  for (size_t k = std::min(tv.size(), kToolCall.size() - 1); k >= 1; --k) {
    const std::string_view suf = tv.substr(tv.size() - k);
    if ((k < kThinkEnd.size() && starts_with(kThinkEnd, suf)) || starts_with(kToolCall, suf)) {
      s.tail.assign(suf);
      return true;
    }
  }
  s.tail.clear();
  return true;
}

bool StructuredConstraint::step_text(State& s, std::string_view text) const {
  State t = s;
  for (char c : text)
    if (!step(t, static_cast<uint8_t>(c))) return false;
  s = std::move(t);
  return true;
}

bool StructuredConstraint::walk(State s, int32_t id) const {
  const std::string_view b = vocab_->bytes(id);
  const size_t quiet_from = vocab_->marker_end(id);
  for (size_t i = 0; i < b.size(); ++i) {
    // Reasoning with no partial tag, and no '<' left in the token: the rest is reasoning too.
    if (s.reasoning && s.tail.empty() && i >= quiet_from) return true;
    if (!step(s, static_cast<uint8_t>(b[i]))) return false;
  }
  return true;
}

void StructuredConstraint::walk_trie(uint32_t node, const State& s, std::span<uint8_t> allowed, bool& any) const {
  const VocabTrie& trie = vocab_->trie();
  const VocabTrie::Node& n = trie.node(node);
  for (uint32_t k = n.token_begin; k < n.token_end; ++k) {
    allowed[static_cast<size_t>(trie.tokens()[k])] = 1;
    any = true;
  }
  for (uint32_t e = n.edge_begin; e < n.edge_end; ++e) {
    const VocabTrie::Edge& edge = trie.edges()[e];
    State c = s;
    if (step(c, edge.byte)) walk_trie(edge.node, c, allowed, any);
  }
}

void StructuredConstraint::allowed_tokens(std::span<uint8_t> allowed) {
  std::fill(allowed.begin(), allowed.end(), uint8_t{0});
  const bool alive = !ended_ && !state_.dead;
  bool any = false;
  auto allow = [&](int32_t id) {
    if (id >= 0 && static_cast<size_t>(id) < allowed.size()) {
      allowed[static_cast<size_t>(id)] = 1;
      any = true;
    }
  };
  if (alive && allowed.size() >= vocab_->size()) {
    if (state_.reasoning) {
      // Free text: tokens without '<' / '\n' are reasoning as they are; the others are walked.
      if (state_.tail.empty()) {
        for (int32_t id : vocab_->plain()) allow(id);
        for (int32_t id : vocab_->marked())
          if (walk(state_, id)) allow(id);
      } else {
        for (int32_t id : vocab_->plain())
          if (walk(state_, id)) allow(id);
        for (int32_t id : vocab_->marked())
          if (walk(state_, id)) allow(id);
      }
    } else if (auto room = matcher_.plain_string_room(state_.json)) {
      // Inside a plain JSON string: a token without quotes, backslashes or control bytes stays
      // in it; it only has to fit the remaining length. The others are walked.
      for (int32_t id : vocab_->plain())
        if (vocab_->json_plain(id) ? vocab_->chars(id) <= *room : walk(state_, id)) allow(id);
      for (int32_t id : vocab_->marked())
        if (vocab_->json_plain(id) ? vocab_->chars(id) <= *room : walk(state_, id)) allow(id);
    } else {
      walk_trie(0, state_, allowed, any);
    }
  }
  // End tokens where the grammar accepts; and always rather than nothing at all (a dead state
  // can only come from a token that was taken without this mask).
  if (!alive || accepting(state_) || !any)
    for (int32_t id : end_ids_) allow(id);
}

void StructuredConstraint::accept(int32_t token) {
  if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) {
    ended_ = true;
    return;
  }
  if (ended_ || state_.dead || token < 0 || static_cast<size_t>(token) >= vocab_->size() ||
      !step_text(state_, vocab_->bytes(token)))
    state_.dead = true;
}

}  // namespace sparkserve
