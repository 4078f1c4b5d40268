// Options and helpers shared by the model-running subcommands (generate, logits, serve, bench).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/load_options.h"
#include "loader/load_progress.h"
#include "runtime/model_state.h"

namespace sparkserve::cli {

// State for one sequence of up to `positions` tokens (generate / logits): 16-token KV blocks, exactly
// as many as the sequence needs.
inline StateLimits one_sequence_limits(int64_t positions) {
  StateLimits limits;
  limits.max_sequences = 1;
  limits.block_size = 16;
  limits.num_kv_blocks = static_cast<int32_t>((positions + limits.block_size - 1) / limits.block_size);
  return limits;
}

// More worker threads than this is a typo, not a machine.
inline constexpr int kMaxThreads = 1024;
// Without max_position_embeddings in the config, sequences are capped here (KV cache sizing).
inline constexpr int64_t kDefaultMaxPositions = 1 << 20;

// "1,2,3" -> {1, 2, 3}; errors name the bad item. Ids are checked against the vocab later.
inline Expected<std::vector<int32_t>> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.size() > 10 || item.find_first_not_of("0123456789") != std::string::npos)
      return make_error("--prompt-ids: '" + item + "' is not a non-negative integer token id (expected e.g. 1,2,3)");
    long long v = std::stoll(item);
    if (v > 2147483647LL) return make_error("--prompt-ids: " + item + " is too large");
    ids.push_back(static_cast<int32_t>(v));
    start = comma + 1;
  }
  if (ids.empty()) return make_error("--prompt-ids: no token ids given");
  return ids;
}

// --load-buffer / --no-progress, on every command that loads a model (issue 4, item 5).
struct LoadCliOptions {
  std::string load_buffer = "4GiB";
  bool no_progress = false;
  // Owned here so the LoadOptions made below can point at it for the whole load.
  mutable std::unique_ptr<StreamLoadProgress> progress;
};

inline void add_load_options(CLI::App* cmd, LoadCliOptions& o) {
  cmd->add_option("--load-buffer", o.load_buffer,
                  "Host memory budget for streaming weights in (staging / conversion), e.g. 4GiB, 512MiB; "
                  "peak host memory stays under final weights + this")
      ->default_val("4GiB");
  cmd->add_flag("--no-progress", o.no_progress, "No loading progress line on stderr");
}

// The options for load_qwen35; the progress line goes to stderr (in place on a terminal).
inline Expected<LoadOptions> make_load_options(const LoadCliOptions& o) {
  SS_ASSIGN_OR_RETURN(uint64_t bytes, parse_load_buffer(o.load_buffer));
  LoadOptions lo;
  lo.buffer_bytes = bytes;
  if (!o.no_progress) {
    o.progress = std::make_unique<StreamLoadProgress>(stderr);
    lo.progress = o.progress.get();
  }
  return lo;
}

}  // namespace sparkserve::cli
