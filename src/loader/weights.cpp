#include "loader/weights.h"

#include <cstring>
#include <set>

#include "core/tensor.h"

namespace sparkserve {

std::vector<std::string> LoadReport::notes() const {
  std::vector<std::string> out;
  if (visual_tensors > 0)
    out.push_back("note: " + std::to_string(visual_tensors) +
                  " vision tower tensors (model.visual.*) recognised, not used yet (text-only model)");
  if (mtp_tensors > 0)
    out.push_back("note: " + std::to_string(mtp_tensors) +
                  " multi-token-prediction tensors (mtp.*) recognised, not used yet");
  for (const auto& name : unexpected)
    out.push_back("warning: checkpoint tensor '" + name + "' is not used by the model");
  return out;
}

namespace {

struct Part {
  std::string name;
  std::vector<int64_t> shape;
};

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, Backend& backend, ModelWeights& w)
      : ckpt_(ckpt), backend_(backend), w_(w) {}

  std::set<std::string>& used() { return used_; }

  // The tensor, checked for presence, shape and a float dtype.
  Expected<const TensorInfo*> require(const Part& p) {
    const TensorInfo* info = ckpt_.find(p.name);
    if (!info)
      return make_error(ckpt_.dir().string() + ": tensor '" + p.name +
                        "' is missing (config.json needs it, expected shape " + shape_to_string(p.shape) + ")");
    if (info->shape != p.shape)
      return make_error(info->file.string() + ": tensor '" + p.name + "' has shape " +
                        shape_to_string(info->shape) + ", expected " + shape_to_string(p.shape) +
                        " from config.json");
    if (!is_float_dtype(info->dtype))
      return make_error(info->file.string() + ": tensor '" + p.name + "' has dtype " +
                        std::string(dtype_name(info->dtype)) + ", expected F32, BF16 or F16" +
                        (info->dtype == DType::kF8E4M3 || info->dtype == DType::kU8
                             ? " (quantized checkpoints are not supported yet)"
                             : ""));
    used_.insert(p.name);
    return info;
  }

  // A small tensor (norm weight, conv kernel, A_log, ...) converted to f32.
  Expected<Tensor> vector_f32(const Part& p, std::vector<int64_t> device_shape = {}) {
    SS_ASSIGN_OR_RETURN(const TensorInfo* info, require(p));
    SS_ASSIGN_OR_RETURN(std::vector<float> data, ckpt_.read_f32(*info));
    w_.storage.emplace_back(&backend_, DType::kF32, device_shape.empty() ? p.shape : device_shape);
    backend_.upload(w_.storage.back().tensor(), data.data());
    return w_.storage.back().tensor();
  }

  // Concatenates the parts along their first dim into one matrix weight of `shape` (out/in
  // features describe one expert for stacked [E, out, in] weights). BF16 and F32 stay as stored
  // when every part agrees; anything else (F16, mixed dtypes) becomes F32.
  Expected<Linear> matrix(const std::vector<Part>& parts, std::vector<int64_t> shape) {
    std::vector<const TensorInfo*> infos;
    for (const Part& p : parts) {
      SS_ASSIGN_OR_RETURN(const TensorInfo* info, require(p));
      infos.push_back(info);
    }
    DType dtype = infos[0]->dtype;
    for (const TensorInfo* i : infos)
      if (i->dtype != dtype) dtype = DType::kF32;
    if (dtype == DType::kF16) dtype = DType::kF32;
    Linear lin;
    lin.format = dtype == DType::kBF16 ? WeightFormat::kBf16 : WeightFormat::kF32;
    lin.out_features = shape[shape.size() - 2];
    lin.in_features = shape.back();
    w_.storage.emplace_back(&backend_, dtype, shape);
    lin.weight = w_.storage.back().tensor();
    std::vector<uint8_t> host(lin.weight.nbytes());
    size_t offset = 0;
    for (const TensorInfo* info : infos) {
      const size_t bytes = static_cast<size_t>(info->numel()) * dtype_size(dtype);
      if (offset + bytes > host.size())
        return make_error(info->file.string() + ": tensor '" + info->name + "' does not fit the weight");
      if (info->dtype == dtype) {
        SS_RETURN_IF_ERROR(ckpt_.read(*info, host.data() + offset));
      } else {
        SS_ASSIGN_OR_RETURN(std::vector<float> f, ckpt_.read_f32(*info));
        std::memcpy(host.data() + offset, f.data(), bytes);
      }
      offset += bytes;
    }
    CHECK(offset == host.size());
    backend_.upload(lin.weight, host.data());
    return lin;
  }

  Expected<Linear> linear(const std::string& name, int64_t out, int64_t in) {
    return matrix({{name, {out, in}}}, {out, in});
  }

 private:
  const Checkpoint& ckpt_;
  Backend& backend_;
  ModelWeights& w_;
  std::set<std::string> used_;
};

Status load_gdn(WeightLoader& L, const ModelConfig& c, const std::string& P, GdnWeights& g) {
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

Status load_attention(WeightLoader& L, const ModelConfig& c, const std::string& P, AttentionWeights& a) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
  SS_ASSIGN_OR_RETURN(a.q_proj, L.linear(P + "q_proj.weight", nh * hd * 2, H));
  SS_ASSIGN_OR_RETURN(a.k_proj, L.linear(P + "k_proj.weight", kvh * hd, H));
  SS_ASSIGN_OR_RETURN(a.v_proj, L.linear(P + "v_proj.weight", kvh * hd, H));
  SS_ASSIGN_OR_RETURN(a.o_proj, L.linear(P + "o_proj.weight", H, nh * hd));
  SS_ASSIGN_OR_RETURN(a.q_norm, L.vector_f32({P + "q_norm.weight", {hd}}));
  SS_ASSIGN_OR_RETURN(a.k_norm, L.vector_f32({P + "k_norm.weight", {hd}}));
  return Status::Ok();
}

Status load_moe(WeightLoader& L, const Checkpoint& ckpt, const ModelConfig& c, const std::string& P,
                MoeWeights& m, bool& per_expert) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  SS_ASSIGN_OR_RETURN(m.router, L.linear(P + "gate.weight", E, H));
  if (ckpt.find(P + "experts.gate_up_proj") || !ckpt.find(P + "experts.0.gate_proj.weight")) {
    SS_ASSIGN_OR_RETURN(m.experts_gate_up, L.matrix({{P + "experts.gate_up_proj", {E, 2 * I, H}}}, {E, 2 * I, H}));
    SS_ASSIGN_OR_RETURN(m.experts_down, L.matrix({{P + "experts.down_proj", {E, H, I}}}, {E, H, I}));
  } else {
    per_expert = true;
    std::vector<Part> gate_up, down;
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

Status load_mlp(WeightLoader& L, const ModelConfig& c, const std::string& P, MlpWeights& m) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  SS_ASSIGN_OR_RETURN(m.gate_up, L.matrix({{P + "gate_proj.weight", {I, H}}, {P + "up_proj.weight", {I, H}}},
                                          {2 * I, H}));
  SS_ASSIGN_OR_RETURN(m.down, L.linear(P + "down_proj.weight", H, I));
  return Status::Ok();
}

}  // namespace

Expected<ModelWeights> load_weights(const Checkpoint& ckpt, const ModelConfig& c, Backend& backend) {
  ModelWeights w;
  WeightLoader L(ckpt, backend, w);
  std::string prefix;
  if (ckpt.find("model.language_model.embed_tokens.weight")) {
    prefix = "model.language_model.";
  } else if (ckpt.find("model.embed_tokens.weight")) {
    prefix = "model.";
  } else {
    return make_error(ckpt.dir().string() +
                      ": tensor 'model.language_model.embed_tokens.weight' (or 'model.embed_tokens.weight') "
                      "is missing: not a Qwen3.5 checkpoint?");
  }
  w.report.prefix = prefix;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  SS_ASSIGN_OR_RETURN(w.embed, L.linear(prefix + "embed_tokens.weight", V, H));
  if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers)
    return make_error("config.json: layer_types has " + std::to_string(c.layer_types.size()) +
                      " entries for num_hidden_layers " + std::to_string(c.num_hidden_layers));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string P = prefix + "layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.type = c.layer_types[static_cast<size_t>(i)];
    SS_ASSIGN_OR_RETURN(lw.input_norm, L.vector_f32({P + "input_layernorm.weight", {H}}));
    SS_ASSIGN_OR_RETURN(lw.post_attention_norm, L.vector_f32({P + "post_attention_layernorm.weight", {H}}));
    if (lw.type == LayerType::kLinearAttention) {
      SS_RETURN_IF_ERROR(load_gdn(L, c, P + "linear_attn.", lw.gdn));
    } else {
      SS_RETURN_IF_ERROR(load_attention(L, c, P + "self_attn.", lw.attn));
    }
    if (c.is_moe) {
      SS_RETURN_IF_ERROR(load_moe(L, ckpt, c, P + "mlp.", lw.moe, w.report.per_expert_layout));
    } else {
      SS_RETURN_IF_ERROR(load_mlp(L, c, P + "mlp.", lw.mlp));
    }
    w.layers.push_back(std::move(lw));
  }
  SS_ASSIGN_OR_RETURN(w.final_norm, L.vector_f32({prefix + "norm.weight", {H}}));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
    if (ckpt.find("lm_head.weight")) L.used().insert("lm_head.weight");  // a saved copy of the tie
  } else {
    SS_ASSIGN_OR_RETURN(w.lm_head, L.linear("lm_head.weight", V, H));
  }
  for (const auto& [name, info] : ckpt.tensors()) {
    if (L.used().count(name)) continue;
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("visual.", 0) == 0) {
      ++w.report.visual_tensors;
    } else if (name.rfind("mtp.", 0) == 0) {
      ++w.report.mtp_tensors;
    } else {
      w.report.unexpected.push_back(name);
    }
  }
  return w;
}

}  // namespace sparkserve
