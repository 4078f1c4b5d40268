// Options and helpers shared by the model-running subcommands (generate, logits).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
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

}  // namespace sparkserve::cli
