// libFuzzer entry point for the tokenizer. The first input byte picks what to fuzz:
//   even: encode the rest with a tokenizer (the one in $SPARKSERVE_FUZZ_TOKENIZER_DIR if set,
//         else a small built-in byte-level BPE with the Qwen3.5 pipeline and added tokens), then
//         check invariants: invalid UTF-8 <=> error; decode(encode(x)) is valid UTF-8 and
//         re-encodes to the same ids; every id has token bytes; and the prompt memo: a 1 KB
//         preamble + the first half of the rest, then the preamble + the whole rest (which resumes
//         from the first), give the ids of a tokenizer without the memo;
//   odd:  load the rest as a tokenizer.json document (must give a Tokenizer or an Error).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

using sparkserve::Tokenizer;

std::string builtin_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[sparkserve::byte_level_chars()[b]] = b;
  const char* extra[] = {"th", "the", " the", "in", "ing", " a", "\xE4\xB8\xAD", "\xC3\xA9", "  ", "    "};
  const std::pair<const char*, const char*> merges[] = {
      {"t", "h"}, {"th", "e"}, {" ", "the"}, {"i", "n"}, {"in", "g"}, {" ", "a"},
      {"\xE4", "\xB8"}, {"\xE4\xB8", "\xAD"}, {"\xC3", "\xA9"}, {" ", " "}, {"  ", "  "}};
  int id = 256;
  for (const char* e : extra) vocab[sparkserve::byte_level_encode(e)] = id++;
  // "\xE4\xB8" is needed as an intermediate token for the 3-byte merge chain.
  vocab[sparkserve::byte_level_encode("\xE4\xB8")] = id++;
  nlohmann::json m = nlohmann::json::array();
  for (auto [a, b] : merges) m.push_back({sparkserve::byte_level_encode(a), sparkserve::byte_level_encode(b)});
  nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  auto added = [](int i, const char* c, bool special, bool l, bool r) {
    return nlohmann::json{{"id", i}, {"content", c}, {"special", special}, {"normalized", false},
                          {"lstrip", l}, {"rstrip", r}, {"single_word", false}};
  };
  return nlohmann::json{
      {"added_tokens", {added(1000, "<|im_start|>", true, false, false), added(1001, "<think>", false, false, false),
                        added(1002, "<s>", true, true, true)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"}},
          bl}}}},
      {"decoder", bl},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
  }.dump();
}

const Tokenizer& fuzz_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const char* dir = std::getenv("SPARKSERVE_FUZZ_TOKENIZER_DIR");
    auto t = dir ? Tokenizer::load(dir) : Tokenizer::from_json_text(builtin_tokenizer_json());
    CHECK_MSG(t.ok(), t.ok() ? "" : t.message().c_str());
    return std::make_unique<Tokenizer>(std::move(t).value());
  }();
  return *tok;
}

// fuzz_tokenizer() without its fragment cache and prompt memo: every text encoded from scratch.
const Tokenizer& from_scratch_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = std::make_unique<Tokenizer>(fuzz_tokenizer());
    t->set_fragment_cache_bytes(0);
    return t;
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const Tokenizer& tok = fuzz_tokenizer();
    auto ids = tok.encode(rest);
    const bool valid = !sparkserve::find_invalid_utf8(rest).has_value();
    CHECK(ids.ok() == valid);
    if (!ids.ok()) return 0;
    for (auto id : *ids) CHECK(id >= 0 && static_cast<size_t>(id) < tok.vocab_size());
    const std::string text = tok.decode(*ids);
    CHECK(!sparkserve::find_invalid_utf8(text).has_value());
    // decode(encode(x)) is NFC(x); NFC is idempotent, so encoding it again gives the same ids.
    auto again = tok.encode(text);
    CHECK(again.ok() && *again == *ids);
    const std::string added = tok.added_tokens().empty() ? "" : tok.added_tokens()[0].content;
    const std::string preamble = std::string(1100, 'x') + added + " ";
    for (const std::string& t : {preamble + std::string(rest.substr(0, rest.size() / 2)), preamble + std::string(rest)}) {
      auto memo = tok.encode(t), plain = from_scratch_tokenizer().encode(t);
      CHECK(memo.ok() == plain.ok());
      if (memo.ok()) CHECK(*memo == *plain);
    }
  } else {
    auto t = Tokenizer::from_json_text(rest);
    if (t.ok()) (void)t->encode("fuzz <|im_start|> text");
  }
  return 0;
}
