// Writes small random Qwen3.5 checkpoints for the model tests: config.json copied from a committed
// fixture (optionally edited), weights generated here for that config. The same random numbers
// can be written with fused or per-expert MoE tensors, and single tensors can be dropped, reshaped
// or retyped to provoke the loader's errors.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"

namespace sparkserve::test {

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

struct RawTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<float> values;  // as f32; stored as `dtype`
};

// Every tensor a flat (prefix "model.") checkpoint of `c` needs, with random bf16-exact values.
inline std::vector<RawTensor> random_tensors(const ModelConfig& c, bool per_expert, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<RawTensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    RawTensor t{name, DType::kBF16, shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> d(mean, std);
    for (int64_t i = 0; i < n; ++i) t.values.push_back(round_to_bf16(d(rng)));
    out.push_back(std::move(t));
  };
  const int64_t H = c.hidden_size, V = c.vocab_size;
  add("model.embed_tokens.weight", {V, H}, 0, 0.5f);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string P = "model.layers." + std::to_string(l) + ".";
    add(P + "input_layernorm.weight", {H}, 0, 0.2f);
    add(P + "post_attention_layernorm.weight", {H}, 0, 0.2f);
    if (c.layer_types[static_cast<size_t>(l)] == LayerType::kLinearAttention) {
      const int64_t Hv = c.linear_num_value_heads, conv = c.gdn_conv_dim(), vd = c.gdn_value_dim();
      add(P + "linear_attn.in_proj_qkv.weight", {conv, H}, 0, 0.1f);
      add(P + "linear_attn.in_proj_z.weight", {vd, H}, 0, 0.1f);
      add(P + "linear_attn.in_proj_b.weight", {Hv, H}, 0, 0.1f);
      add(P + "linear_attn.in_proj_a.weight", {Hv, H}, 0, 0.1f);
      add(P + "linear_attn.out_proj.weight", {H, vd}, 0, 0.1f);
      add(P + "linear_attn.conv1d.weight", {conv, 1, c.linear_conv_kernel_dim}, 0, 0.3f);
      add(P + "linear_attn.A_log", {Hv}, -1.0f, 0.8f);
      add(P + "linear_attn.dt_bias", {Hv}, 0, 0.5f);
      add(P + "linear_attn.norm.weight", {c.linear_value_head_dim}, 1.0f, 0.2f);
    } else {
      const int64_t nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
      add(P + "self_attn.q_proj.weight", {nh * hd * 2, H}, 0, 0.1f);
      add(P + "self_attn.k_proj.weight", {kvh * hd, H}, 0, 0.1f);
      add(P + "self_attn.v_proj.weight", {kvh * hd, H}, 0, 0.1f);
      add(P + "self_attn.o_proj.weight", {H, nh * hd}, 0, 0.1f);
      add(P + "self_attn.q_norm.weight", {hd}, 0, 0.2f);
      add(P + "self_attn.k_norm.weight", {hd}, 0, 0.2f);
    }
    if (c.is_moe) {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
      add(P + "mlp.gate.weight", {E, H}, 0, 0.3f);
      add(P + "mlp.experts.gate_up_proj", {E, 2 * I, H}, 0, 0.1f);
      add(P + "mlp.experts.down_proj", {E, H, I}, 0, 0.1f);
      if (per_expert) {  // split the same numbers: gate = rows [0, I), up = rows [I, 2I)
        RawTensor down = out.back();
        out.pop_back();
        RawTensor gu = out.back();
        out.pop_back();
        for (int64_t e = 0; e < E; ++e) {
          const std::string X = P + "mlp.experts." + std::to_string(e) + ".";
          auto slice = [&](const RawTensor& src, int64_t begin, int64_t count) {
            return std::vector<float>(src.values.begin() + begin, src.values.begin() + begin + count);
          };
          out.push_back({X + "gate_proj.weight", DType::kBF16, {I, H}, slice(gu, e * 2 * I * H, I * H)});
          out.push_back({X + "up_proj.weight", DType::kBF16, {I, H}, slice(gu, e * 2 * I * H + I * H, I * H)});
          out.push_back({X + "down_proj.weight", DType::kBF16, {H, I}, slice(down, e * H * I, H * I)});
        }
      }
      add(P + "mlp.shared_expert.gate_proj.weight", {Is, H}, 0, 0.1f);
      add(P + "mlp.shared_expert.up_proj.weight", {Is, H}, 0, 0.1f);
      add(P + "mlp.shared_expert.down_proj.weight", {H, Is}, 0, 0.1f);
      add(P + "mlp.shared_expert_gate.weight", {1, H}, 0, 0.1f);
    } else {
      const int64_t I = c.intermediate_size;
      add(P + "mlp.gate_proj.weight", {I, H}, 0, 0.1f);
      add(P + "mlp.up_proj.weight", {I, H}, 0, 0.1f);
      add(P + "mlp.down_proj.weight", {H, I}, 0, 0.1f);
    }
  }
  add("model.norm.weight", {H}, 0, 0.2f);
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, 0, 0.15f);
  return out;
}

inline RawTensor* find_tensor(std::vector<RawTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  return nullptr;
}

// Writes `tensors` (converted to their dtype) as dir/model.safetensors plus config.json.
inline void write_checkpoint(const std::filesystem::path& dir, const std::string& config_json,
                             const std::vector<RawTensor>& tensors) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config_json;
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<TensorToWrite> w;
  for (const auto& t : tensors) {
    std::vector<uint8_t> b(t.values.size() * dtype_size(t.dtype));
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (t.dtype == DType::kBF16) {
        uint16_t h = f32_to_bf16(t.values[i]);
        std::memcpy(&b[i * 2], &h, 2);
      } else if (t.dtype == DType::kF32) {
        std::memcpy(&b[i * 4], &t.values[i], 4);
      } else if (t.dtype == DType::kI32) {
        int32_t v = static_cast<int32_t>(t.values[i]);
        std::memcpy(&b[i * 4], &v, 4);
      }
    }
    blobs.push_back(std::move(b));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    w.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape, blobs[i].data()});
  Status s = write_safetensors(dir / "model.safetensors", w, {{"format", "pt"}});
  if (!s.ok()) throw std::runtime_error(s.message());
}

// The flat CausalLM MoE fixture's config.json, edited by `edit`.
inline std::string tiny_config(const std::string& fixture = "qwen35-moe-tiny-causallm",
                               const std::function<void(nlohmann::json&)>& edit = nullptr) {
  std::ifstream f(fixture_dir(fixture) / "config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  if (edit) edit(j);
  return j.dump(2);
}

}  // namespace sparkserve::test
