// The progress line printed while weights load (bytes loaded / total, rate, ETA). On a terminal it is
// rewritten in place at most 4 times a second; elsewhere (a log, a test's pipe) a plain line is
// printed at each quarter and one at the end, so logs stay short.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sparkserve {

// What the loader tells (see LoadOptions::progress).
class LoadProgress {
 public:
  virtual ~LoadProgress() = default;
  // Bytes the load expects to read (every tensor of the text model; unused tensors are not read,
  // so a load may finish below it).
  virtual void start(uint64_t total_bytes) = 0;
  virtual void advance(uint64_t bytes) = 0;
  // ok = false: the load failed (the in-place line is ended, no summary is printed).
  virtual void finish(bool ok) = 0;
};

// "loading weights: 12.3/45.6 MB (27%), 812.0 MB/s, ETA 4 s" (MB = 10^6 bytes; rate and ETA "?" until
// measurable). Parsed by tests/python/test_load_streaming.py: keep the shape.
std::string format_load_progress(uint64_t done, uint64_t total, double seconds);
// "loaded weights: 45.6 MB in 0.6 s (812.0 MB/s)".
std::string format_load_done(uint64_t done, double seconds);

class StreamLoadProgress : public LoadProgress {
 public:
  enum class Mode { kAuto, kInPlace, kLines };
  // kAuto: in place when `out` is a terminal, lines otherwise.
  explicit StreamLoadProgress(std::FILE* out, Mode mode = Mode::kAuto);
  void start(uint64_t total_bytes) override;
  void advance(uint64_t bytes) override;
  void finish(bool ok) override;
  uint64_t done() const { return done_; }

 private:
  double seconds() const;
  std::FILE* out_;
  bool in_place_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  int quarters_printed_ = 0;
  std::chrono::steady_clock::time_point start_;
  double last_print_ = -1.0;
  bool finished_ = false;
};

}  // namespace sparkserve
