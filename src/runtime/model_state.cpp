#include "runtime/model_state.h"

namespace sparkserve {

GdnDims gdn_dims(const ModelConfig& c) {
  GdnDims d;
  d.num_k_heads = c.linear_num_key_heads;
  d.num_v_heads = c.linear_num_value_heads;
  d.k_head_dim = c.linear_key_head_dim;
  d.v_head_dim = c.linear_value_head_dim;
  d.conv_kernel = c.linear_conv_kernel_dim;
  return d;
}

int count_layers(const ModelConfig& c, LayerType type) {
  int n = 0;
  for (LayerType t : c.layer_types) n += t == type;
  return n;
}

ModelState::ModelState(Backend& backend, const ModelConfig& c, const StateLimits& limits)
    : kv_(backend, count_layers(c, LayerType::kFullAttention), limits.num_kv_blocks, limits.block_size,
          c.num_key_value_heads, c.head_dim),
      gdn_(backend, count_layers(c, LayerType::kLinearAttention), limits.max_sequences, gdn_dims(c)) {}

Expected<SequenceState> ModelState::open_sequence() {
  SequenceState s;
  SS_ASSIGN_OR_RETURN(s.gdn_slot, gdn_.acquire());
  return s;
}

void ModelState::close_sequence(SequenceState& seq) {
  if (seq.gdn_slot >= 0) gdn_.release(seq.gdn_slot);
  seq.gdn_slot = -1;
  kv_.release(seq.block_table);
  seq.num_tokens = 0;
}

}  // namespace sparkserve
