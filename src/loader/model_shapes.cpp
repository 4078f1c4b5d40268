#include "loader/model_shapes.h"

namespace sparkserve {

namespace {

void set_layer_types(ModelLike& m) {
  m.text.layer_types.clear();
  for (int i = 0; i < m.text.num_hidden_layers; ++i)
    m.text.layer_types.push_back((i + 1) % m.full_attention_interval == 0 ? LayerType::kFullAttention
                                                                          : LayerType::kLinearAttention);
}

// Fields shared by every Qwen3.5 MoE model (model-qwen35.md §1.1 / §1.3).
ModelLike qwen35_moe_common() {
  ModelLike m;
  ModelConfig& c = m.text;
  c.model_type = "qwen3_5_moe";
  c.architecture = "Qwen3_5MoeForConditionalGeneration";
  c.is_moe = true;
  c.nested_text_config = true;
  c.rms_norm_eps = 1e-6f;
  c.tie_word_embeddings = false;
  c.attn_output_gate = true;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25f;
  c.mrope_section = {11, 11, 10};
  c.mrope_interleaved = true;
  c.max_position_embeddings = 262144;
  c.linear_conv_kernel_dim = 4;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.num_experts = 256;
  c.num_experts_per_tok = 8;
  c.mtp_num_hidden_layers = 1;
  c.eos_token_ids = {248044};
  c.vocab_size = 248320;
  c.head_dim = 256;
  m.vision = VisionShape{27, 1152, 16, 4304, 0, 3, 16, 2, 2, 2304};
  return m;
}

ModelLike qwen35_122b() {
  ModelLike m = qwen35_moe_common();
  m.name = "qwen3.5-122b-a10b";
  ModelConfig& c = m.text;
  c.hidden_size = 3072;
  c.num_hidden_layers = 48;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 2;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 64;
  c.moe_intermediate_size = 1024;
  c.shared_expert_intermediate_size = 1024;
  m.vision.out_hidden_size = 3072;
  set_layer_types(m);
  return m;
}

ModelLike qwen35_35b() {
  ModelLike m = qwen35_moe_common();
  m.name = "qwen3.5-35b-a3b";
  ModelConfig& c = m.text;
  c.hidden_size = 2048;
  c.num_hidden_layers = 40;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 2;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  m.vision.out_hidden_size = 2048;
  set_layer_types(m);
  return m;
}

// Our own small model with the same structure: every K a multiple of 16 (NVFP4 blocks), 3 GDN + 1
// full-attention layer, 8 experts top-2, a 2-block ViT. Not a published model.
ModelLike tiny() {
  ModelLike m = qwen35_moe_common();
  m.name = "tiny";
  ModelConfig& c = m.text;
  c.hidden_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.mrope_section = {2, 1, 1};  // rotary dim 8 = 4 frequencies
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 32;
  c.linear_value_head_dim = 32;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 64;
  c.shared_expert_intermediate_size = 64;
  c.vocab_size = 1024;
  c.max_position_embeddings = 4096;
  c.eos_token_ids = {1};
  m.vision = VisionShape{2, 64, 2, 128, 128, 3, 16, 2, 2, 64};
  set_layer_types(m);
  return m;
}

std::string layer_prefix(int i) { return "model.language_model.layers." + std::to_string(i) + "."; }

struct ParamList {
  std::vector<ParamShape>* out;
  bool mtp = false;
  void linear(const std::string& module, int64_t n, int64_t k) {
    out->push_back({module + ".weight", module, ParamKind::kLinear, {n, k}, DType::kBF16, mtp});
  }
  void linear_bias(const std::string& module, int64_t n, int64_t k) {
    linear(module, n, k);
    out->push_back({module + ".bias", module, ParamKind::kOther, {n}, DType::kBF16, mtp});
  }
  void weight(const std::string& module, std::vector<int64_t> shape, ParamKind kind = ParamKind::kOther) {
    out->push_back({module + ".weight", module, kind, std::move(shape), DType::kBF16, mtp});
  }
  void bare(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kBF16) {
    out->push_back({name, name, ParamKind::kOther, std::move(shape), dtype, mtp});
  }
  void fused(const std::string& name, int64_t e, int64_t n, int64_t k) {
    out->push_back({name, name, ParamKind::kFusedExperts, {e, n, k}, DType::kBF16, mtp});
  }
};

void attention_params(ParamList& p, const ModelConfig& c, const std::string& P) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  p.linear(P + "self_attn.q_proj", int64_t{c.num_attention_heads} * hd * 2, H);  // query + gate rows
  p.linear(P + "self_attn.k_proj", int64_t{c.num_key_value_heads} * hd, H);
  p.linear(P + "self_attn.v_proj", int64_t{c.num_key_value_heads} * hd, H);
  p.linear(P + "self_attn.o_proj", H, int64_t{c.num_attention_heads} * hd);
  p.weight(P + "self_attn.q_norm", {hd});
  p.weight(P + "self_attn.k_norm", {hd});
}

void moe_params(ParamList& p, const ModelConfig& c, const std::string& P, bool per_expert) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  const int64_t Is = c.shared_expert_intermediate_size;
  p.linear(P + "mlp.gate", E, H);
  if (per_expert) {
    for (int64_t e = 0; e < E; ++e) {
      std::string X = P + "mlp.experts." + std::to_string(e) + ".";
      p.linear(X + "gate_proj", I, H);
      p.linear(X + "up_proj", I, H);
      p.linear(X + "down_proj", H, I);
    }
  } else {
    p.fused(P + "mlp.experts.gate_up_proj", E, 2 * I, H);  // rows [0,I) gate, [I,2I) up
    p.fused(P + "mlp.experts.down_proj", E, H, I);
  }
  p.linear(P + "mlp.shared_expert.gate_proj", Is, H);
  p.linear(P + "mlp.shared_expert.up_proj", Is, H);
  p.linear(P + "mlp.shared_expert.down_proj", H, Is);
  p.linear(P + "mlp.shared_expert_gate", 1, H);
}

void gdn_params(ParamList& p, const ModelConfig& c, const std::string& P) {
  const int64_t H = c.hidden_size, Hv = c.linear_num_value_heads;
  p.linear(P + "linear_attn.in_proj_qkv", c.gdn_conv_dim(), H);
  p.linear(P + "linear_attn.in_proj_z", c.gdn_value_dim(), H);
  p.linear(P + "linear_attn.in_proj_b", Hv, H);
  p.linear(P + "linear_attn.in_proj_a", Hv, H);
  p.weight(P + "linear_attn.conv1d", {c.gdn_conv_dim(), 1, c.linear_conv_kernel_dim});
  p.bare(P + "linear_attn.A_log", {Hv});
  p.bare(P + "linear_attn.dt_bias", {Hv});
  p.weight(P + "linear_attn.norm", {c.linear_value_head_dim});
  p.linear(P + "linear_attn.out_proj", H, c.gdn_value_dim());
}

void vision_params(ParamList& p, const VisionShape& v) {
  const std::string V = "model.visual.";
  const int64_t h = v.hidden_size;
  p.weight(V + "patch_embed.proj", {h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size});
  p.out->push_back({V + "patch_embed.proj.bias", V + "patch_embed.proj", ParamKind::kOther, {h}, DType::kBF16, false});
  p.weight(V + "pos_embed", {v.num_position_embeddings, h}, ParamKind::kEmbedding);
  for (int j = 0; j < v.depth; ++j) {
    std::string B = V + "blocks." + std::to_string(j) + ".";
    for (const char* norm : {"norm1", "norm2"}) {
      p.weight(B + norm, {h});
      p.out->push_back({B + norm + ".bias", B + norm, ParamKind::kOther, {h}, DType::kBF16, false});
    }
    p.linear_bias(B + "attn.qkv", 3 * h, h);
    p.linear_bias(B + "attn.proj", h, h);
    p.linear_bias(B + "mlp.linear_fc1", v.intermediate_size, h);
    p.linear_bias(B + "mlp.linear_fc2", h, v.intermediate_size);
  }
  const int64_t merged = h * v.spatial_merge_size * v.spatial_merge_size;
  p.weight(V + "merger.norm", {h});
  p.out->push_back({V + "merger.norm.bias", V + "merger.norm", ParamKind::kOther, {h}, DType::kBF16, false});
  p.linear_bias(V + "merger.linear_fc1", merged, merged);
  p.linear_bias(V + "merger.linear_fc2", v.out_hidden_size, merged);
}

}  // namespace

std::vector<std::string> known_model_names() { return {"qwen3.5-122b-a10b", "qwen3.5-35b-a3b", "tiny"}; }

Expected<ModelLike> model_like(std::string_view name) {
  if (name == "qwen3.5-122b-a10b") return qwen35_122b();
  if (name == "qwen3.5-35b-a3b") return qwen35_35b();
  if (name == "tiny") return tiny();
  std::string known;
  for (const auto& n : known_model_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error("unknown model '" + std::string(name) + "' (known: " + known + ")");
}

Status resize_model(ModelLike& model, std::optional<int> vocab_size, std::optional<int> num_layers) {
  if (vocab_size) {
    if (*vocab_size <= 0) return make_error("--vocab must be positive, got " + std::to_string(*vocab_size));
    model.text.vocab_size = *vocab_size;
  }
  if (num_layers) {
    if (*num_layers <= 0) return make_error("--layers must be positive, got " + std::to_string(*num_layers));
    model.text.num_hidden_layers = *num_layers;
    set_layer_types(model);
  }
  return Status::Ok();
}

std::string_view component_name(Component c) {
  switch (c) {
    case Component::kRoutedExperts: return "routed experts";
    case Component::kSharedExpert: return "shared expert";
    case Component::kAttention: return "attention";
    case Component::kGdn: return "gdn";
    case Component::kRouter: return "router";
    case Component::kEmbeddings: return "embeddings";
    case Component::kLmHead: return "lm_head";
    case Component::kVision: return "vision";
    case Component::kMtp: return "mtp";
    case Component::kNormsOther: return "norms/other";
    case Component::kDenseMlp: return "dense mlp";
  }
  return "?";
}

Component component_of(std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  if (name.starts_with("mtp.")) return Component::kMtp;
  if (has("visual.")) return Component::kVision;
  if (name == "lm_head" || name.ends_with(".lm_head") || has("lm_head.")) return Component::kLmHead;
  if (has("embed_tokens")) return Component::kEmbeddings;
  if (has(".mlp.experts.") || name.ends_with(".mlp.experts")) return Component::kRoutedExperts;
  if (has(".mlp.shared_expert_gate")) return Component::kRouter;
  if (has(".mlp.shared_expert.")) return Component::kSharedExpert;
  if (name.ends_with(".mlp.gate") || has(".mlp.gate.")) return Component::kRouter;
  for (std::string_view p : {".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"})
    if (has(p)) return Component::kDenseMlp;
  for (std::string_view p : {".linear_attn.in_proj_", ".linear_attn.out_proj"})
    if (has(p)) return Component::kGdn;
  for (std::string_view p : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj"})
    if (has(p)) return Component::kAttention;
  return Component::kNormsOther;
}

std::vector<ParamShape> model_params(const ModelLike& model, bool per_expert_layout) {
  const ModelConfig& c = model.text;
  std::vector<ParamShape> out;
  ParamList p{&out};
  const int64_t H = c.hidden_size, V = c.vocab_size;
  p.weight("model.language_model.embed_tokens", {V, H}, ParamKind::kEmbedding);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string P = layer_prefix(i);
    p.weight(P + "input_layernorm", {H});
    if (c.layer_types[static_cast<size_t>(i)] == LayerType::kFullAttention) {
      attention_params(p, c, P);
    } else {
      gdn_params(p, c, P);
    }
    p.weight(P + "post_attention_layernorm", {H});
    moe_params(p, c, P, per_expert_layout);
  }
  p.weight("model.language_model.norm", {H});
  if (!c.tie_word_embeddings) p.linear("lm_head", V, H);
  vision_params(p, model.vision);
  if (c.mtp_num_hidden_layers > 0) {
    p.mtp = true;
    p.linear("mtp.fc", H, 2 * H);  // input = cat[embedding, hidden]
    p.weight("mtp.pre_fc_norm_embedding", {H});
    p.weight("mtp.pre_fc_norm_hidden", {H});
    for (int i = 0; i < c.mtp_num_hidden_layers; ++i) {
      const std::string P = "mtp.layers." + std::to_string(i) + ".";
      p.weight(P + "input_layernorm", {H});
      attention_params(p, c, P);
      p.weight(P + "post_attention_layernorm", {H});
      moe_params(p, c, P, /*per_expert=*/false);
    }
    p.weight("mtp.norm", {H});
  }
  return out;
}

}  // namespace sparkserve
