// Quantization configs as real tools write them, parsed into what each config group (or ModelOpt
// algorithm) asks of the modules it covers:
// - compressed-tensors: config.json `quantization_config` {quant_method: "compressed-tensors",
//   format, config_groups{targets, weights, input_activations, format}, ignore, kv_cache_scheme,
//   transform_config} (checkpoint-formats.md §3);
// - ModelOpt: hf_quant_config.json {producer, quantization{quant_algo, group_size, exclude_modules,
//   kv_cache_quant_algo, quantized_layers}} or config.json quantization_config {quant_method:
//   "modelopt", ...} (§5).
// Schemes this engine cannot execute (integer, MXFP4, FP8 block, asymmetric, transforms, sparsity)
// are refused here with the reason, before any tensor is read.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "loader/weight_format.h"

namespace sparkserve {

enum class QuantMethod : uint8_t { kNone, kCompressedTensors, kModelOpt };

enum class QuantStrategy : uint8_t { kTensor, kChannel, kGroup, kBlock, kToken, kTensorGroup, kAttnHead };
std::string_view quant_strategy_name(QuantStrategy s);

// compressed-tensors `dynamic`: false, true, or "local" (only the local block scales are dynamic,
// the global scale is static).
enum class DynamicKind : uint8_t { kStatic, kDynamic, kLocal };

// compressed-tensors QuantizationArgs (the fields a loader needs).
struct QuantArgs {
  int num_bits = 8;
  bool is_float = false;  // type "float" (else "int")
  bool symmetric = true;
  std::optional<int> group_size;
  QuantStrategy strategy = QuantStrategy::kTensor;
  DynamicKind dynamic = DynamicKind::kStatic;
  std::vector<int> block_structure;
};

// What a config asks a module to hold.
struct QuantScheme {
  bool quantized = false;  // false: the module stays in its original dtype (format "dense")
  WeightFormat weight = WeightFormat::kBf16;
  ActivationQuant activation = ActivationQuant::kNone;
  std::string description;  // e.g. "nvfp4-pack-quantized W4A4", "float-quantized FP8 channel, dynamic per-token"
};

struct QuantGroup {
  std::string name;                  // config_groups key
  std::vector<std::string> targets;  // class names ("Linear") or names / "re:" regexes
  std::string format;                // the group's format, else the global one (may be inferred)
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  QuantScheme scheme;
};

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  std::string source;  // where it came from, for messages

  // compressed-tensors
  std::string format;               // global format
  std::string quantization_status;  // "compressed", ...
  std::vector<QuantGroup> groups;   // in config order (matters for vLLM's first-match rule)
  std::vector<std::string> ignore;
  std::optional<QuantArgs> kv_cache;

  // ModelOpt
  std::string quant_algo;  // NVFP4, W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN, MIXED_PRECISION
  std::string producer;    // producer.name (+ version)
  int group_size = 16;
  std::vector<std::string> exclude_modules;  // fnmatch wildcards
  QuantScheme modelopt_scheme;               // for every non-excluded Linear (unless MIXED_PRECISION)
  std::vector<std::pair<std::string, QuantScheme>> quantized_layers;  // MIXED_PRECISION, in file order
  std::string kv_cache_quant_algo;           // "" when null
};

// Reads `dir`/config.json (quantization_config) and `dir`/hf_quant_config.json when present. A folder
// with neither gives method kNone. Errors name the file and key.
Expected<QuantConfig> load_quant_config(const std::filesystem::path& dir);
// From parsed JSON: `config` is config.json's root object (may be null), `hf_quant_config` the
// hf_quant_config.json root (null when the file is absent). Key order matters (config_groups order
// decides vLLM's first match), hence ordered_json; the json overload re-reads its text in order.
Expected<QuantConfig> parse_quant_config(const nlohmann::ordered_json& config, const nlohmann::ordered_json& hf_quant_config);
Expected<QuantConfig> parse_quant_config(const nlohmann::json& config, const nlohmann::json& hf_quant_config);
// Same from JSON text (tests); empty text = absent file.
Expected<QuantConfig> parse_quant_config_text(const std::string& config_json, const std::string& hf_quant_config_json);

}  // namespace sparkserve
