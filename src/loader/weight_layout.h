// The Qwen3.5 text model's tensor layout, written once: which checkpoint names, with which shapes
// and in which part order, make each field of ModelWeights. Two sources fill it: the checkpoint
// loader (loader/weights.cpp, tensors read from safetensors) and the synthetic model
// (loader/synth_weights.cpp, the same tensors generated in backend memory), so a synthetic model
// has exactly the structure a loaded one has.
//
// A Source provides:
//   find(name)                                -> truthy when the tensor exists
//   linear(name, out, in, allow_quantized)    -> Expected<Linear>, one [out, in] module
//   matrix(parts, shape)                      -> Expected<Linear>, parts concatenated along dim 0
//   vector_f32(part, device_shape = {})       -> Expected<Tensor>, a small f32 tensor
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/weights.h"

namespace sparkserve {

// One checkpoint tensor a weight is made of, with the shape config.json implies.
struct WeightPart {
  std::string name;
  std::vector<int64_t> shape;
};

// A quantized weight of `shape` ([N, K] or [E, N, K] for stacked experts) made of `parts` checkpoint
// parts concatenated along N, as both sources store it: codes [(E,) N, K/2] u8 (NVFP4) or [(E,) N, K]
// E4M3 (FP8); NVFP4 block scales [(E,) N, K/16] E4M3; FP8 row scales [(E,) N] f32.
struct QuantizedShape {
  bool nvfp4 = false;
  int64_t E = 1, N = 0, K = 0, parts = 0;
  QuantizedShape(WeightFormat fmt, const std::vector<int64_t>& shape, int64_t num_parts)
      : nvfp4(is_nvfp4(fmt)),
        E(shape.size() == 3 ? shape[0] : 1),
        N(shape[shape.size() - 2]),
        K(shape.back()),
        parts(num_parts),
        stacked(shape.size() == 3) {}
  // The parts tile the weight: each part is `part_rows` rows of every expert.
  bool tiles(int64_t part_rows) const { return parts % E == 0 && part_rows * (parts / E) == N; }
  int64_t code_cols() const { return nvfp4 ? K / 2 : K; }
  std::vector<int64_t> code_dims() const { return dims({N, code_cols()}); }
  std::vector<int64_t> block_scale_dims() const { return dims({N, K / 16}); }
  std::vector<int64_t> row_scale_dims() const { return dims({N}); }
  // The Linear's fields (tensors left empty for the source to fill).
  Linear linear(WeightFormat fmt, ActivationQuant activation) const {
    Linear lin;
    lin.format = fmt;
    lin.activation = activation;
    lin.out_features = N;
    lin.in_features = K;
    lin.partitions = parts / E;
    return lin;
  }

 private:
  bool stacked;
  std::vector<int64_t> dims(std::vector<int64_t> tail) const {
    if (stacked) tail.insert(tail.begin(), E);
    return tail;
  }
};

namespace weight_layout {

template <class Source>
Status gdn(Source& L, const ModelConfig& c, const std::string& P, GdnWeights& g) {
  const int64_t H = c.hidden_size, Hv = c.linear_num_value_heads, conv = c.gdn_conv_dim();
  const int64_t K = c.linear_conv_kernel_dim, dv = c.linear_value_head_dim, vdim = c.gdn_value_dim();
  SS_ASSIGN_OR_RETURN(g.in_proj_qkv, L.linear(P + "in_proj_qkv.weight", conv, H));
  SS_ASSIGN_OR_RETURN(g.in_proj_z, L.linear(P + "in_proj_z.weight", vdim, H));
  SS_ASSIGN_OR_RETURN(g.in_proj_b, L.linear(P + "in_proj_b.weight", Hv, H));
  SS_ASSIGN_OR_RETURN(g.in_proj_a, L.linear(P + "in_proj_a.weight", Hv, H));
  SS_ASSIGN_OR_RETURN(g.out_proj, L.linear(P + "out_proj.weight", H, vdim));
  SS_ASSIGN_OR_RETURN(g.conv, L.vector_f32({P + "conv1d.weight", {conv, 1, K}}, {conv, K}));
  SS_ASSIGN_OR_RETURN(g.A_log, L.vector_f32({P + "A_log", {Hv}}));
  SS_ASSIGN_OR_RETURN(g.dt_bias, L.vector_f32({P + "dt_bias", {Hv}}));
  SS_ASSIGN_OR_RETURN(g.norm, L.vector_f32({P + "norm.weight", {dv}}));
  return Status::Ok();
}

template <class Source>
Status attention(Source& L, const ModelConfig& c, const std::string& P, AttentionWeights& a) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
  SS_ASSIGN_OR_RETURN(a.q_proj, L.linear(P + "q_proj.weight", nh * hd * 2, H));
  SS_ASSIGN_OR_RETURN(a.k_proj, L.linear(P + "k_proj.weight", kvh * hd, H));
  SS_ASSIGN_OR_RETURN(a.v_proj, L.linear(P + "v_proj.weight", kvh * hd, H));
  SS_ASSIGN_OR_RETURN(a.o_proj, L.linear(P + "o_proj.weight", H, nh * hd));
  SS_ASSIGN_OR_RETURN(a.q_norm, L.vector_f32({P + "q_norm.weight", {hd}}));
  SS_ASSIGN_OR_RETURN(a.k_norm, L.vector_f32({P + "k_norm.weight", {hd}}));
  return Status::Ok();
}

// Experts fused ([E, 2I, H] gate_up_proj / [E, H, I] down_proj) or per expert (experts.{e}.*,
// gate then up rows of each expert stacked); per_expert says which was found.
template <class Source>
Status moe(Source& L, const ModelConfig& c, const std::string& P, MoeWeights& m, bool& per_expert) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  SS_ASSIGN_OR_RETURN(m.router, L.linear(P + "gate.weight", E, H));
  const bool has_expert0 = L.find(P + "experts.0.gate_proj.weight") || L.find(P + "experts.0.gate_proj.weight_packed");
  if (L.find(P + "experts.gate_up_proj") || !has_expert0) {
    SS_ASSIGN_OR_RETURN(m.experts_gate_up, L.matrix({{P + "experts.gate_up_proj", {E, 2 * I, H}}}, {E, 2 * I, H}));
    SS_ASSIGN_OR_RETURN(m.experts_down, L.matrix({{P + "experts.down_proj", {E, H, I}}}, {E, H, I}));
  } else {
    per_expert = true;
    std::vector<WeightPart> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      const std::string X = P + "experts." + std::to_string(e) + ".";
      gate_up.push_back({X + "gate_proj.weight", {I, H}});
      gate_up.push_back({X + "up_proj.weight", {I, H}});
      down.push_back({X + "down_proj.weight", {H, I}});
    }
    SS_ASSIGN_OR_RETURN(m.experts_gate_up, L.matrix(gate_up, {E, 2 * I, H}));
    SS_ASSIGN_OR_RETURN(m.experts_down, L.matrix(down, {E, H, I}));
  }
  SS_ASSIGN_OR_RETURN(m.shared_gate_up, L.matrix({{P + "shared_expert.gate_proj.weight", {Is, H}},
                                                  {P + "shared_expert.up_proj.weight", {Is, H}}},
                                                 {2 * Is, H}));
  SS_ASSIGN_OR_RETURN(m.shared_down, L.linear(P + "shared_expert.down_proj.weight", H, Is));
  SS_ASSIGN_OR_RETURN(m.shared_gate, L.linear(P + "shared_expert_gate.weight", 1, H));
  return Status::Ok();
}

template <class Source>
Status mlp(Source& L, const ModelConfig& c, const std::string& P, MlpWeights& m) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  SS_ASSIGN_OR_RETURN(m.gate_up, L.matrix({{P + "gate_proj.weight", {I, H}}, {P + "up_proj.weight", {I, H}}},
                                          {2 * I, H}));
  SS_ASSIGN_OR_RETURN(m.down, L.linear(P + "down_proj.weight", H, I));
  return Status::Ok();
}

// Embedding, every layer, final norm and lm_head (embed when tied) under `prefix`
// ("model.language_model." or "model."). c.layer_types must have num_hidden_layers entries.
template <class Source>
Status text_model(Source& L, const ModelConfig& c, const std::string& prefix, ModelWeights& w) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  SS_ASSIGN_OR_RETURN(w.embed, L.linear(prefix + "embed_tokens.weight", V, H, /*allow_quantized=*/false));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string P = prefix + "layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.type = c.layer_types[static_cast<size_t>(i)];
    SS_ASSIGN_OR_RETURN(lw.input_norm, L.vector_f32({P + "input_layernorm.weight", {H}}));
    SS_ASSIGN_OR_RETURN(lw.post_attention_norm, L.vector_f32({P + "post_attention_layernorm.weight", {H}}));
    if (lw.type == LayerType::kLinearAttention) {
      SS_RETURN_IF_ERROR(gdn(L, c, P + "linear_attn.", lw.gdn));
    } else {
      SS_RETURN_IF_ERROR(attention(L, c, P + "self_attn.", lw.attn));
    }
    if (c.is_moe) {
      SS_RETURN_IF_ERROR(moe(L, c, P + "mlp.", lw.moe, w.report.per_expert_layout));
    } else {
      SS_RETURN_IF_ERROR(mlp(L, c, P + "mlp.", lw.mlp));
    }
    w.layers.push_back(std::move(lw));
  }
  SS_ASSIGN_OR_RETURN(w.final_norm, L.vector_f32({prefix + "norm.weight", {H}}));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    SS_ASSIGN_OR_RETURN(w.lm_head, L.linear("lm_head.weight", V, H));
  }
  return Status::Ok();
}

// The multi-token-prediction layer under `mtp.` (model-qwen35.md §3, MTP table): one full-attention
// decoder layer (MoE or dense MLP as the text model's layers), routed experts fused or per expert.
template <class Source>
Status mtp(Source& L, const ModelConfig& c, MtpWeights& m) {
  const int64_t H = c.hidden_size;
  if (c.mtp_num_hidden_layers != 1)
    return make_error("config.json: mtp_num_hidden_layers is " + std::to_string(c.mtp_num_hidden_layers) +
                      "; speculative decoding supports checkpoints with exactly one MTP layer");
  SS_ASSIGN_OR_RETURN(m.fc, L.linear("mtp.fc.weight", H, 2 * H));
  SS_ASSIGN_OR_RETURN(m.pre_fc_norm_embedding, L.vector_f32({"mtp.pre_fc_norm_embedding.weight", {H}}));
  SS_ASSIGN_OR_RETURN(m.pre_fc_norm_hidden, L.vector_f32({"mtp.pre_fc_norm_hidden.weight", {H}}));
  const std::string P = "mtp.layers.0.";
  LayerWeights& lw = m.layer;
  lw.type = LayerType::kFullAttention;
  SS_ASSIGN_OR_RETURN(lw.input_norm, L.vector_f32({P + "input_layernorm.weight", {H}}));
  SS_ASSIGN_OR_RETURN(lw.post_attention_norm, L.vector_f32({P + "post_attention_layernorm.weight", {H}}));
  SS_RETURN_IF_ERROR(attention(L, c, P + "self_attn.", lw.attn));
  if (c.is_moe) {
    bool per_expert = false;
    SS_RETURN_IF_ERROR(moe(L, c, P + "mlp.", lw.moe, per_expert));
  } else {
    SS_RETURN_IF_ERROR(mlp(L, c, P + "mlp.", lw.mlp));
  }
  SS_ASSIGN_OR_RETURN(m.norm, L.vector_f32({"mtp.norm.weight", {H}}));
  m.present = true;
  return Status::Ok();
}

}  // namespace weight_layout
}  // namespace sparkserve
