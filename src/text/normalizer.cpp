#include "text/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/check.h"

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
  for (Form f : steps_) {
    int options = UTF8PROC_STABLE;
    switch (f) {
      case Form::kNFC: options |= UTF8PROC_COMPOSE; break;
      case Form::kNFD: options |= UTF8PROC_DECOMPOSE; break;
      case Form::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case Form::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()),
                                              static_cast<utf8proc_ssize_t>(cur.size()), &out,
                                              static_cast<utf8proc_option_t>(options));
    // Input is validated UTF-8 before it gets here, so utf8proc cannot fail but on out-of-memory.
    CHECK_MSG(len >= 0, utf8proc_errmsg(len));
    std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
    cur.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
  }
  return cur;
}

}  // namespace sparkserve
