// config.json -> ModelConfig for `qwen3_5_moe` and `qwen3_5` (dense), in both the
// *ForConditionalGeneration layout (nested text_config) and the flat *ForCausalLM layout.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/vision_config.h"

namespace sparkserve {

enum class LayerType { kLinearAttention, kFullAttention };

struct ModelConfig {
  std::string model_type;        // "qwen3_5_moe" or "qwen3_5" (outer model_type)
  std::string architecture;      // architectures[0], e.g. Qwen3_5MoeForConditionalGeneration
  bool is_moe = false;           // routed experts + shared expert on every layer
  bool nested_text_config = false;

  int hidden_size = 0;
  int num_hidden_layers = 0;
  int vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  std::vector<LayerType> layer_types;  // size num_hidden_layers

  // Full (gated) attention.
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  bool attn_output_gate = true;
  double rope_theta = 1e7;
  float partial_rotary_factor = 0.25f;
  std::vector<int> mrope_section;  // e.g. [11, 11, 10]; empty when absent
  bool mrope_interleaved = false;
  int max_position_embeddings = 0;

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;

  // MoE (qwen3_5_moe).
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  // Dense MLP (qwen3_5).
  int intermediate_size = 0;

  int mtp_num_hidden_layers = 0;
  std::vector<int> eos_token_ids;  // from text_config / top level, may be empty
  std::optional<int> bos_token_id;

  VisionConfig vision;  // vision.present: config.json has a vision tower (loader/vision_config.h)

  // Derived sizes.
  int rotary_dim() const { return static_cast<int>(head_dim * partial_rotary_factor); }
  int gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
};

// Parses and validates `dir`/config.json. Errors name the key that is missing, mistyped or out of
// range (e.g. "config.json: text_config.num_attention_heads must be a positive integer").
Expected<ModelConfig> load_model_config(const std::filesystem::path& dir);
// Same, from JSON text (for tests and fuzzing); `source` names it in messages.
Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace sparkserve
