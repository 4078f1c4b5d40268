#include "text/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace sparkserve {
namespace {

Expected<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return make_error("cannot read " + path);
  return ss.str();
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// tokenizer_config.json writes special tokens as a string, an AddedToken object, or null.
std::optional<std::string> config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

Status check_supported_processor(const nlohmann::json& spec, const char* what) {
  if (spec.is_null()) return Status::Ok();
  const std::string type = spec.is_object() ? spec.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    const char* key = std::string_view(what) == "decoder" ? "decoders" : "processors";
    if (spec.contains(key) && spec[key].is_array()) {
      for (const auto& sub : spec[key]) SS_RETURN_IF_ERROR(check_supported_processor(sub, what));
      return Status::Ok();
    }
  }
  return make_error(std::string("tokenizer.json: unsupported ") + what + " type '" + type +
                    "' (supported: ByteLevel, null)");
}

// A per-thread cache of piece bytes -> ids. Pieces repeat a lot in natural text.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>> map;
};
constexpr size_t kWordCacheMaxEntries = 1 << 17;
constexpr size_t kWordCacheMaxPieceBytes = 256;

WordCache& thread_word_cache(uint64_t owner) {
  thread_local WordCache cache;
  if (cache.owner != owner) {
    cache.map.clear();
    cache.owner = owner;
  }
  return cache;
}

// Shorter fragments: the word cache suffices.
constexpr size_t kFragmentCacheMinBytes = 1024;
// Shorter texts are not worth remembering whole (PromptMemo).
constexpr size_t kPromptMemoMinBytes = 1024;

std::atomic<uint64_t> next_serial{1};

}  // namespace

Expected<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const std::string tok_path = model_dir + "/tokenizer.json";
  if (!file_exists(tok_path)) return make_error("no tokenizer.json in " + model_dir);
  SS_ASSIGN_OR_RETURN(std::string tok_text, read_file(tok_path));
  std::string cfg_text;
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  if (file_exists(cfg_path)) {
    SS_ASSIGN_OR_RETURN(cfg_text, read_file(cfg_path));
  }
  auto t = from_json_text(tok_text, cfg_text);
  if (!t.ok()) return make_error(t.message() + " (in " + model_dir + ")");
  return t;
}

Expected<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view config_json) {
  // Any JSON access that meets an unexpected type (a string where a number belongs, ...) throws;
  // a malformed file is an Error, never an exception escaping to the caller.
  try {
    return from_json_text_unchecked(tokenizer_json, config_json);
  } catch (const nlohmann::json::exception& e) {
    return make_error(std::string("tokenizer.json / tokenizer_config.json has an unexpected value: ") + e.what());
  }
}

Expected<Tokenizer> Tokenizer::from_json_text_unchecked(std::string_view tokenizer_json, std::string_view config_json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(tokenizer_json);
  } catch (const nlohmann::json::exception& e) {
    return make_error(std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return make_error("tokenizer.json: top level is not a JSON object");
  if (!j.contains("model")) return make_error("tokenizer.json: missing \"model\"");

  Tokenizer t;
  t.serial_ = next_serial.fetch_add(1);
  SS_ASSIGN_OR_RETURN(t.model_, BpeModel::from_json(j["model"]));
  SS_ASSIGN_OR_RETURN(t.normalizer_, Normalizer::from_json(j.value("normalizer", nlohmann::json())));
  SS_ASSIGN_OR_RETURN(t.pre_tokenizer_, PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json())));
  SS_RETURN_IF_ERROR(check_supported_processor(j.value("decoder", nlohmann::json()), "decoder"));
  SS_RETURN_IF_ERROR(check_supported_processor(j.value("post_processor", nlohmann::json()), "post_processor"));

  t.vocab_size_ = t.model_.id_limit();
  const auto added_json = j.value("added_tokens", nlohmann::json::array());
  if (!added_json.is_array()) return make_error("tokenizer.json: \"added_tokens\" is not an array");
  std::vector<AddedToken> raw_tokens, norm_tokens;
  std::vector<std::string> raw_patterns, norm_patterns;
  for (const auto& a : added_json) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      return make_error("tokenizer.json: an added_tokens entry lacks an integer \"id\" or a string \"content\"");
    AddedToken tok;
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= kMaxTokenId)
      return make_error("tokenizer.json: added token id " + std::to_string(id) + " is out of range [0, " +
                        std::to_string(kMaxTokenId) + ")");
    tok.id = static_cast<TokenId>(id);
    tok.content = a["content"].get<std::string>();
    if (find_invalid_utf8(tok.content)) return make_error("tokenizer.json: added token content is not UTF-8");
    auto flag = [&](const char* k, bool d) { return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : d; };
    tok.special = flag("special", false);
    tok.normalized = flag("normalized", !tok.special);
    tok.lstrip = flag("lstrip", false);
    tok.rstrip = flag("rstrip", false);
    tok.single_word = flag("single_word", false);
    t.added_by_id_[tok.id] = t.added_.size();
    t.added_by_content_[tok.content] = tok.id;
    if (tok.special) t.special_ids_.push_back(tok.id);
    t.vocab_size_ = std::max(t.vocab_size_, static_cast<size_t>(tok.id) + 1);
    t.added_.push_back(tok);
    if (tok.normalized) {
      norm_patterns.push_back(t.normalizer_.normalize(tok.content));
      norm_tokens.push_back(std::move(tok));
    } else {
      raw_patterns.push_back(tok.content);
      raw_tokens.push_back(std::move(tok));
    }
  }
  std::sort(t.special_ids_.begin(), t.special_ids_.end());
  t.raw_matcher_ = AddedTokenMatcher(std::move(raw_tokens), std::move(raw_patterns));
  t.normalized_matcher_ = AddedTokenMatcher(std::move(norm_tokens), std::move(norm_patterns));

  if (!config_json.empty()) {
    try {
      t.config_ = nlohmann::json::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      return make_error(std::string("tokenizer_config.json is not valid JSON: ") + e.what());
    }
    if (!t.config_.is_object()) return make_error("tokenizer_config.json: top level is not a JSON object");
    t.bos_token_ = config_token(t.config_, "bos_token");
    t.eos_token_ = config_token(t.config_, "eos_token");
    t.pad_token_ = config_token(t.config_, "pad_token");
    t.unk_token_ = config_token(t.config_, "unk_token");
    if (t.config_.contains("add_bos_token") && t.config_["add_bos_token"].is_boolean())
      t.add_bos_token_ = t.config_["add_bos_token"].get<bool>();
  }
  return t;
}

Expected<std::vector<TokenId>> Tokenizer::encode(std::string_view text) const {
  // A text that starts as a recently encoded one did resumes after the memo's last added token
  // that both texts share (text/prompt_memo.h); the part before it was valid UTF-8 there.
  PromptMemo* memo = raw_matcher_.empty() || text.size() < kPromptMemoMinBytes ? nullptr : fragments_.memo.get();
  const PromptMemo::Found found = memo ? memo->find(text) : PromptMemo::Found{};
  const SplitResume from = found.point ? found.point->split : SplitResume{};
  if (auto bad = find_invalid_utf8(text.substr(from.segment_begin))) {
    const size_t at = from.segment_begin + *bad;
    return make_error("input is not valid UTF-8: invalid byte 0x" +
                      [](unsigned char c) {
                        const char* hex = "0123456789abcdef";
                        return std::string{hex[c >> 4], hex[c & 15]};
                      }(static_cast<unsigned char>(text[at])) +
                      " at byte offset " + std::to_string(at));
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_.empty()) {
    SS_RETURN_IF_ERROR(encode_fragment_cached(text, ids));
    return ids;
  }
  auto entry = memo ? std::make_shared<PromptMemo::Entry>() : nullptr;
  if (found.point) {
    ids.assign(found.entry->ids.begin(), found.entry->ids.begin() + static_cast<ptrdiff_t>(found.point->num_ids));
    entry->points.assign(found.entry->points.data(), found.point + 1);
  }
  std::vector<TextSegment> segs;
  raw_matcher_.split(text, segs, from);
  for (const TextSegment& s : segs) {
    if (s.token < 0) {
      SS_RETURN_IF_ERROR(encode_fragment_cached(text.substr(s.begin, s.end - s.begin), ids));
      continue;
    }
    ids.push_back(s.token);
    if (!entry) continue;
    const size_t needs = std::max(entry->points.empty() ? 0 : entry->points.back().needs, s.end + raw_matcher_.lookahead());
    entry->points.push_back({SplitResume{s.end, s.match_end}, needs, ids.size()});
  }
  if (entry && text.size() <= memo->max_text_bytes()) {
    entry->text = text;
    entry->ids = ids;
    memo->add(std::move(entry));
  }
  return ids;
}

Status Tokenizer::encode_fragment_cached(std::string_view raw, std::vector<TokenId>& out) const {
  if (raw.size() < kFragmentCacheMinBytes) return encode_fragment(raw, out);
  if (fragments_.cache->append(raw, out)) return Status::Ok();
  std::vector<TokenId> ids;
  SS_RETURN_IF_ERROR(encode_fragment(raw, ids));
  out.insert(out.end(), ids.begin(), ids.end());
  fragments_.cache->put(raw, std::move(ids));
  return Status::Ok();
}

Status Tokenizer::encode_fragment(std::string_view raw, std::vector<TokenId>& out) const {
  const std::string normalized = normalizer_.normalize(raw);
  if (normalized_matcher_.empty()) return encode_normalized(normalized, out);
  std::vector<TextSegment> segs;
  normalized_matcher_.split(normalized, segs);
  const std::string_view text = normalized;
  for (const TextSegment& s : segs) {
    if (s.token >= 0) out.push_back(s.token);
    else SS_RETURN_IF_ERROR(encode_normalized(text.substr(s.begin, s.end - s.begin), out));
  }
  return Status::Ok();
}

Status Tokenizer::encode_normalized(std::string_view text, std::vector<TokenId>& out) const {
  std::vector<std::string> pieces;
  SS_RETURN_IF_ERROR(pre_tokenizer_.split(text, pieces));
  WordCache& cache = thread_word_cache(serial_);
  for (const std::string& piece : pieces) {
    if (piece.size() > kWordCacheMaxPieceBytes) {
      model_.encode_piece(piece, out);
      continue;
    }
    auto it = cache.map.find(piece);
    if (it == cache.map.end()) {
      if (cache.map.size() >= kWordCacheMaxEntries) cache.map.clear();
      std::vector<TokenId> ids;
      model_.encode_piece(piece, ids);
      it = cache.map.emplace(piece, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return Status::Ok();
}

std::string Tokenizer::token_bytes(TokenId id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    // HF's ByteLevel decoder maps each character of the token back to its byte, or keeps the
    // token's UTF-8 text when a character is outside the byte-level alphabet.
    const std::string& content = added_[it->second].content;
    if (auto raw = byte_level_decode(content)) return *raw;
    return content;
  }
  const std::string* b = model_.token_bytes(id);
  return b ? *b : std::string();
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string out;
  for (TokenId id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  if (const std::string* s = model_.token_string(id)) return *s;
  return std::nullopt;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return it->second;
  const TokenId id = model_.token_to_id(token);
  if (id >= 0) return id;
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  const auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace sparkserve
