#include "loader/load_progress.h"

#include <unistd.h>

#include <algorithm>

namespace sparkserve {

namespace {
constexpr double kMB = 1e6;
constexpr double kInPlaceInterval = 0.25;  // seconds between in-place updates
}  // namespace

std::string format_load_progress(uint64_t done, uint64_t total, double seconds) {
  const double pct = total == 0 ? 100.0 : std::min(100.0, 100.0 * static_cast<double>(done) / static_cast<double>(total));
  char buf[160];
  if (seconds > 0.05 && done > 0) {
    const double rate = static_cast<double>(done) / seconds;
    const double left = total > done ? static_cast<double>(total - done) / rate : 0.0;
    std::snprintf(buf, sizeof(buf), "loading weights: %.1f/%.1f MB (%.0f%%), %.1f MB/s, ETA %.0f s",
                  static_cast<double>(done) / kMB, static_cast<double>(total) / kMB, pct, rate / kMB, left);
  } else {
    std::snprintf(buf, sizeof(buf), "loading weights: %.1f/%.1f MB (%.0f%%), ? MB/s, ETA ? s",
                  static_cast<double>(done) / kMB, static_cast<double>(total) / kMB, pct);
  }
  return buf;
}

std::string format_load_done(uint64_t done, double seconds) {
  char buf[128];
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds / kMB : 0.0;
  std::snprintf(buf, sizeof(buf), "loaded weights: %.1f MB in %.1f s (%.1f MB/s)", static_cast<double>(done) / kMB,
                seconds, rate);
  return buf;
}

StreamLoadProgress::StreamLoadProgress(std::FILE* out, Mode mode) : out_(out) {
  in_place_ = mode == Mode::kInPlace || (mode == Mode::kAuto && ::isatty(::fileno(out)) == 1);
}

double StreamLoadProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void StreamLoadProgress::start(uint64_t total_bytes) {
  total_ = total_bytes;
  done_ = 0;
  quarters_printed_ = 0;
  finished_ = false;
  start_ = std::chrono::steady_clock::now();
  last_print_ = -1.0;
}

void StreamLoadProgress::advance(uint64_t bytes) {
  done_ += bytes;
  const double t = seconds();
  if (in_place_) {
    if (t - last_print_ < kInPlaceInterval) return;
    last_print_ = t;
    std::fprintf(out_, "\r%s\033[K", format_load_progress(done_, total_, t).c_str());
    std::fflush(out_);
    return;
  }
  // One line per quarter crossed (25, 50, 75 %); the end has its own line.
  const int quarter = total_ == 0 ? 4 : static_cast<int>(std::min<uint64_t>(4, done_ * 4 / total_));
  if (quarter > quarters_printed_ && quarter < 4) {
    quarters_printed_ = quarter;
    std::fprintf(out_, "%s\n", format_load_progress(done_, total_, t).c_str());
    std::fflush(out_);
  }
}

void StreamLoadProgress::finish(bool ok) {
  if (finished_) return;
  finished_ = true;
  if (!ok) {
    if (in_place_ && last_print_ >= 0) std::fprintf(out_, "\n");
    std::fflush(out_);
    return;
  }
  const std::string line = format_load_done(done_, seconds());
  if (in_place_) std::fprintf(out_, "\r%s\033[K\n", line.c_str());
  else std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

}  // namespace sparkserve
