// How weights are streamed from the checkpoint into backend memory (issue 4, item 5).
//
// Tensors are read with pread into one reused staging buffer of at most `buffer_bytes` and handed to
// the backend piece by piece (a tensor larger than the buffer is streamed in pieces), so host memory
// above the final weights stays under the budget however large the checkpoint. The ranges read are
// dropped from the page cache (posix_fadvise DONTNEED): on unified-memory machines (DGX Spark) the
// cached checkpoint would otherwise double the memory a load takes.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace sparkserve {

class LoadProgress;

inline constexpr uint64_t kDefaultLoadBuffer = 4ull << 30;   // 4 GiB
// Below this the per-piece overhead (one pread + one upload per piece) dominates, and a typo such
// as "--load-buffer 4" (bytes) is far more likely than intent.
inline constexpr uint64_t kMinLoadBuffer = 64ull << 10;      // 64 KiB
inline constexpr uint64_t kMaxLoadBuffer = 1ull << 50;       // 1 PiB: anything larger is a typo
// The staging buffer never grows past this even under a larger budget: pieces of 64 MiB already
// read at disk speed, and a smaller buffer leaves the rest of the budget unused (never over it).
inline constexpr uint64_t kMaxStagingBytes = 64ull << 20;

struct LoadOptions {
  uint64_t buffer_bytes = kDefaultLoadBuffer;  // host staging budget (conversion / upload pieces)
  bool drop_page_cache = true;                 // posix_fadvise(DONTNEED) on every range read
  LoadProgress* progress = nullptr;            // optional: told the total, then every piece read
  // Load the multi-token-prediction layer (mtp.*) for speculative decoding; an error when the
  // checkpoint has none. Off: its tensors are reported as unused.
  bool load_mtp = false;
};

// "4GiB", "512MiB", "1.5GB", "65536", "64k" -> bytes. Units: B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
// T/TB/TiB (K, M, G, T and the *iB forms are powers of 1024, KB/MB/GB/TB powers of 1000),
// case-insensitive. `what` names the option in messages.
Expected<uint64_t> parse_byte_size(const std::string& text, const std::string& what);

// parse_byte_size plus the [kMinLoadBuffer, kMaxLoadBuffer] range check, with a message that names
// the option and the limit.
Expected<uint64_t> parse_load_buffer(const std::string& text, const std::string& what = "--load-buffer");

// "4.00 GiB", "1.00 MiB", "512 B": for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace sparkserve
