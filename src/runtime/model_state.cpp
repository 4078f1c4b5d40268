#include "runtime/model_state.h"

namespace sparkserve {

int64_t gdn_state_bytes(const ModelConfig& c, DType recurrent_dtype) {
  const GdnDims d = gdn_dims(c);
  const int64_t per_layer = 4 * d.conv_dim() * (d.conv_kernel - 1) +
                            static_cast<int64_t>(dtype_size(recurrent_dtype)) * d.num_v_heads * d.k_head_dim * d.v_head_dim;
  return per_layer * count_layers(c, LayerType::kLinearAttention);
}

ModelState::ModelState(Backend& backend, const ModelConfig& c, const StateLimits& limits)
    : backend_(&backend),
      limits_(limits),
      kv_(backend, count_layers(c, LayerType::kFullAttention) + (limits.mtp ? 1 : 0), limits.num_kv_blocks,
          limits.block_size, c.num_key_value_heads, c.head_dim, limits.kv_dtype),
      gdn_(backend, count_layers(c, LayerType::kLinearAttention), limits.max_sequences, limits.num_snapshots,
           gdn_dims(c), limits.gdn_state_dtype) {
  pools_.block_size = limits.block_size;
  pools_.num_slots = limits.max_sequences;
  // The MTP layer's pool is the last one, so a block copy (prefix cache copy-on-write) carries it.
  const int attn_layers = kv_.num_layers() - (limits.mtp ? 1 : 0);
  for (int l = 0; l < attn_layers; ++l) pools_.kv.push_back(kv_.pool(l));
  if (limits.mtp) pools_.mtp_kv = kv_.pool(attn_layers);
  for (int l = 0; l < gdn_.num_layers(); ++l) {
    pools_.conv.push_back(gdn_.conv_pool(l));
    pools_.recurrent.push_back(gdn_.recurrent_pool(l));
  }
}

}  // namespace sparkserve
