#include "text/detokenizer.h"

#include <algorithm>

namespace sparkserve {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The number of bytes of the well-formed sequence starting at lead byte b (0 when b cannot start
// one), and the allowed range of the second byte (Unicode Table 3-7).
struct LeadInfo {
  int length;
  unsigned char lo, hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

std::string decode_utf8_replace(const std::string& bytes, bool final, std::string* rest) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    unsigned char b = static_cast<unsigned char>(bytes[i]);
    LeadInfo li = lead_info(b);
    if (li.length == 1) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    if (li.length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Count how many bytes of the sequence are valid (the maximal subpart).
    size_t k = 1;
    while (k < static_cast<size_t>(li.length) && i + k < n) {
      unsigned char c = static_cast<unsigned char>(bytes[i + k]);
      bool ok = k == 1 ? (c >= li.lo && c <= li.hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == static_cast<size_t>(li.length)) {
      out.append(bytes, i, k);
      i += k;
    } else if (i + k == n && !final) {
      if (rest) *rest = bytes.substr(i);
      return out;
    } else {
      out += kReplacement;
      i += k;
    }
  }
  if (rest) rest->clear();
  return out;
}

StreamingDetokenizer::StreamingDetokenizer(TokenBytes token_bytes, IsSpecial is_special,
                                           DetokenizerOptions options)
    : token_bytes_(std::move(token_bytes)), is_special_(std::move(is_special)), options_(std::move(options)) {
  // Stop strings are matched against decoded text, so they are decoded the same way: with valid
  // UTF-8 on both sides a match can only start and end on character boundaries, and the text
  // emitted around it stays valid UTF-8 (a request's JSON strings are valid already).
  for (auto& s : options_.stop) s = decode_utf8_replace(s, true);
  options_.stop.erase(std::remove(options_.stop.begin(), options_.stop.end(), std::string()),
                      options_.stop.end());
}

DetokenizerStep StreamingDetokenizer::push(int token_id) {
  if (stopped_ || finished_) return {};
  if (options_.skip_special_tokens && is_special_ && is_special_(token_id)) return {};
  std::string rest;
  std::string text = decode_utf8_replace(pending_bytes_ + token_bytes_(token_id), false, &rest);
  pending_bytes_ = std::move(rest);
  return add_text(std::move(text), false);
}

DetokenizerStep StreamingDetokenizer::finish() {
  if (stopped_ || finished_) return {};
  std::string text = decode_utf8_replace(pending_bytes_, true);
  pending_bytes_.clear();
  DetokenizerStep step = add_text(std::move(text), true);
  finished_ = true;
  return step;
}

DetokenizerStep StreamingDetokenizer::add_text(std::string text, bool at_end) {
  DetokenizerStep step;
  held_ += text;
  // The stop string that completed first (smallest end; on a tie the earlier start): what a
  // token-by-token check would have caught, so the result does not depend on how many
  // characters one token carries. Emitted text never holds a complete stop string, and a match
  // reaching back into emitted text would have kept its start held.
  size_t best = std::string::npos, best_end = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& s : options_.stop) {
    size_t p = held_.find(s);
    if (p == std::string::npos) continue;
    size_t end = p + s.size();
    if (best_stop == nullptr || end < best_end || (end == best_end && p < best)) {
      best = p;
      best_end = end;
      best_stop = &s;
    }
  }
  if (best_stop) {
    size_t end = best + (options_.include_stop_str_in_output ? best_stop->size() : 0);
    step.text = held_.substr(0, end);
    step.stopped = true;
    step.stop_string = *best_stop;
    stopped_ = true;
    pending_bytes_.clear();
    held_.clear();
    emitted_ += step.text;
    return step;
  }
  size_t hold = 0;
  if (!at_end) {
    for (const auto& s : options_.stop) {
      size_t max = std::min(held_.size(), s.size() - 1);
      for (size_t len = max; len > hold; --len) {
        if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
  }
  step.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  emitted_ += step.text;
  return step;
}

}  // namespace sparkserve
