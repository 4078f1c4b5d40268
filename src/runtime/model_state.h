// All per-sequence state of a Qwen3.5 model: the paged KV cache of the full-attention layers and
// the GDN slots of the linear-attention layers, plus the bookkeeping of one sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "runtime/gdn_slots.h"
#include "runtime/kv_blocks.h"

namespace sparkserve {

// One sequence's handle on the state pools.
struct SequenceState {
  int32_t gdn_slot = -1;
  std::vector<int32_t> block_table;  // KV blocks, in position order
  int64_t num_tokens = 0;            // tokens already processed (the next token's KV slot)
  // M-RoPE: a token after a prompt's images sits at rotary position index + rope_delta
  // (transformers' rope_deltas; 0 for text-only sequences). Set by the forward that sees the images.
  int64_t rope_delta = 0;
};

struct StateLimits {
  int32_t max_sequences = 1;
  int32_t num_kv_blocks = 64;
  int64_t block_size = 16;
};

class ModelState {
 public:
  ModelState(Backend& backend, const ModelConfig& config, const StateLimits& limits);

  // A fresh sequence (zeroed GDN slot, no KV blocks); error when no slot is free.
  Expected<SequenceState> open_sequence();
  // Returns the sequence's slot and blocks.
  void close_sequence(SequenceState& seq);

  KvCache& kv() { return kv_; }
  GdnSlots& gdn() { return gdn_; }

 private:
  KvCache kv_;
  GdnSlots gdn_;
};

GdnDims gdn_dims(const ModelConfig& c);
int count_layers(const ModelConfig& c, LayerType type);

}  // namespace sparkserve
