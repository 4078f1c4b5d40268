// Synthetic checkpoints (`sparkserve synth`): random weights with exactly the tensor names, shapes and
// dtypes of a real Qwen3.5 checkpoint in a given layout, plus config.json (real structure, with the
// quantization_config real tools write), generation_config.json, hf_quant_config.json (ModelOpt),
// safetensors shards of ~5 GB with model.safetensors.index.json, and the BF16 MTP weights in a
// separate model_mtp.safetensors (as compressed-tensors' save_mtp_tensors_to_checkpoint does).
//
// Layouts (model-qwen35.md §6.3 names the budgets they reproduce):
//   bf16            the original: everything BF16, routed experts fused 3-D [E, 2I, H] / [E, H, I]
//   nvfp4           compressed-tensors NVFP4 W4A4 on every text Linear incl. lm_head, router,
//                   shared-expert gate and GDN projections (§6.3 a); experts per expert
//   nvfp4-fp8dense  NVFP4 routed experts + FP8 W8A8 dynamic (per-channel) attention, GDN qkv/z/out and
//                   shared expert; BF16 router, shared-expert gate, in_proj_a/b and lm_head (§6.3 b);
//                   "mixed-precision" config whose FP8 group targets "Linear" (the old-loader MoE trap)
//   fp8             compressed-tensors FP8_DYNAMIC on every text Linear but lm_head, router and
//                   shared-expert gate
//   modelopt-nvfp4  ModelOpt NVFP4 (weight U8, weight_scale, weight_scale_2, input_scale) via
//                   hf_quant_config.json; lm_head, router, shared-expert gate, in_proj_a/b excluded
// Vision tower and MTP stay BF16 in every layout (ignored / excluded by the config).
//
// Weights are random but valid: finite, scales positive. Quantized weights are NOT produced by
// quantizing random normals (too slow at 122B scale): NVFP4 codes are uniform random nibbles, block
// scales random positive E4M3 values in [16, 240], global scales chosen so that dequantized weights
// have magnitude ~sqrt(3/K); FP8 codes come from uniform values in ±112 with a per-row scale giving
// the same magnitude. Every byte is a pure function of (seed, tensor name, position): output does not
// depend on the thread count.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "loader/model_shapes.h"
#include "loader/safetensors.h"

namespace sparkserve {

enum class SynthLayout : uint8_t { kBf16, kNvfp4, kNvfp4Fp8Dense, kFp8, kModelOptNvfp4 };
std::vector<std::string> synth_layout_names();
Expected<SynthLayout> parse_synth_layout(std::string_view name);
std::string_view synth_layout_name(SynthLayout layout);

// How synth fills a tensor.
enum class SynthFill : uint8_t {
  kUniformBf16,   // uniform in [center - half, center + half], as BF16
  kUniformF32,    // same, F32
  kRandomBytes,   // NVFP4 packed codes: any nibble is a valid E2M1 code
  kFp8Codes,      // E4M3 codes of uniform values in ±112 (never NaN)
  kE4M3Scales,    // positive E4M3 values in [16, 240]
  kConstantF32,   // every element = center
};

struct SynthTensor {
  TensorSpec spec;
  SynthFill fill = SynthFill::kUniformBf16;
  float center = 0.0f;
  float half = 0.0f;
  bool mtp = false;  // goes to model_mtp.safetensors
  uint64_t nbytes() const;
};

struct SynthPlan {
  ModelLike model;
  SynthLayout layout = SynthLayout::kBf16;
  std::vector<SynthTensor> tensors;    // in file order
  nlohmann::json config;               // config.json
  nlohmann::json generation_config;    // generation_config.json
  nlohmann::json hf_quant_config;      // hf_quant_config.json; null when the layout has none
};

SynthPlan synth_plan(const ModelLike& model, SynthLayout layout);

// The tensors of a plan as TensorInfo (file empty, offsets 0): enough for plan_module_formats and
// byte budgets without writing anything (`inspect --like`).
std::map<std::string, TensorInfo> synth_tensor_infos(const SynthPlan& plan);

struct SynthOptions {
  std::filesystem::path out;
  uint64_t shard_bytes = 5'000'000'000ull;  // a new shard starts before a tensor that would cross this
  uint64_t seed = 0;
  int threads = 0;  // 0 = hardware concurrency
  // Called now and then with (bytes written, bytes total).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct SynthStats {
  uint64_t bytes = 0;  // tensor data bytes written
  double seconds = 0;
  std::vector<std::filesystem::path> files;  // safetensors files written
};

// Writes the checkpoint into `out` (created if missing). Refuses a folder that already holds
// *.safetensors files (a stale shard would be indexed with the new ones).
Expected<SynthStats> write_synth_checkpoint(const SynthPlan& plan, const SynthOptions& options);

}  // namespace sparkserve
