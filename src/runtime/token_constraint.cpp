#include "runtime/token_constraint.h"

#include <algorithm>

#include "core/check.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace sparkserve {

namespace {

// No '"', '\\' or control byte; well-formed UTF-8 from a character start (a cut last character is
// fine: the next token continues it).
bool json_plain_bytes(std::string_view b) {
  if (b.empty() || (static_cast<uint8_t>(b[0]) & 0xC0) == 0x80) return false;
  Utf8Stepper u;
  for (char c : b) {
    const auto x = static_cast<uint8_t>(c);
    if (x == '"' || x == '\\' || x < 0x20) return false;
    if (u.feed(x) == Utf8Stepper::kBad) return false;
  }
  return true;
}

}  // namespace

VocabTrie::VocabTrie(const std::vector<int32_t>& tokens, const std::function<std::string_view(int32_t)>& texts) {
  std::vector<int32_t> sorted = tokens;
  std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return texts(a) < texts(b); });
  nodes_.reserve(sorted.size() * 3);
  build(sorted.cbegin(), sorted.cend(), 0, texts);
}

// Tokens in [begin, end) are sorted and share their first `depth` bytes; those of exactly that
// length end at this node, the rest are grouped by their next byte.
uint32_t VocabTrie::build(std::vector<int32_t>::const_iterator begin, std::vector<int32_t>::const_iterator end,
                          size_t depth, const std::function<std::string_view(int32_t)>& texts) {
  const auto self = static_cast<uint32_t>(nodes_.size());
  nodes_.emplace_back();
  auto it = begin;
  const auto tok_begin = static_cast<uint32_t>(tokens_.size());
  while (it != end && texts(*it).size() == depth) tokens_.push_back(*it++);
  nodes_[self].token_begin = tok_begin;
  nodes_[self].token_end = static_cast<uint32_t>(tokens_.size());
  std::vector<std::pair<uint8_t, uint32_t>> kids;
  while (it != end) {
    const auto byte = static_cast<uint8_t>(texts(*it)[depth]);
    auto group_end = std::find_if(it, end, [&](int32_t t) { return static_cast<uint8_t>(texts(t)[depth]) != byte; });
    kids.emplace_back(byte, build(it, group_end, depth + 1, texts));
    it = group_end;
  }
  nodes_[self].edge_begin = static_cast<uint32_t>(edges_.size());
  for (auto [b, n] : kids) edges_.push_back({b, n});
  nodes_[self].edge_end = static_cast<uint32_t>(edges_.size());
  return self;
}

const VocabTrie& VocabTexts::trie() const {
  std::call_once(trie_once_, [this] {
    std::vector<int32_t> ids = plain_;  // every non-special, non-empty token
    ids.insert(ids.end(), marked_.begin(), marked_.end());
    trie_ = std::make_unique<VocabTrie>(ids, [this](int32_t id) { return bytes(id); });
  });
  return *trie_;
}

std::shared_ptr<const VocabTexts> VocabTexts::build(const Tokenizer& tokenizer) {
  const size_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> special(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    special[i] = tokenizer.is_special(id);
    bytes[i] = tokenizer.token_bytes(id);
  }
  return build(n, bytes, special);
}

std::shared_ptr<const VocabTexts> VocabTexts::build(size_t vocab, const std::vector<std::string>& bytes,
                                                    const std::vector<bool>& special) {
  CHECK_MSG(bytes.size() == vocab && special.size() == vocab, "VocabTexts: one text and flag per token");
  auto v = std::make_shared<VocabTexts>();
  v->offsets_.reserve(vocab + 1);
  v->marker_end_.resize(vocab, 0);
  v->offsets_.push_back(0);
  for (size_t i = 0; i < vocab; ++i) {
    const std::string& b = bytes[i];
    v->data_ += b;
    v->offsets_.push_back(static_cast<uint32_t>(v->data_.size()));
    const size_t last = b.find_last_of("<\n");
    v->marker_end_[i] = last == std::string::npos ? 0 : static_cast<uint32_t>(last + 1);
    v->chars_.push_back(static_cast<uint32_t>(
        std::count_if(b.begin(), b.end(), [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; })));
    v->json_plain_.push_back(!special[i] && json_plain_bytes(b));
    if (special[i] || b.empty()) continue;
    const auto id = static_cast<int32_t>(i);
    v->by_first_[static_cast<uint8_t>(b[0])].push_back(id);
    (last == std::string::npos ? v->plain_ : v->marked_).push_back(id);
  }
  return v;
}

ToolCallConstraint::ToolCallConstraint(ToolCallGrammar grammar, std::shared_ptr<const VocabTexts> vocab,
                                       std::vector<int32_t> end_ids)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), end_ids_(std::move(end_ids)) {
  state_ = grammar_.initial();
}

bool ToolCallConstraint::accepts_rest(ToolCallState s, int32_t id, size_t from) const {
  const std::string_view b = vocab_->bytes(id);
  const size_t quiet_from = vocab_->marker_end(id);
  for (size_t i = from; i < b.size(); ++i) {
    // Free text with no partial tag, and no '<' / '\n' left in the token: all of it is text.
    if (i >= quiet_from && ToolCallGrammar::free_idle(s)) return true;
    if (!grammar_.step(s, static_cast<uint8_t>(b[i]))) return false;
  }
  return true;
}

void ToolCallConstraint::allowed_tokens(std::span<uint8_t> allowed) {
  std::fill(allowed.begin(), allowed.end(), uint8_t{0});
  auto allow = [&](int32_t id) {
    if (id >= 0 && static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
  };
  const bool alive = !ended_ && state_.phase != ToolCallState::Phase::kDead;
  bool any = false;
  if (alive) {
    if (ToolCallGrammar::free_idle(state_)) {
      for (int32_t id : vocab_->plain()) allow(id);
      any = !vocab_->plain().empty();
      for (int32_t id : vocab_->marked())
        if (accepts_rest(state_, id, 0)) {
          allow(id);
          any = true;
        }
    } else {
      for (int b = 0; b < 256; ++b) {
        const auto& bucket = vocab_->starting_with(static_cast<uint8_t>(b));
        if (bucket.empty()) continue;
        ToolCallState s = state_;
        if (!grammar_.step(s, static_cast<uint8_t>(b))) continue;
        for (int32_t id : bucket)
          if (accepts_rest(s, id, 1)) {
            allow(id);
            any = true;
          }
      }
    }
  }
  // End tokens where the grammar accepts; and always rather than nothing at all (a dead state
  // can only come from a token that was taken without this mask).
  if (!alive || grammar_.accepting(state_) || !any)
    for (int32_t id : end_ids_) allow(id);
}

void ToolCallConstraint::accept(int32_t token) {
  if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) {
    ended_ = true;
    return;
  }
  if (ended_ || token < 0 || static_cast<size_t>(token) >= vocab_->size()) {
    state_.phase = ToolCallState::Phase::kDead;
    return;
  }
  if (!grammar_.step_all(state_, vocab_->bytes(token))) state_.phase = ToolCallState::Phase::kDead;
}

}  // namespace sparkserve
