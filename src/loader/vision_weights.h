// The vision tower's weights (model.visual.*, model-qwen35.md §5.2) and their checkpoint layout,
// for any weight Source of loader/weight_layout.h (the checkpoint loader, the synthetic model).
// Matrices stay as stored (BF16 / F32); norms and biases become f32.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/vision_config.h"

namespace sparkserve {

struct VisionBlockWeights {
  Tensor norm1_w, norm1_b, norm2_w, norm2_b;  // [h] f32
  Linear q, k, v;                             // [h, h]: row blocks of attn.qkv ([3h, h])
  Tensor q_b, k_b, v_b;                       // [h] f32: blocks of attn.qkv.bias
  Linear proj;                                // [h, h]
  Tensor proj_b;                              // [h]
  Linear fc1;                                 // [I, h]
  Tensor fc1_b;                               // [I]
  Linear fc2;                                 // [h, I]
  Tensor fc2_b;                               // [h]
};

struct VisionWeights {
  bool present = false;
  Linear patch_embed;  // [h, 3*Tp*P*P]: the Conv3d kernel (stride = kernel) as a matrix
  Tensor patch_b;      // [h]
  Linear pos_embed;    // [num_position_embeddings, h]
  std::vector<VisionBlockWeights> blocks;
  Tensor merger_norm_w, merger_norm_b;  // [h]
  Linear merger_fc1;                    // [4h, 4h]
  Tensor merger_fc1_b;                  // [4h]
  Linear merger_fc2;                    // [out_hidden, 4h]
  Tensor merger_fc2_b;                  // [out_hidden]
};

// Rows [begin, begin + n) of a [out, in] matrix weight, as a Linear viewing the same storage.
inline Linear linear_rows(const Linear& w, int64_t begin, int64_t n) {
  Linear r = w;
  r.weight = w.weight.rows(begin, n);
  r.out_features = n;
  return r;
}

namespace weight_layout {

// `prefix` is "model.visual." (ConditionalGeneration checkpoints) or "visual.".
template <class Source>
Status vision(Source& L, const VisionConfig& c, const std::string& prefix, VisionWeights& w) {
  const int64_t h = c.hidden_size, I = c.intermediate_size, m = int64_t{h} * c.merge_unit();
  const std::string V = prefix;
  SS_ASSIGN_OR_RETURN(w.patch_embed,
                      L.matrix({{V + "patch_embed.proj.weight",
                                 {h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}}},
                               {h, c.patch_dim()}, /*allow_quantized=*/false));
  SS_ASSIGN_OR_RETURN(w.patch_b, L.vector_f32({V + "patch_embed.proj.bias", {h}}));
  SS_ASSIGN_OR_RETURN(w.pos_embed, L.linear(V + "pos_embed.weight", c.num_position_embeddings, h, false));
  for (int j = 0; j < c.depth; ++j) {
    const std::string B = V + "blocks." + std::to_string(j) + ".";
    VisionBlockWeights b;
    SS_ASSIGN_OR_RETURN(b.norm1_w, L.vector_f32({B + "norm1.weight", {h}}));
    SS_ASSIGN_OR_RETURN(b.norm1_b, L.vector_f32({B + "norm1.bias", {h}}));
    SS_ASSIGN_OR_RETURN(b.norm2_w, L.vector_f32({B + "norm2.weight", {h}}));
    SS_ASSIGN_OR_RETURN(b.norm2_b, L.vector_f32({B + "norm2.bias", {h}}));
    SS_ASSIGN_OR_RETURN(Linear qkv, L.linear(B + "attn.qkv.weight", 3 * h, h, false));
    SS_ASSIGN_OR_RETURN(Tensor qkv_b, L.vector_f32({B + "attn.qkv.bias", {3 * h}}));
    b.q = linear_rows(qkv, 0, h);
    b.k = linear_rows(qkv, h, h);
    b.v = linear_rows(qkv, 2 * h, h);
    b.q_b = qkv_b.rows(0, h);
    b.k_b = qkv_b.rows(h, h);
    b.v_b = qkv_b.rows(2 * h, h);
    SS_ASSIGN_OR_RETURN(b.proj, L.linear(B + "attn.proj.weight", h, h, false));
    SS_ASSIGN_OR_RETURN(b.proj_b, L.vector_f32({B + "attn.proj.bias", {h}}));
    SS_ASSIGN_OR_RETURN(b.fc1, L.linear(B + "mlp.linear_fc1.weight", I, h, false));
    SS_ASSIGN_OR_RETURN(b.fc1_b, L.vector_f32({B + "mlp.linear_fc1.bias", {I}}));
    SS_ASSIGN_OR_RETURN(b.fc2, L.linear(B + "mlp.linear_fc2.weight", h, I, false));
    SS_ASSIGN_OR_RETURN(b.fc2_b, L.vector_f32({B + "mlp.linear_fc2.bias", {h}}));
    w.blocks.push_back(std::move(b));
  }
  SS_ASSIGN_OR_RETURN(w.merger_norm_w, L.vector_f32({V + "merger.norm.weight", {h}}));
  SS_ASSIGN_OR_RETURN(w.merger_norm_b, L.vector_f32({V + "merger.norm.bias", {h}}));
  SS_ASSIGN_OR_RETURN(w.merger_fc1, L.linear(V + "merger.linear_fc1.weight", m, m, false));
  SS_ASSIGN_OR_RETURN(w.merger_fc1_b, L.vector_f32({V + "merger.linear_fc1.bias", {m}}));
  SS_ASSIGN_OR_RETURN(w.merger_fc2, L.linear(V + "merger.linear_fc2.weight", c.out_hidden_size, m, false));
  SS_ASSIGN_OR_RETURN(w.merger_fc2_b, L.vector_f32({V + "merger.linear_fc2.bias", {c.out_hidden_size}}));
  w.present = true;
  return Status::Ok();
}

}  // namespace weight_layout
}  // namespace sparkserve
