// Hugging Face-compatible byte-level BPE tokenizer, loaded from a model folder's tokenizer.json
// (+ tokenizer_config.json). encode() gives the ids HF `tokenizers` gives for
// Tokenizer.encode(text).ids (added/special tokens in the text are matched as such, no
// split_special_tokens); decode() mirrors HF decode with the ByteLevel decoder.
//
// Pipeline (HF semantics): added tokens with normalized=false are matched on the raw text; each
// remaining fragment is normalized (NFC), normalized=true added tokens are matched in it, the rest
// is pre-tokenized (regex Split + ByteLevel) and each piece is BPE-encoded.
//
// Thread safety: a loaded Tokenizer is immutable but for its caches; encode/decode may run
// concurrently (the word cache is per thread, the fragment cache is shared and locked). A copy of a
// Tokenizer (or a moved one) starts with an empty fragment cache of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/fragment_cache.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/prompt_memo.h"

namespace sparkserve {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (required) and DIR/tokenizer_config.json (optional).
  static Expected<Tokenizer> load(const std::string& model_dir);
  // `config_json` may be empty (no tokenizer_config.json).
  static Expected<Tokenizer> from_json_text(std::string_view tokenizer_json, std::string_view config_json = {});

  // Ids of `text`. Invalid UTF-8 is an error naming the byte offset of the first bad byte.
  Expected<std::vector<TokenId>> encode(std::string_view text) const;

  // The fragment cache (text/fragment_cache.h) holds up to this many bytes of text and ids; 0 turns
  // it and the prompt memo (text/prompt_memo.h) off. Set it before the tokenizer is used (it drops
  // what the caches hold).
  static constexpr size_t kDefaultFragmentCacheBytes = 64 << 20;
  // The prompt memo keeps the last kPromptMemoEntries texts of at most kPromptMemoMaxBytes each (a
  // 262K-token prompt is ~1 MiB), with their ids and resume points.
  static constexpr size_t kPromptMemoEntries = 8, kPromptMemoMaxBytes = 1 << 20;
  void set_fragment_cache_bytes(size_t max_bytes) { fragments_ = FragmentCacheSlot(max_bytes); }
  const FragmentCache& fragment_cache() const { return *fragments_.cache; }
  const PromptMemo* prompt_memo() const { return fragments_.memo.get(); }

  // Raw bytes of the ids (not necessarily valid UTF-8 when the ids cut a character; HF's decode
  // would then show U+FFFD, see utf8_lossy in text/utf8.h). Ids that name no token are skipped,
  // as HF does; with skip_special_tokens, added tokens flagged special are skipped too.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // Raw bytes of one token: what decode({id}) gives. "" for an id that names no token.
  std::string token_bytes(TokenId id) const;

  // Number of id slots: highest token id + 1 (vocab + added tokens). The model's embedding may be
  // larger (padded).
  size_t vocab_size() const { return vocab_size_; }
  // Token string as written in tokenizer.json (byte-level characters for vocab tokens, content
  // for added tokens).
  std::optional<std::string> id_to_token(TokenId id) const;
  std::optional<TokenId> token_to_id(std::string_view token) const;

  bool is_special(TokenId id) const;
  bool is_added(TokenId id) const { return added_by_id_.count(id) != 0; }
  // Ids of added tokens flagged special, ascending.
  const std::vector<TokenId>& special_token_ids() const { return special_ids_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // From tokenizer_config.json (nullopt when absent or null).
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const std::optional<std::string>& pad_token() const { return pad_token_; }
  const std::optional<std::string>& unk_token() const { return unk_token_; }
  std::optional<TokenId> bos_token_id() const { return bos_token_ ? token_to_id(*bos_token_) : std::nullopt; }
  std::optional<TokenId> eos_token_id() const { return eos_token_ ? token_to_id(*eos_token_) : std::nullopt; }
  std::optional<TokenId> pad_token_id() const { return pad_token_ ? token_to_id(*pad_token_) : std::nullopt; }
  bool add_bos_token() const { return add_bos_token_; }
  // The raw tokenizer_config.json (null when absent), for the chat-template code.
  const nlohmann::json& config() const { return config_; }

 private:
  static Expected<Tokenizer> from_json_text_unchecked(std::string_view tokenizer_json, std::string_view config_json);
  Status encode_fragment(std::string_view raw, std::vector<TokenId>& out) const;
  // encode_fragment through the cache of long fragments.
  Status encode_fragment_cached(std::string_view raw, std::vector<TokenId>& out) const;
  Status encode_normalized(std::string_view text, std::vector<TokenId>& out) const;

  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  BpeModel model_;
  std::vector<AddedToken> added_;
  std::unordered_map<TokenId, size_t> added_by_id_;
  std::unordered_map<std::string, TokenId> added_by_content_;
  std::vector<TokenId> special_ids_;
  AddedTokenMatcher raw_matcher_;         // normalized=false added tokens
  AddedTokenMatcher normalized_matcher_;  // normalized=true added tokens (normalized content)
  size_t vocab_size_ = 0;
  uint64_t serial_ = 0;  // identifies this instance's entries in the per-thread word cache
  // Fragments (text between added tokens) of 1 KB or more -> ids, for all threads; a copied or
  // moved Tokenizer gets a new, empty one of the same bound (so no Tokenizer is ever without one).
  // The prompt memo comes and goes with it.
  struct FragmentCacheSlot {
    explicit FragmentCacheSlot(size_t max_bytes)
        : cache(std::make_unique<FragmentCache>(max_bytes)),
          memo(max_bytes ? std::make_unique<PromptMemo>(kPromptMemoEntries, kPromptMemoMaxBytes) : nullptr) {}
    FragmentCacheSlot(const FragmentCacheSlot& o) : FragmentCacheSlot(o.cache->max_bytes()) {}
    FragmentCacheSlot& operator=(const FragmentCacheSlot& o) {
      *this = FragmentCacheSlot(o.cache->max_bytes());
      return *this;
    }
    FragmentCacheSlot& operator=(FragmentCacheSlot&&) = default;
    std::unique_ptr<FragmentCache> cache;
    std::unique_ptr<PromptMemo> memo;
  };
  FragmentCacheSlot fragments_{kDefaultFragmentCacheBytes};
  std::optional<std::string> bos_token_, eos_token_, pad_token_, unk_token_;
  bool add_bos_token_ = false;
  nlohmann::json config_;
};

}  // namespace sparkserve
