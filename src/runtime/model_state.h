// All per-sequence state storage of a Qwen3.5 model: the paged KV cache of the full-attention
// layers and the GDN state rows of the linear-attention layers (live slots, then prefix-cache
// snapshots), with the copies between them that the engine's model runner issues. Storage only:
// block and row accounting belongs to the engine's scheduler (or DirectState).
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "loader/hf_config.h"
#include "model/forward_batch.h"
#include "model/qwen35.h"
#include "runtime/gdn_slots.h"
#include "runtime/kv_blocks.h"

namespace sparkserve {

struct StateLimits {
  int32_t max_sequences = 1;  // live GDN slots
  int32_t num_kv_blocks = 64;
  int64_t block_size = 16;
  int32_t num_snapshots = 0;  // GDN state rows kept for the prefix cache
  DType kv_dtype = DType::kF32;  // KvPool: kF32, kBF16 or kF8E4M3
  bool mtp = false;              // a KV pool for the multi-token-prediction layer too (speculative decoding)
  // The GDN recurrent state's storage, kF32 or kBF16 (GdnSlots; the conv windows stay f32).
  DType gdn_state_dtype = DType::kF32;
};

// Bytes of one sequence's GDN state (every linear-attention layer's conv window, f32, and recurrent
// state in `recurrent_dtype`): what one live slot or prefix-cache snapshot costs.
int64_t gdn_state_bytes(const ModelConfig& config, DType recurrent_dtype = DType::kF32);

class ModelState {
 public:
  ModelState(Backend& backend, const ModelConfig& config, const StateLimits& limits);

  Backend& backend() { return *backend_; }
  KvCache& kv() { return kv_; }
  GdnSlots& gdn() { return gdn_; }
  const StateLimits& limits() const { return limits_; }
  // What the model's forward reads and writes.
  const StatePools& pools() const { return pools_; }

 private:
  Backend* backend_;
  StateLimits limits_;
  KvCache kv_;
  GdnSlots gdn_;
  StatePools pools_;
};

}  // namespace sparkserve
