#include "text/bpe.h"

#include <algorithm>
#include <queue>

#include "text/byte_level.h"

namespace sparkserve {

Expected<BpeModel> BpeModel::from_json(const nlohmann::json& spec) {
  if (!spec.is_object()) return make_error("tokenizer.json: missing \"model\" object");
  const std::string type = spec.contains("type") && spec["type"].is_string() ? spec["type"].get<std::string>() : "";
  if (type.empty() && !(spec.contains("merges") && spec.contains("vocab")))
    return make_error("tokenizer.json: model has no \"type\" and does not look like BPE");
  if (!type.empty() && type != "BPE")
    return make_error("tokenizer.json: unsupported tokenizer model type '" + type + "' (only BPE is supported)");
  if (spec.contains("dropout") && spec["dropout"].is_number() && spec["dropout"].get<double>() > 0.0)
    return make_error("tokenizer.json: BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (spec.contains(key) && spec[key].is_string() && !spec[key].get<std::string>().empty())
      return make_error(std::string("tokenizer.json: BPE ") + key + " is not supported");
  }
  if (spec.contains("byte_fallback") && spec["byte_fallback"].is_boolean() && spec["byte_fallback"].get<bool>())
    return make_error("tokenizer.json: BPE byte_fallback is not supported (byte-level BPE only)");
  if (spec.contains("unk_token") && !spec["unk_token"].is_null())
    return make_error("tokenizer.json: BPE unk_token is not supported (byte-level BPE needs none)");
  if (!spec.contains("vocab") || !spec["vocab"].is_object())
    return make_error("tokenizer.json: BPE model without a \"vocab\" object");
  if (!spec.contains("merges") || !spec["merges"].is_array())
    return make_error("tokenizer.json: BPE model without a \"merges\" array");

  BpeModel m;
  m.ignore_merges_ = spec.contains("ignore_merges") && spec["ignore_merges"].is_boolean() &&
                     spec["ignore_merges"].get<bool>();
  const auto& vocab = spec["vocab"];
  TokenId max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= kMaxTokenId)
      return make_error("tokenizer.json: vocab entry '" + it.key() + "' has no integer id in [0, " +
                        std::to_string(kMaxTokenId) + ")");
    max_id = std::max(max_id, it.value().get<TokenId>());
  }
  m.id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m.id_to_bytes_.resize(static_cast<size_t>(max_id + 1));
  m.id_present_.assign(static_cast<size_t>(max_id + 1), 0);
  m.token_ids_.reserve(vocab.size());
  m.bytes_to_id_.reserve(vocab.size());
  std::fill(std::begin(m.byte_ids_), std::end(m.byte_ids_), -1);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const TokenId id = it.value().get<TokenId>();
    const std::string& tok = it.key();
    m.token_ids_[tok] = id;
    m.id_to_token_[id] = tok;
    m.id_present_[id] = 1;
    ++m.vocab_entries_;
    // A vocab string with a character outside the byte-level alphabet can never come out of the
    // byte-level pre-tokenizer, so BPE never produces it; its bytes are its UTF-8 text (as HF's
    // ByteLevel decoder does).
    if (auto raw = byte_level_decode(tok)) {
      m.id_to_bytes_[id] = *raw;
      if (raw->size() == 1) m.byte_ids_[static_cast<unsigned char>((*raw)[0])] = id;
      m.bytes_to_id_.emplace(std::move(*raw), id);
    } else {
      m.id_to_bytes_[id] = tok;
    }
  }

  const auto& merges = spec["merges"];
  m.merges_.reserve(merges.size() * 2);
  int32_t rank = 0;
  for (const auto& entry : merges) {
    std::string a, b;
    if (entry.is_string()) {
      // Legacy form "a b": tokens never contain a plain space in byte-level BPE.
      const std::string& s = entry.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return make_error("tokenizer.json: merge #" + std::to_string(rank) + " '" + s + "' is not two tokens");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return make_error("tokenizer.json: merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    const auto ia = m.token_ids_.find(a), ib = m.token_ids_.find(b), ic = m.token_ids_.find(a + b);
    if (ia == m.token_ids_.end() || ib == m.token_ids_.end() || ic == m.token_ids_.end())
      return make_error("tokenizer.json: merge #" + std::to_string(rank) + " ('" + a + "', '" + b +
                        "') uses a token that is not in the vocab");
    // As HF: a later duplicate of the same pair does not override the first (lower) rank.
    m.merges_.emplace(pair_key(ia->second, ib->second), MergeTarget{rank, ic->second});
    ++rank;
  }
  m.merge_count_ = static_cast<size_t>(rank);
  return m;
}

const std::string* BpeModel::token_string(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_present_.size() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

const std::string* BpeModel::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_present_.size() || !id_present_[id]) return nullptr;
  return &id_to_bytes_[id];
}

TokenId BpeModel::token_to_id(std::string_view token) const {
  const auto it = token_ids_.find(std::string(token));
  return it == token_ids_.end() ? -1 : it->second;
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<TokenId>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    const auto it = bytes_to_id_.find(std::string(bytes));
    if (it != bytes_to_id_.end()) { out.push_back(it->second); return; }
  }
  merge_word(bytes, out);
}

// HF's Word::merge_all: repeatedly merge the adjacent pair of lowest rank (leftmost on ties).
// A doubly linked list of symbols plus a min-heap of candidate merges keeps long words linear-ish;
// stale heap entries are detected by re-checking the pair.
void BpeModel::merge_word(std::string_view bytes, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (unsigned char c : bytes) {
    const TokenId id = byte_ids_[c];
    if (id < 0) continue;  // no unk token: HF drops characters missing from the vocab
    const int idx = static_cast<int>(sym.size());
    sym.push_back({id, idx - 1, idx + 1, true});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank;
    int pos;
    TokenId new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
  heap.reserve(sym.size());
  auto push_pair = [&](int left) {
    const int right = sym[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.id != top.new_id) continue;  // stale
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace sparkserve
