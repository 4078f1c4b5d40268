#include "loader/synth_checkpoint.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <future>
#include <thread>

#include "core/dtype.h"

namespace sparkserve {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<std::string> synth_layout_names() { return {"bf16", "nvfp4", "nvfp4-fp8dense", "fp8", "modelopt-nvfp4"}; }

Expected<SynthLayout> parse_synth_layout(std::string_view name) {
  if (name == "bf16") return SynthLayout::kBf16;
  if (name == "nvfp4") return SynthLayout::kNvfp4;
  if (name == "nvfp4-fp8dense") return SynthLayout::kNvfp4Fp8Dense;
  if (name == "fp8") return SynthLayout::kFp8;
  if (name == "modelopt-nvfp4") return SynthLayout::kModelOptNvfp4;
  return make_error("unknown layout '" + std::string(name) + "' (known: bf16, nvfp4, nvfp4-fp8dense, fp8, modelopt-nvfp4)");
}

std::string_view synth_layout_name(SynthLayout layout) {
  switch (layout) {
    case SynthLayout::kBf16: return "bf16";
    case SynthLayout::kNvfp4: return "nvfp4";
    case SynthLayout::kNvfp4Fp8Dense: return "nvfp4-fp8dense";
    case SynthLayout::kFp8: return "fp8";
    case SynthLayout::kModelOptNvfp4: return "modelopt-nvfp4";
  }
  return "?";
}

uint64_t SynthTensor::nbytes() const {
  uint64_t n = dtype_size(spec.dtype);
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

enum class LinearFormat { kBf16, kNvfp4Ct, kNvfp4ModelOpt, kFp8Channel };

bool ends_with(const std::string& s, std::string_view suffix) { return s.ends_with(suffix); }
bool is_router(const std::string& m) { return ends_with(m, ".mlp.gate"); }
bool is_shared_gate(const std::string& m) { return ends_with(m, ".mlp.shared_expert_gate"); }
bool is_gdn_ab(const std::string& m) { return ends_with(m, ".linear_attn.in_proj_a") || ends_with(m, ".linear_attn.in_proj_b"); }
bool is_routed(const std::string& m) { return m.find(".mlp.experts.") != std::string::npos; }

LinearFormat linear_format(const ParamShape& p, SynthLayout layout) {
  const std::string& m = p.module;
  if (p.mtp || m.starts_with("model.visual.")) return LinearFormat::kBf16;
  switch (layout) {
    case SynthLayout::kBf16: return LinearFormat::kBf16;
    case SynthLayout::kNvfp4: return LinearFormat::kNvfp4Ct;
    case SynthLayout::kNvfp4Fp8Dense:
      if (is_routed(m)) return LinearFormat::kNvfp4Ct;
      if (m == "lm_head" || is_router(m) || is_shared_gate(m) || is_gdn_ab(m)) return LinearFormat::kBf16;
      return LinearFormat::kFp8Channel;
    case SynthLayout::kFp8:
      if (m == "lm_head" || is_router(m) || is_shared_gate(m)) return LinearFormat::kBf16;
      return LinearFormat::kFp8Channel;
    case SynthLayout::kModelOptNvfp4:
      if (m == "lm_head" || is_router(m) || is_shared_gate(m) || is_gdn_ab(m)) return LinearFormat::kBf16;
      return LinearFormat::kNvfp4ModelOpt;
  }
  return LinearFormat::kBf16;
}

// Typical magnitude of a weight with fan-in K (uniform ±sqrt(3/K) has variance 1/K).
float weight_half_range(int64_t K) { return std::sqrt(3.0f / static_cast<float>(std::max<int64_t>(K, 1))); }

// Mean E4M3 block scale of kE4M3Scales (~128) times the largest E2M1 magnitude (6).
constexpr float kNvfp4DequantDivisor = 6.0f * 128.0f;
constexpr float kInputGlobalScale = 448.0f * 6.0f / 8.0f;  // as if calibrated on activations with amax 8

void emit_param(const ParamShape& p, SynthLayout layout, std::vector<SynthTensor>& out) {
  auto add = [&](std::string name, DType dt, std::vector<int64_t> shape, SynthFill fill, float center, float half) {
    out.push_back({TensorSpec{std::move(name), dt, std::move(shape)}, fill, center, half, p.mtp});
  };
  if (p.kind == ParamKind::kLinear) {
    const int64_t N = p.shape[0], K = p.shape[1];
    const float a = weight_half_range(K);
    switch (linear_format(p, layout)) {
      case LinearFormat::kBf16:
        add(p.name, DType::kBF16, p.shape, SynthFill::kUniformBf16, 0.0f, a);
        return;
      case LinearFormat::kNvfp4Ct:
        add(p.module + ".weight_packed", DType::kU8, {N, K / 2}, SynthFill::kRandomBytes, 0, 0);
        add(p.module + ".weight_scale", DType::kF8E4M3, {N, K / 16}, SynthFill::kE4M3Scales, 0, 0);
        add(p.module + ".weight_global_scale", DType::kF32, {1}, SynthFill::kUniformF32, kNvfp4DequantDivisor / a,
            0.1f * kNvfp4DequantDivisor / a);
        add(p.module + ".input_global_scale", DType::kF32, {1}, SynthFill::kUniformF32, kInputGlobalScale,
            0.1f * kInputGlobalScale);
        return;
      case LinearFormat::kNvfp4ModelOpt:
        add(p.module + ".weight", DType::kU8, {N, K / 2}, SynthFill::kRandomBytes, 0, 0);
        add(p.module + ".weight_scale", DType::kF8E4M3, {N, K / 16}, SynthFill::kE4M3Scales, 0, 0);
        add(p.module + ".weight_scale_2", DType::kF32, {}, SynthFill::kUniformF32, a / kNvfp4DequantDivisor,
            0.1f * a / kNvfp4DequantDivisor);
        add(p.module + ".input_scale", DType::kF32, {}, SynthFill::kUniformF32, 1.0f / kInputGlobalScale,
            0.1f / kInputGlobalScale);
        return;
      case LinearFormat::kFp8Channel:
        add(p.module + ".weight", DType::kF8E4M3, {N, K}, SynthFill::kFp8Codes, 0, 0);
        add(p.module + ".weight_scale", DType::kBF16, {N, 1}, SynthFill::kUniformBf16, a / 112.0f, 0.2f * a / 112.0f);
        return;
    }
  }
  if (p.kind == ParamKind::kFusedExperts) {
    add(p.name, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, weight_half_range(p.shape.back()));
    return;
  }
  if (p.kind == ParamKind::kEmbedding) {
    add(p.name, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, 0.05f);
    return;
  }
  // Other parameters: plausible values for their role.
  const std::string& n = p.name;
  if (ends_with(n, ".bias")) {
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, 0.02f);
  } else if (ends_with(n, ".A_log")) {
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 1.4f, 1.3f);  // A = exp(A_log) in ~[1, 15]
  } else if (ends_with(n, ".dt_bias")) {
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, 1.0f);
  } else if (ends_with(n, "conv1d.weight") || ends_with(n, "patch_embed.proj.weight")) {
    int64_t fan_in = 1;
    for (size_t i = 1; i < p.shape.size(); ++i) fan_in *= p.shape[i];
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, weight_half_range(fan_in));
  } else if (ends_with(n, "linear_attn.norm.weight") || n.starts_with("model.visual.")) {
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 1.0f, 0.1f);  // plain-weight norms (≈ 1)
  } else {
    add(n, p.dtype, p.shape, SynthFill::kUniformBf16, 0.0f, 0.1f);  // zero-centred (1 + w) RMSNorm weights
  }
}

json nvfp4_args(bool activations) {
  return json{{"num_bits", 4},
              {"type", "float"},
              {"symmetric", true},
              {"group_size", 16},
              {"strategy", "tensor_group"},
              {"block_structure", nullptr},
              {"dynamic", activations ? json("local") : json(false)},
              {"actorder", nullptr},
              {"scale_dtype", "torch.float8_e4m3fn"},
              {"zp_dtype", nullptr},
              {"observer", activations ? "static_minmax" : "memoryless_minmax"},
              {"observer_kwargs", json::object()}};
}

json fp8_weight_args() {
  return json{{"num_bits", 8},      {"type", "float"},      {"symmetric", true},    {"group_size", nullptr},
              {"strategy", "channel"}, {"block_structure", nullptr}, {"dynamic", false}, {"actorder", nullptr},
              {"scale_dtype", nullptr}, {"zp_dtype", nullptr},   {"observer", "memoryless_minmax"},
              {"observer_kwargs", json::object()}};
}

json fp8_token_args() {
  return json{{"num_bits", 8},     {"type", "float"},         {"symmetric", true}, {"group_size", nullptr},
              {"strategy", "token"}, {"block_structure", nullptr}, {"dynamic", true}, {"actorder", nullptr},
              {"scale_dtype", nullptr}, {"zp_dtype", nullptr},  {"observer", nullptr}, {"observer_kwargs", json::object()}};
}

json ct_group(const std::vector<std::string>& targets, const std::string& format) {
  json g{{"targets", targets}, {"format", format}, {"output_activations", nullptr}};
  if (format == "nvfp4-pack-quantized") {
    g["weights"] = nvfp4_args(false);
    g["input_activations"] = nvfp4_args(true);
  } else {
    g["weights"] = fp8_weight_args();
    g["input_activations"] = fp8_token_args();
  }
  return g;
}

json ct_config(const std::string& format, json groups, std::vector<std::string> ignore) {
  return json{{"quant_method", "compressed-tensors"},
              {"format", format},
              {"quantization_status", "compressed"},
              {"global_compression_ratio", nullptr},
              {"config_groups", std::move(groups)},
              {"ignore", std::move(ignore)},
              {"kv_cache_scheme", nullptr},
              {"sparsity_config", json::object()},
              {"transform_config", json::object()},
              {"version", "0.12.3.a20251114"}};
}

json quantization_config(SynthLayout layout) {
  switch (layout) {
    case SynthLayout::kNvfp4:
      return ct_config("nvfp4-pack-quantized", json{{"group_0", ct_group({"Linear"}, "nvfp4-pack-quantized")}},
                       {"re:model.visual.*", "re:^mtp.*"});
    case SynthLayout::kNvfp4Fp8Dense:
      return ct_config("mixed-precision",
                       json{{"group_0", ct_group({"Linear"}, "float-quantized")},
                            {"group_1", ct_group({"re:.*mlp\\.experts\\..*"}, "nvfp4-pack-quantized")}},
                       {"lm_head", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$", "re:.*linear_attn\\.in_proj_[ab]$",
                        "re:model.visual.*", "re:^mtp.*"});
    case SynthLayout::kFp8:
      return ct_config("float-quantized", json{{"group_0", ct_group({"Linear"}, "float-quantized")}},
                       {"lm_head", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$", "re:model.visual.*", "re:^mtp.*"});
    default:
      return nullptr;
  }
}

json make_config(const ModelLike& model, SynthLayout layout) {
  const ModelConfig& c = model.text;
  json layer_types = json::array();
  for (LayerType t : c.layer_types) layer_types.push_back(t == LayerType::kFullAttention ? "full_attention" : "linear_attention");
  json text{{"attention_bias", false},
            {"attention_dropout", 0.0},
            {"attn_output_gate", c.attn_output_gate},
            {"dtype", "bfloat16"},
            {"full_attention_interval", model.full_attention_interval},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", 0.02},
            {"layer_types", layer_types},
            {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
            {"linear_key_head_dim", c.linear_key_head_dim},
            {"linear_num_key_heads", c.linear_num_key_heads},
            {"linear_num_value_heads", c.linear_num_value_heads},
            {"linear_value_head_dim", c.linear_value_head_dim},
            {"mamba_ssm_dtype", "float32"},
            {"max_position_embeddings", c.max_position_embeddings},
            {"mlp_only_layers", json::array()},
            {"model_type", "qwen3_5_moe_text"},
            {"moe_intermediate_size", c.moe_intermediate_size},
            {"mtp_num_hidden_layers", c.mtp_num_hidden_layers},
            {"mtp_use_dedicated_embeddings", false},
            {"num_attention_heads", c.num_attention_heads},
            {"num_experts", c.num_experts},
            {"num_experts_per_tok", c.num_experts_per_tok},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_key_value_heads", c.num_key_value_heads},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_parameters",
             {{"mrope_interleaved", c.mrope_interleaved},
              {"mrope_section", c.mrope_section},
              {"rope_type", "default"},
              {"rope_theta", c.rope_theta},
              {"partial_rotary_factor", c.partial_rotary_factor}}},
            {"router_aux_loss_coef", 0.001},
            {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
            {"use_cache", true},
            {"vocab_size", c.vocab_size}};
  std::vector<int> eos;
  for (int id : c.eos_token_ids)
    if (id < c.vocab_size) eos.push_back(id);
  text["eos_token_id"] = eos.size() == 1 ? json(eos[0]) : json(eos);
  const VisionShape& v = model.vision;
  json vision{{"deepstack_visual_indexes", json::array()},
              {"depth", v.depth},
              {"hidden_act", "gelu_pytorch_tanh"},
              {"hidden_size", v.hidden_size},
              {"in_channels", v.in_channels},
              {"initializer_range", 0.02},
              {"intermediate_size", v.intermediate_size},
              {"model_type", "qwen3_5_moe_vision"},
              {"num_heads", v.num_heads},
              {"num_position_embeddings", v.num_position_embeddings},
              {"out_hidden_size", v.out_hidden_size},
              {"patch_size", v.patch_size},
              {"spatial_merge_size", v.spatial_merge_size},
              {"temporal_patch_size", v.temporal_patch_size}};
  json config{{"architectures", {c.architecture}},
              {"image_token_id", 248056},
              {"model_type", c.model_type},
              {"text_config", text},
              {"tie_word_embeddings", c.tie_word_embeddings},
              {"transformers_version", "4.57.0.dev0"},
              {"video_token_id", 248057},
              {"vision_config", vision},
              {"vision_end_token_id", 248054},
              {"vision_start_token_id", 248053}};
  json q = quantization_config(layout);
  if (!q.is_null()) config["quantization_config"] = q;
  return config;
}

// Counter-based RNG: word w of a tensor is a pure function of (seed, w).
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t name_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return mix64(h);
}

const std::array<uint8_t, 65536>& fp8_code_table() {
  static const std::array<uint8_t, 65536> table = [] {
    std::array<uint8_t, 65536> t{};
    for (int i = 0; i < 65536; ++i) t[i] = f32_to_fp8_e4m3((static_cast<float>(i) / 32767.5f - 1.0f) * 112.0f);
    return t;
  }();
  return table;
}

// BF16 tensors draw each element from a 65536-entry table of uniform values (one table read per
// element); tables are shared between tensors with the same range (e.g. all experts' scales).
using Bf16Table = std::vector<uint16_t>;

struct TensorStream {
  const SynthTensor* tensor;
  uint64_t seed;
  uint64_t begin;  // offset in the file's data section
  uint64_t nbytes;
  std::shared_ptr<const Bf16Table> bf16_table;
};

void prepare(TensorStream& s, std::map<std::pair<float, float>, std::shared_ptr<const Bf16Table>>& cache) {
  if (s.tensor->fill != SynthFill::kUniformBf16) return;
  auto& slot = cache[{s.tensor->center, s.tensor->half}];
  if (!slot) {
    auto t = std::make_shared<Bf16Table>(65536);
    for (int i = 0; i < 65536; ++i)
      (*t)[i] = f32_to_bf16(s.tensor->center + s.tensor->half * (static_cast<float>(i) / 32767.5f - 1.0f));
    slot = std::move(t);
  }
  s.bf16_table = slot;
}

// The bytes of element e of a tensor. Random bytes: byte i is byte i%8 of word i/8; BF16 elements and
// FP8/E4M3 codes: 16 bits (e%4) of word e/4; F32: one word per element.
void element_bytes(const TensorStream& s, uint64_t e, uint8_t* v) {
  const SynthTensor& t = *s.tensor;
  switch (t.fill) {
    case SynthFill::kUniformBf16: {
      const uint16_t x = (*s.bf16_table)[(mix64(s.seed + e / 4) >> (16 * (e % 4))) & 0xFFFF];
      std::memcpy(v, &x, 2);
      return;
    }
    case SynthFill::kRandomBytes:
      v[0] = static_cast<uint8_t>(mix64(s.seed + e / 8) >> (8 * (e % 8)));
      return;
    case SynthFill::kFp8Codes:
    case SynthFill::kE4M3Scales: {
      const uint16_t bits = static_cast<uint16_t>(mix64(s.seed + e / 4) >> (16 * (e % 4)));
      v[0] = t.fill == SynthFill::kFp8Codes ? fp8_code_table()[bits]
                                            : static_cast<uint8_t>(0x58 + (bits & 31));  // E4M3 exponent 11..14: 16 .. 240
      return;
    }
    case SynthFill::kUniformF32:
    case SynthFill::kConstantF32: {
      float x = t.center;
      if (t.fill == SynthFill::kUniformF32) {
        const double u = static_cast<double>(mix64(s.seed + e) >> 11) / 9007199254740992.0;  // [0, 1)
        x = t.center + t.half * static_cast<float>(2.0 * u - 1.0);
      }
      std::memcpy(v, &x, 4);
      return;
    }
  }
}

// Fills bytes [b0, b1) of one tensor's data into out: whole random words on the hot paths (packed
// codes, FP8 codes, BF16), element by element at the edges (and for a tensor at an odd offset, only
// the bytes inside the range).
void fill_tensor_bytes(const TensorStream& s, uint64_t b0, uint64_t b1, uint8_t* out) {
  const SynthTensor& t = *s.tensor;
  const uint64_t es = dtype_size(t.spec.dtype);
  uint64_t per_word = 0;  // elements per random word on the fast path
  if (t.fill == SynthFill::kRandomBytes) per_word = 8;
  else if (t.fill == SynthFill::kUniformBf16 || t.fill == SynthFill::kFp8Codes) per_word = 4;
  uint8_t v[8];
  auto slow = [&](uint64_t e) {
    element_bytes(s, e, v);
    const uint64_t pos = e * es;
    if (pos >= b0 && pos + es <= b1) {
      std::memcpy(out + (pos - b0), v, es);
    } else {
      for (uint64_t k = 0; k < es; ++k)
        if (pos + k >= b0 && pos + k < b1) out[pos + k - b0] = v[k];
    }
  };
  uint64_t e = b0 / es;
  const uint64_t e_end = (b1 + es - 1) / es;
  if (per_word == 0 || b0 % es != 0) {
    for (; e < e_end; ++e) slow(e);
    return;
  }
  for (; e < e_end && e % per_word != 0; ++e) slow(e);
  const auto& fp8 = fp8_code_table();
  for (; e + per_word <= e_end && (e + per_word) * es <= b1; e += per_word) {
    const uint64_t r = mix64(s.seed + e / per_word);
    uint8_t* o = out + (e * es - b0);
    if (t.fill == SynthFill::kRandomBytes) {
      std::memcpy(o, &r, 8);
    } else if (t.fill == SynthFill::kFp8Codes) {
      for (int j = 0; j < 4; ++j) o[j] = fp8[(r >> (16 * j)) & 0xFFFF];
    } else {
      const Bf16Table& tab = *s.bf16_table;
      for (int j = 0; j < 4; ++j) {
        const uint16_t x = tab[(r >> (16 * j)) & 0xFFFF];
        std::memcpy(o + 2 * j, &x, 2);
      }
    }
  }
  for (; e < e_end; ++e) slow(e);
}

// Fills bytes [g0, g1) of a file's data section (possibly spanning several tensors).
void fill_range(const std::vector<TensorStream>& streams, uint64_t g0, uint64_t g1, uint8_t* out) {
  auto it = std::upper_bound(streams.begin(), streams.end(), g0,
                             [](uint64_t v, const TensorStream& s) { return v < s.begin; });
  if (it != streams.begin()) --it;
  for (; it != streams.end() && it->begin < g1; ++it) {
    const uint64_t lo = std::max(g0, it->begin), hi = std::min(g1, it->begin + it->nbytes);
    if (lo >= hi) continue;
    fill_tensor_bytes(*it, lo - it->begin, hi - it->begin, out + (lo - g0));
  }
}

Status write_json(const fs::path& path, const json& j) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error("cannot write " + path.string());
  f << j.dump(2) << "\n";
  if (!f) return make_error("error writing " + path.string());
  return Status::Ok();
}

}  // namespace

SynthPlan synth_plan(const ModelLike& model, SynthLayout layout) {
  SynthPlan plan;
  plan.model = model;
  plan.layout = layout;
  for (const ParamShape& p : model_params(model, /*per_expert_layout=*/layout != SynthLayout::kBf16))
    emit_param(p, layout, plan.tensors);
  plan.config = make_config(model, layout);
  json eos = json::array();
  for (int id : model.text.eos_token_ids)
    if (id < model.text.vocab_size) eos.push_back(id);
  plan.generation_config = json{{"do_sample", true}, {"eos_token_id", eos}, {"temperature", 0.6},
                                {"top_k", 20},       {"top_p", 0.95},     {"transformers_version", "4.57.0.dev0"}};
  if (layout == SynthLayout::kModelOptNvfp4) {
    plan.hf_quant_config = json{
        {"producer", {{"name", "modelopt"}, {"version", "0.42.0"}}},
        {"quantization",
         {{"quant_algo", "NVFP4"},
          {"kv_cache_quant_algo", nullptr},
          {"group_size", 16},
          {"exclude_modules",
           {"lm_head", "*mlp.gate", "*shared_expert_gate", "*linear_attn.in_proj_a", "*linear_attn.in_proj_b",
            "model.visual*", "mtp*"}}}}};
  }
  return plan;
}

std::map<std::string, TensorInfo> synth_tensor_infos(const SynthPlan& plan) {
  std::map<std::string, TensorInfo> out;
  for (const SynthTensor& t : plan.tensors) {
    TensorInfo info;
    info.name = t.spec.name;
    info.dtype = t.spec.dtype;
    info.shape = t.spec.shape;
    info.nbytes = t.nbytes();
    out.emplace(info.name, std::move(info));
  }
  return out;
}

Expected<SynthStats> write_synth_checkpoint(const SynthPlan& plan, const SynthOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(options.out, ec);
  if (ec) return make_error("cannot create " + options.out.string() + ": " + ec.message());
  for (const auto& entry : fs::directory_iterator(options.out, ec))
    if (entry.path().extension() == ".safetensors")
      return make_error(options.out.string() + " already holds " + entry.path().filename().string() +
                        "; synth writes into an empty folder (a stale shard would be indexed with the new ones)");
  // Shards: main tensors in order, a new shard before a tensor that would cross shard_bytes.
  std::vector<std::vector<const SynthTensor*>> shards(1);
  std::vector<const SynthTensor*> mtp;
  uint64_t in_shard = 0, total = 0;
  for (const SynthTensor& t : plan.tensors) {
    total += t.nbytes();
    if (t.mtp) {
      mtp.push_back(&t);
      continue;
    }
    if (in_shard > 0 && in_shard + t.nbytes() > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.nbytes();
  }
  std::vector<std::pair<std::string, std::vector<const SynthTensor*>>> files;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    files.emplace_back(name, shards[i]);
  }
  if (!mtp.empty()) files.emplace_back("model_mtp.safetensors", mtp);

  const int threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  constexpr uint64_t kChunk = 32ull << 20;
  std::vector<uint8_t> buf_a(kChunk), buf_b(kChunk);
  SynthStats stats;
  json weight_map = json::object();
  uint64_t done = 0;
  for (const auto& [file_name, tensors] : files) {
    std::vector<TensorSpec> specs;
    std::vector<TensorStream> streams;
    uint64_t offset = 0;
    for (const SynthTensor* t : tensors) {
      specs.push_back(t->spec);
      streams.push_back({t, name_seed(t->spec.name, options.seed), offset, t->nbytes(), {}});
      offset += t->nbytes();
      weight_map[t->spec.name] = file_name;
    }
    const uint64_t data_bytes = offset;
    const fs::path path = options.out / file_name;
    SS_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(path, specs, {{"format", "pt"}}));
    // Tables are built before generation starts, so the generating threads only read.
    std::map<std::pair<float, float>, std::shared_ptr<const Bf16Table>> tables;
    for (auto& s : streams) prepare(s, tables);
    auto generate = [&](uint64_t g0, uint64_t g1, uint8_t* out) {
      const uint64_t n = g1 - g0;
      const uint64_t per = ((n / threads) + 7) & ~uint64_t{7};
      std::vector<std::thread> pool;
      for (int i = 1; i < threads && per * i < n; ++i) {
        const uint64_t lo = per * i, hi = std::min(n, per * (i + 1));
        pool.emplace_back([&, lo, hi] { fill_range(streams, g0 + lo, g0 + hi, out + lo); });
      }
      fill_range(streams, g0, g0 + std::min(n, per), out);
      for (auto& th : pool) th.join();
    };
    uint8_t* cur = buf_a.data();
    uint8_t* next = buf_b.data();
    if (data_bytes > 0) generate(0, std::min(kChunk, data_bytes), cur);
    for (uint64_t g = 0; g < data_bytes; g += kChunk) {
      const uint64_t len = std::min(kChunk, data_bytes - g);
      std::future<void> ahead;
      if (g + kChunk < data_bytes) {
        const uint64_t g1 = std::min(g + 2 * kChunk, data_bytes);
        ahead = std::async(std::launch::async, [&, g, g1] { generate(g + kChunk, g1, next); });
      }
      Status st = writer.append(cur, len);
      if (ahead.valid()) ahead.get();
      SS_RETURN_IF_ERROR(st);
      std::swap(cur, next);
      done += len;
      if (options.progress) options.progress(done, total);
    }
    SS_RETURN_IF_ERROR(writer.finish());
    stats.files.push_back(path);
  }
  SS_RETURN_IF_ERROR(write_json(options.out / "config.json", plan.config));
  SS_RETURN_IF_ERROR(write_json(options.out / "generation_config.json", plan.generation_config));
  if (!plan.hf_quant_config.is_null())
    SS_RETURN_IF_ERROR(write_json(options.out / "hf_quant_config.json", plan.hf_quant_config));
  SS_RETURN_IF_ERROR(write_json(options.out / "model.safetensors.index.json",
                                json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}));
  stats.bytes = done;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace sparkserve
