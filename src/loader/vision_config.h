// config.json's `vision_config` and the multimodal token ids (model-qwen35.md §1.2, §5) -> VisionConfig.
#pragma once

#include <string>

#include "core/status.h"

namespace sparkserve {

struct VisionConfig {
  bool present = false;  // config.json has a vision_config
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
  bool gelu_tanh = true;      // hidden_act gelu_pytorch_tanh (else exact gelu)
  double rope_theta = 10000;  // rope_parameters.rope_theta (transformers' default for the axial rope)
  int image_token_id = 248056;
  int video_token_id = 248057;
  int vision_start_token_id = 248053;
  int vision_end_token_id = 248054;

  int head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
  int patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int merge_unit() const { return spatial_merge_size * spatial_merge_size; }
};

// From the parsed top-level JSON text of config.json (`source` names it in messages). A config
// without vision_config, or whose out_hidden_size differs from `text_hidden_size`, gives
// present == false (a text-only model). Absent sizes take transformers' defaults. Errors name the
// key: a non-positive size, a head count that does not divide hidden_size, deepstack layers (not
// implemented).
Expected<VisionConfig> parse_vision_config(const std::string& json_text, const std::string& source,
                                           int text_hidden_size);

}  // namespace sparkserve
