// The real Qwen3.5 dimensions (model-qwen35.md §1) as ModelConfig factories, and the full list of
// checkpoint parameters (names, shapes, dtypes of the BF16 original, §3) those dimensions imply.
// Used by `sparkserve synth` (to write checkpoints), `sparkserve inspect --like` (to budget bytes
// without files) and tests.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "loader/hf_config.h"

namespace sparkserve {

// Vision tower (Qwen3-VL style ViT); ModelConfig covers only the text model.
struct VisionShape {
  int depth = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int intermediate_size = 0;
  int out_hidden_size = 0;
  int in_channels = 3;
  int patch_size = 16;
  int temporal_patch_size = 2;
  int spatial_merge_size = 2;
  int num_position_embeddings = 0;
};

struct ModelLike {
  std::string name;  // "qwen3.5-122b-a10b", "qwen3.5-35b-a3b", "tiny"
  ModelConfig text;
  VisionShape vision;
  int full_attention_interval = 4;
};

// Names accepted by `--like`.
std::vector<std::string> known_model_names();
// The dimensions of a known model; an error lists the known names.
Expected<ModelLike> model_like(std::string_view name);
// Smaller vocabulary or depth (tests, server tests with a real tokenizer's vocabulary). layer_types is
// recomputed with the model's full_attention_interval (layer i is full attention iff (i+1) % 4 == 0).
Status resize_model(ModelLike& model, std::optional<int> vocab_size, std::optional<int> num_layers);

// Where a parameter belongs, for byte budgets.
enum class Component : uint8_t {
  kRoutedExperts,
  kSharedExpert,  // shared expert MLP (not its gate)
  kAttention,     // full-attention q/k/v/o
  kGdn,           // Gated DeltaNet projections (in_proj_*, out_proj)
  kRouter,        // mlp.gate and mlp.shared_expert_gate
  kEmbeddings,
  kLmHead,
  kVision,
  kMtp,
  kNormsOther,    // norms, conv1d, A_log, dt_bias
  kDenseMlp,      // dense MLP (qwen3_5 dense models: mlp.{gate,up,down}_proj)
};
inline constexpr int kNumComponents = 11;
std::string_view component_name(Component c);
// From a module or tensor name in the HF checkpoint namespace (model.language_model.*, model.visual.*,
// mtp.*, lm_head); tolerant of the vLLM-style prefixes too.
Component component_of(std::string_view name);

enum class ParamKind : uint8_t {
  kLinear,        // [N, K] weight of an nn.Linear (quantizable)
  kFusedExperts,  // [E, N, K] fused expert weights (experts.gate_up_proj / experts.down_proj)
  kEmbedding,     // [rows, dim] lookup table
  kOther,         // norms, biases, conv weights, A_log, dt_bias
};

struct ParamShape {
  std::string name;    // full tensor name
  std::string module;  // module name: name minus ".weight"/".bias"; bare parameters keep their name
  ParamKind kind = ParamKind::kOther;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  bool mtp = false;    // stored in the separate MTP file
};

// Every parameter of the checkpoint in model order: text model (routed experts per expert
// `mlp.experts.{e}.{gate,up,down}_proj.weight` when per_expert_layout, else fused 3-D), lm_head,
// vision tower, then MTP (always fused experts: MTP weights are copied from the BF16 original).
std::vector<ParamShape> model_params(const ModelLike& model, bool per_expert_layout);

}  // namespace sparkserve
