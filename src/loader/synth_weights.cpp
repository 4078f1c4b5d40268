#include "loader/synth_weights.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "backend/synth_fill.h"
#include "core/dtype.h"
#include "loader/quant_config.h"
#include "loader/quant_scheme.h"
#include "loader/weight_budget.h"
#include "loader/vision_weights.h"
#include "loader/weight_layout.h"

namespace sparkserve {
namespace {

// loader/synth_checkpoint.cpp's per-tensor seed: FNV-1a of the name, then the word mixer.
uint64_t tensor_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return synth_mix64(h);
}

std::vector<uint16_t> bf16_table(float center, float half) {
  std::vector<uint16_t> t(65536);
  for (int i = 0; i < 65536; ++i) t[i] = f32_to_bf16(center + half * (static_cast<float>(i) / 32767.5f - 1.0f));
  return t;
}

using Part = WeightPart;

class SynthBuilder {
 public:
  SynthBuilder(const SynthPlan& plan, const QuantPlan& qplan, Backend& backend, uint64_t seed, ModelWeights& w)
      : qplan_(qplan), backend_(backend), seed_(seed), w_(w) {
    for (const SynthTensor& t : plan.tensors) by_name_[t.spec.name] = &t;
  }

  const SynthTensor* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

  // A tensor of the plan with the shape the config implies (the loader's `require`).
  Expected<const SynthTensor*> require(const Part& p) {
    const SynthTensor* t = find(p.name);
    if (!t) return make_error("synth plan: tensor '" + p.name + "' is missing (expected shape " + shape_to_string(p.shape) + ")");
    if (t->spec.shape != p.shape)
      return make_error("synth plan: tensor '" + p.name + "' has shape " + shape_to_string(t->spec.shape) + ", expected " +
                        shape_to_string(p.shape));
    if (t->spec.dtype != DType::kBF16 || t->fill != SynthFill::kUniformBf16)
      return make_error("synth plan: tensor '" + p.name + "' is not a BF16 uniform tensor");
    bytes_ += t->nbytes();
    return t;
  }

  Expected<Tensor> vector_f32(const Part& p, std::vector<int64_t> device_shape = {}) {
    SS_ASSIGN_OR_RETURN(const SynthTensor* t, require(p));
    Tensor dst = alloc(DType::kF32, device_shape.empty() ? p.shape : device_shape);
    synth_fill(backend_, dst, SynthFillKind::kTableBf16F32, tensor_seed(p.name, seed_), table(*t));
    return dst;
  }

  // The loader's WeightLoader::matrix: parts stacked along the first dim into one weight of `shape`.
  Expected<Linear> matrix(const std::vector<Part>& parts, std::vector<int64_t> shape, bool allow_quantized = true) {
    std::vector<const ModuleFormat*> modules;
    bool any_quantized = false;
    for (const Part& p : parts) {
      const ModuleFormat* m = qplan_.find(split_module_role(p.name).first);
      modules.push_back(m);
      if (m && is_quantized(m->format)) any_quantized = true;
    }
    if (any_quantized) {
      if (!allow_quantized) return make_error("synth plan: module '" + parts[0].name + "' is quantized but must be BF16");
      return quantized_matrix(parts, modules, shape);
    }
    std::vector<const SynthTensor*> tensors;
    for (const Part& p : parts) {
      SS_ASSIGN_OR_RETURN(const SynthTensor* t, require(p));
      tensors.push_back(t);
    }
    Linear lin;
    lin.format = WeightFormat::kBf16;  // every part is BF16 (require)
    lin.out_features = shape[shape.size() - 2];
    lin.in_features = shape.back();
    lin.weight = alloc(DType::kBF16, shape);
    const Tensor flat = lin.weight.view({lin.weight.numel()});
    int64_t offset = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t n = static_cast<int64_t>(tensors[i]->nbytes() / 2);
      if (offset + n > flat.numel())
        return make_error("synth plan: tensor '" + parts[i].name + "' does not fit the weight");
      synth_fill(backend_, flat.rows(offset, n), SynthFillKind::kTableBf16, tensor_seed(parts[i].name, seed_),
                 table(*tensors[i]));
      offset += n;
    }
    if (offset != flat.numel()) return make_error("synth plan: parts of '" + parts[0].name + "' do not tile the weight");
    return lin;
  }

  Expected<Linear> linear(const std::string& name, int64_t out, int64_t in, bool allow_quantized = true) {
    return matrix({{name, {out, in}}}, {out, in}, allow_quantized);
  }

  uint64_t bytes() const { return bytes_; }

 private:
  // The loader's WeightLoader::quantized_matrix, with device fills in place of file reads.
  Expected<Linear> quantized_matrix(const std::vector<Part>& parts, const std::vector<const ModuleFormat*>& modules,
                                    const std::vector<int64_t>& shape) {
    const ModuleFormat* first = modules[0];
    for (size_t i = 0; i < parts.size(); ++i) {
      const ModuleFormat* m = modules[i];
      if (!m || m->format != first->format || m->activation != first->activation || m->shape != parts[i].shape ||
          parts[i].shape.size() != 2 || parts[i].shape[0] != parts[0].shape[0])
        return make_error("synth plan: module of '" + parts[i].name + "' is missing or does not match its weight");
    }
    const WeightFormat fmt = first->format;
    const QuantizedShape q(fmt, shape, static_cast<int64_t>(parts.size()));
    const bool nvfp4 = q.nvfp4;
    const int64_t E = q.E, N = q.N, K = q.K, num_parts = q.parts;
    if (!q.tiles(parts[0].shape[0]))
      return make_error("synth plan: parts of '" + first->name + "' do not tile the weight");
    const int64_t rows = parts[0].shape[0];
    Linear lin = q.linear(fmt, first->activation);
    const int64_t wcols = q.code_cols();
    lin.weight = alloc(nvfp4 ? DType::kU8 : DType::kF8E4M3, q.code_dims());
    const Tensor wflat = lin.weight.view({E * N, wcols});
    Tensor sflat;
    if (nvfp4) {
      lin.weight_scale = alloc(DType::kF8E4M3, q.block_scale_dims());
      sflat = lin.weight_scale.view({E * N, K / 16});
    }
    std::vector<float> row_scales(nvfp4 ? 0 : static_cast<size_t>(E * N));
    std::vector<float> global(static_cast<size_t>(num_parts), 1.0f), input(static_cast<size_t>(num_parts), 1.0f);
    const bool needs_input = lin.activation == ActivationQuant::kNvfp4 || lin.activation == ActivationQuant::kFp8TensorStatic;
    for (int64_t i = 0; i < num_parts; ++i) {
      const ModuleTensors& mt = modules[static_cast<size_t>(i)]->tensors;
      const std::string& mod = modules[static_cast<size_t>(i)]->name;
      if (!mt.weight || !mt.weight_scale) return make_error("synth plan: module '" + mod + "' has no weight or weight_scale");
      const SynthTensor* wt = find(mt.weight->name);
      const SynthTensor* st = find(mt.weight_scale->name);
      if (!wt || !st) return make_error("synth plan: module '" + mod + "' tensors are not in the plan");
      const int64_t row0 = i * rows;
      if (wt->nbytes() != static_cast<uint64_t>(rows * wcols))
        return make_error("synth plan: tensor '" + wt->spec.name + "' has the wrong size");
      bytes_ += wt->nbytes() + st->nbytes();
      if (nvfp4) {
        if (wt->fill != SynthFill::kRandomBytes || st->fill != SynthFill::kE4M3Scales)
          return make_error("synth plan: module '" + mod + "' is not filled as NVFP4 codes and scales");
        synth_fill(backend_, wflat.rows(row0, rows), SynthFillKind::kRandomBytes, tensor_seed(wt->spec.name, seed_), {});
        synth_fill(backend_, sflat.rows(row0, rows), SynthFillKind::kE4M3Scales, tensor_seed(st->spec.name, seed_), {});
        if (!mt.global_scale) return make_error("synth plan: module '" + mod + "' has no global scale");
        SS_ASSIGN_OR_RETURN(global[static_cast<size_t>(i)], scalar(mt.global_scale->name));
      } else {
        if (wt->fill != SynthFill::kFp8Codes || st->fill != SynthFill::kUniformBf16 || st->spec.dtype != DType::kBF16)
          return make_error("synth plan: module '" + mod + "' is not filled as FP8 codes and BF16 scales");
        synth_fill(backend_, wflat.rows(row0, rows), SynthFillKind::kTableU8, tensor_seed(wt->spec.name, seed_), fp8_table());
        // Per-channel ([rows, 1]) or per-tensor ([1]) scales, repeated over the rows as the loader does.
        const int64_t ns = static_cast<int64_t>(st->nbytes() / 2);
        if (ns != 1 && ns != rows) return make_error("synth plan: tensor '" + st->spec.name + "' has the wrong size");
        const std::vector<uint16_t>& tab = host_table(*st);
        const uint64_t s = tensor_seed(st->spec.name, seed_);
        for (int64_t r = 0; r < rows; ++r) {
          const uint64_t e = static_cast<uint64_t>(ns == 1 ? 0 : r);
          row_scales[static_cast<size_t>(row0 + r)] = bf16_to_f32(tab[(synth_mix64(s + e / 4) >> (16 * (e % 4))) & 0xFFFF]);
        }
      }
      if (needs_input) {
        if (!mt.input_scale) return make_error("synth plan: module '" + mod + "' has no input scale");
        SS_ASSIGN_OR_RETURN(input[static_cast<size_t>(i)], scalar(mt.input_scale->name));
      }
    }
    if (!nvfp4) lin.weight_scale = upload(DType::kF32, q.row_scale_dims(), row_scales.data());
    if (nvfp4) lin.global_scale = upload(DType::kF32, {E, lin.partitions}, global.data());
    if (needs_input) lin.input_scale = upload(DType::kF32, {E, lin.partitions}, input.data());
    return lin;
  }

  // A one-value F32 scale of the plan (`synth`'s kUniformF32 / kConstantF32), finite and positive.
  Expected<float> scalar(const std::string& name) {
    const SynthTensor* t = find(name);
    if (!t || t->spec.dtype != DType::kF32 || t->nbytes() != 4)
      return make_error("synth plan: scale '" + name + "' is not one F32 value");
    bytes_ += 4;
    float x = t->center;
    if (t->fill == SynthFill::kUniformF32) {
      const double u = static_cast<double>(synth_mix64(tensor_seed(name, seed_)) >> 11) / 9007199254740992.0;
      x = t->center + t->half * static_cast<float>(2.0 * u - 1.0);
    } else if (t->fill != SynthFill::kConstantF32) {
      return make_error("synth plan: scale '" + name + "' has an unknown fill");
    }
    if (!std::isfinite(x) || x <= 0.0f) return make_error("synth plan: scale '" + name + "' is not finite and positive");
    return x;
  }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) {
    w_.storage.emplace_back(&backend_, dtype, std::move(shape));
    return w_.storage.back().tensor();
  }

  Tensor upload(DType dtype, std::vector<int64_t> shape, const void* host) {
    Tensor t = alloc(dtype, std::move(shape));
    backend_.upload(t, host);
    return t;
  }

  const std::vector<uint16_t>& host_table(const SynthTensor& t) {
    auto& slot = host_tables_[{t.center, t.half}];
    if (slot.empty()) slot = bf16_table(t.center, t.half);
    return slot;
  }

  // BF16 value table of a (center, half) range, in backend memory (kept for the model's lifetime:
  // 128 KiB each, a handful per model).
  const Tensor& table(const SynthTensor& t) {
    auto it = tables_.find({t.center, t.half});
    if (it != tables_.end()) return it->second;
    const Tensor tab = upload(DType::kBF16, {65536}, host_table(t).data());
    return tables_.emplace(std::make_pair(t.center, t.half), tab).first->second;
  }

  const Tensor& fp8_table() {
    if (!fp8_table_.data) {
      std::vector<uint8_t> t(65536);
      for (int i = 0; i < 65536; ++i) t[i] = f32_to_fp8_e4m3((static_cast<float>(i) / 32767.5f - 1.0f) * 112.0f);
      fp8_table_ = upload(DType::kU8, {65536}, t.data());
    }
    return fp8_table_;
  }

  std::map<std::string, const SynthTensor*> by_name_;
  const QuantPlan& qplan_;
  Backend& backend_;
  uint64_t seed_;
  ModelWeights& w_;
  std::map<std::pair<float, float>, std::vector<uint16_t>> host_tables_;
  std::map<std::pair<float, float>, Tensor> tables_;
  Tensor fp8_table_;
  uint64_t bytes_ = 0;
};

}  // namespace

Expected<SynthModel> build_synth_model(const SynthPlan& plan, Backend& backend, uint64_t seed, bool with_mtp) {
  SynthModel out;
  SS_ASSIGN_OR_RETURN(out.config, parse_model_config(plan.config.dump(), "synth config.json"));
  SS_ASSIGN_OR_RETURN(QuantConfig qc, parse_quant_config(plan.config, plan.hf_quant_config));
  const std::map<std::string, TensorInfo> infos = synth_tensor_infos(plan);
  auto qplan = plan_module_formats(infos, qc);
  if (!qplan.ok()) {
    if (qc.method != QuantMethod::kNone) return make_error("synth plan: " + qplan.message());
    qplan = QuantPlan{};
  }
  const ModelConfig& c = out.config;
  const WeightBudget budget = compute_weight_budget(*qplan, c.num_experts, c.num_experts_per_tok);
  out.token_bytes = budget.token_bytes;
  for (const SynthTensor& t : plan.tensors) out.total_bytes += t.nbytes();

  ModelWeights& w = out.weights;
  w.report.quant_warnings = qplan->warnings;
  SynthBuilder L(plan, *qplan, backend, seed, w);
  std::string prefix;
  if (L.find("model.language_model.embed_tokens.weight")) {
    prefix = "model.language_model.";
  } else if (L.find("model.embed_tokens.weight")) {
    prefix = "model.";
  } else {
    return make_error("synth plan: no embed_tokens tensor");
  }
  w.report.prefix = prefix;
  if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers)
    return make_error("synth plan: layer_types does not match num_hidden_layers");
  // The same layout walk as the checkpoint loader (loader/weight_layout.h).
  SS_RETURN_IF_ERROR(weight_layout::text_model(L, c, prefix, w));
  // The vision tower as the loader builds it (a synth checkpoint with a tower serves images too).
  for (const char* vp : {"model.visual.", "visual."})
    if (c.vision.present && L.find(std::string(vp) + "patch_embed.proj.weight")) {
      SS_RETURN_IF_ERROR(weight_layout::vision(L, c.vision, vp, w.vision));
      break;
    }
  if (with_mtp) {
    if (!L.find("mtp.fc.weight")) return make_error("synth plan: no mtp.* tensors (mtp_num_hidden_layers is 0)");
    SS_RETURN_IF_ERROR(weight_layout::mtp(L, c, w.mtp));
  }
  for (const SynthTensor& t : plan.tensors) {
    const std::string& n = t.spec.name;
    if (n.rfind("model.visual.", 0) == 0 || n.rfind("visual.", 0) == 0) {
      if (!w.vision.present) ++w.report.visual_tensors;
    } else if (n.rfind("mtp.", 0) == 0) {
      if (!w.mtp.present) ++w.report.mtp_tensors;
    }
  }
  backend.synchronize();
  out.loaded_bytes = L.bytes();
  return out;
}

namespace {

// Visits the model's Linears (name, Linear) and plain tensors (name, Tensor) in model order.
template <class OnLinear, class OnTensor>
void walk_weights(const ModelWeights& w, OnLinear&& lin, OnTensor&& ten) {
  lin("embed", w.embed);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    const std::string P = "layers." + std::to_string(i) + ".";
    ten(P + "input_norm", L.input_norm);
    ten(P + "post_attention_norm", L.post_attention_norm);
    if (L.type == LayerType::kLinearAttention) {
      lin(P + "gdn.in_proj_qkv", L.gdn.in_proj_qkv);
      lin(P + "gdn.in_proj_z", L.gdn.in_proj_z);
      lin(P + "gdn.in_proj_b", L.gdn.in_proj_b);
      lin(P + "gdn.in_proj_a", L.gdn.in_proj_a);
      lin(P + "gdn.out_proj", L.gdn.out_proj);
      ten(P + "gdn.conv", L.gdn.conv);
      ten(P + "gdn.A_log", L.gdn.A_log);
      ten(P + "gdn.dt_bias", L.gdn.dt_bias);
      ten(P + "gdn.norm", L.gdn.norm);
    } else {
      lin(P + "attn.q_proj", L.attn.q_proj);
      lin(P + "attn.k_proj", L.attn.k_proj);
      lin(P + "attn.v_proj", L.attn.v_proj);
      lin(P + "attn.o_proj", L.attn.o_proj);
      ten(P + "attn.q_norm", L.attn.q_norm);
      ten(P + "attn.k_norm", L.attn.k_norm);
    }
    if (L.moe.router.weight.data) {
      lin(P + "moe.router", L.moe.router);
      lin(P + "moe.experts_gate_up", L.moe.experts_gate_up);
      lin(P + "moe.experts_down", L.moe.experts_down);
      lin(P + "moe.shared_gate_up", L.moe.shared_gate_up);
      lin(P + "moe.shared_down", L.moe.shared_down);
      lin(P + "moe.shared_gate", L.moe.shared_gate);
    } else {
      lin(P + "mlp.gate_up", L.mlp.gate_up);
      lin(P + "mlp.down", L.mlp.down);
    }
  }
  ten("final_norm", w.final_norm);
  lin("lm_head", w.lm_head);
}

}  // namespace

std::vector<std::pair<std::string, const Linear*>> model_linears(const ModelWeights& w) {
  std::vector<std::pair<std::string, const Linear*>> out;
  walk_weights(w, [&](const std::string& n, const Linear& l) { out.emplace_back(n, &l); },
               [](const std::string&, const Tensor&) {});
  return out;
}

std::vector<std::pair<std::string, Tensor>> model_weight_tensors(const ModelWeights& w) {
  std::vector<std::pair<std::string, Tensor>> out;
  walk_weights(
      w,
      [&](const std::string& name, const Linear& l) {
        out.emplace_back(name + ".weight", l.weight);
        if (l.weight_scale.data) out.emplace_back(name + ".weight_scale", l.weight_scale);
        if (l.global_scale.data) out.emplace_back(name + ".global_scale", l.global_scale);
        if (l.input_scale.data) out.emplace_back(name + ".input_scale", l.input_scale);
      },
      [&](const std::string& name, const Tensor& t) { out.emplace_back(name, t); });
  return out;
}

std::string weights_digest(const ModelWeights& w, Backend& backend) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  std::vector<uint8_t> host;
  for (const auto& [name, t] : model_weight_tensors(w)) {
    mix(name.data(), name.size());
    const uint8_t dt = static_cast<uint8_t>(t.dtype);
    mix(&dt, 1);
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
    host.resize(t.nbytes());
    backend.download(host.data(), t);
    mix(host.data(), host.size());
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace sparkserve
