#include "text/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/check.h"
#include "text/hf_nfc_starters.h"

namespace sparkserve {
namespace {

Status append_steps(const nlohmann::json& spec, std::vector<Normalizer::Form>& steps) {
  if (spec.is_null()) return Status::Ok();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return make_error("tokenizer.json: normalizer must be null or an object with a string \"type\"");
  const std::string type = spec["type"];
  if (type == "NFC") { steps.push_back(Normalizer::Form::kNFC); return Status::Ok(); }
  if (type == "NFD") { steps.push_back(Normalizer::Form::kNFD); return Status::Ok(); }
  if (type == "NFKC") { steps.push_back(Normalizer::Form::kNFKC); return Status::Ok(); }
  if (type == "NFKD") { steps.push_back(Normalizer::Form::kNFKD); return Status::Ok(); }
  if (type == "Sequence") {
    if (!spec.contains("normalizers") || !spec["normalizers"].is_array())
      return make_error("tokenizer.json: Sequence normalizer without a \"normalizers\" array");
    for (const auto& sub : spec["normalizers"]) SS_RETURN_IF_ERROR(append_steps(sub, steps));
    return Status::Ok();
  }
  return make_error("tokenizer.json: unsupported normalizer type '" + type +
                    "' (supported: NFC, NFD, NFKC, NFKD, Sequence, null)");
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool is_hf_nfc_starter(uint32_t cp) {
  const CodePointRange* end = kHfNfcStarters + kHfNfcStartersCount;
  const CodePointRange* it = std::upper_bound(
      kHfNfcStarters, end, cp, [](uint32_t c, const CodePointRange& r) { return c < r.lo; });
  return it != kHfNfcStarters && cp <= (it - 1)->hi;
}

// Decodes the code point starting at s[i] (valid UTF-8) and returns its byte length.
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return n;
}

std::string utf8proc_form(std::string_view text, Normalizer::Form f) {
  int options = UTF8PROC_STABLE;
  switch (f) {
    case Normalizer::Form::kNFC: options |= UTF8PROC_COMPOSE; break;
    case Normalizer::Form::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case Normalizer::Form::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Normalizer::Form::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  if (text.empty()) return std::string();
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &out,
                                            static_cast<utf8proc_option_t>(options));
  // Input is validated UTF-8 before it gets here, so utf8proc cannot fail but on out-of-memory.
  CHECK_MSG(len >= 0, utf8proc_errmsg(len));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
}

// NFC as Hugging Face tokenizers computes it. HF's Unicode data predates Unicode 10, so the
// marks added since (kHfNfcStarters, derived from HF itself) are, for HF, starters of canonical
// combining class 0 without decomposition that never compose. NFC with such a code point S
// splits at S: canonical reordering only permutes runs of non-starters, so nothing moves across
// a starter; S does not decompose, so it stays a single starter in place; and canonical
// composition combines a character only with the last starter before it, unblocked, so nothing
// after S composes with anything before S, and S itself composes with nothing. Hence
// NFC(x S y) = NFC(x) S NFC(y), which is what this computes, with utf8proc's current-Unicode NFC
// of the runs between held code points (which contain none of them, so agree with HF).
std::string hf_nfc(std::string_view text) {
  std::string out;
  size_t run_start = 0;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t n = decode_utf8(text, i, cp);
    if (cp >= 0x300 && is_hf_nfc_starter(cp)) {
      out += utf8proc_form(text.substr(run_start, i - run_start), Normalizer::Form::kNFC);
      out.append(text.substr(i, n));
      run_start = i + n;
    }
    i += n;
  }
  if (run_start == 0) return utf8proc_form(text, Normalizer::Form::kNFC);  // fast path: none held
  out += utf8proc_form(text.substr(run_start), Normalizer::Form::kNFC);
  return out;
}

}  // namespace

Expected<Normalizer> Normalizer::from_json(const nlohmann::json& spec) {
  Normalizer n;
  SS_RETURN_IF_ERROR(append_steps(spec, n.steps_));
  return n;
}

std::string Normalizer::normalize(std::string_view text) const {
  // Every supported form leaves ASCII unchanged, and most text fragments are ASCII.
  if (steps_.empty() || is_ascii(text)) return std::string(text);
  std::string cur(text);
  for (Form f : steps_) cur = f == Form::kNFC ? hf_nfc(cur) : utf8proc_form(cur, f);
  return cur;
}

}  // namespace sparkserve
