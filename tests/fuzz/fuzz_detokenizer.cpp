// libFuzzer entry point for the streaming detokenizer. Input: [n_stop][flags] then n_stop stop
// strings (length byte + bytes, taken from a small alphabet so they occur), then token ids (one
// byte each) over a fixed vocabulary of byte fragments that split UTF-8 characters. Checks:
// every emitted piece is valid UTF-8; the pieces add up to the one-shot decode of all bytes
// (errors="replace"), cut at the first stop string to complete when one does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "text/detokenizer.h"

namespace {

using namespace sparkserve;

const std::vector<std::string>& vocab() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    // 0..63: pieces that split and join characters, including invalid bytes.
    const char* pieces[] = {"a", "b", "c", "ab", "bc", "abc", " ", "\n", "\xC3", "\xA9", "\xC3\xA9", "\xF0\x9F",
                            "\x98", "\x80", "\xF0\x9F\x98\x80", "\xE2\x82", "\xAC", "\xE2\x82\xAC", "\xFF",
                            "\xC0", "\xED\xA0", "\xF4\x90", "\xE0", "\xA0", "<|im_end|>", "STOP", "ST", "OP",
                            "\xE6\x97\xA5", "\xE6", "\x97\xA5", "x\xC3"};
    for (const char* p : pieces) out.emplace_back(p);
    while (out.size() < 256) out.emplace_back(1, static_cast<char>(out.size()));
    return out;
  }();
  return v;
}

bool valid_utf8(const std::string& s) {
  std::string rest;
  return decode_utf8_replace(s, false, &rest) == s && rest.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t i = 0;
  const size_t n_stop = data[i++] % 4;
  const uint8_t flags = data[i++];
  DetokenizerOptions opts;
  opts.include_stop_str_in_output = flags & 1;
  opts.skip_special_tokens = flags & 2;
  for (size_t s = 0; s < n_stop && i < size; ++s) {
    size_t len = data[i++] % 6;
    std::string stop;
    for (size_t k = 0; k < len && i < size; ++k) stop += vocab()[data[i++] % 32];
    opts.stop.push_back(stop);
  }
  auto is_special = [](int id) { return id == 24; };
  StreamingDetokenizer d([](int id) { return vocab()[static_cast<size_t>(id)]; }, is_special, opts);

  std::string all_bytes, emitted;
  bool stopped = false;
  for (; i < size && !stopped; ++i) {
    int id = data[i];
    if (!(opts.skip_special_tokens && is_special(id))) all_bytes += vocab()[static_cast<size_t>(id)];
    DetokenizerStep step = d.push(id);
    if (!valid_utf8(step.text)) __builtin_trap();
    emitted += step.text;
    stopped = step.stopped;
  }
  if (!stopped) {
    // finish() may still stop: its U+FFFD can complete a stop string that holds one.
    DetokenizerStep step = d.finish();
    if (!valid_utf8(step.text)) __builtin_trap();
    emitted += step.text;
    stopped = step.stopped;
  }
  if (emitted != d.text()) __builtin_trap();

  // One-shot reference: decode everything, cut at the stop string that completes first.
  std::string full = decode_utf8_replace(all_bytes, true);
  size_t best = std::string::npos, best_end = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& raw : opts.stop) {
    const std::string s = decode_utf8_replace(raw, true);  // as the detokenizer treats stop strings
    if (s.empty()) continue;
    size_t p = full.find(s);
    if (p == std::string::npos) continue;
    if (!best_stop || p + s.size() < best_end || (p + s.size() == best_end && p < best)) {
      best = p;
      best_end = p + s.size();
      best_stop = &raw;
    }
  }
  // Streaming stops exactly when the whole text holds a stop string, and at the same place.
  if (stopped != (best_stop != nullptr)) __builtin_trap();
  std::string expect = best_stop ? full.substr(0, opts.include_stop_str_in_output ? best_end : best) : full;
  if (emitted != expect) __builtin_trap();
  return 0;
}
