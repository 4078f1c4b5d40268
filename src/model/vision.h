// The Qwen3.5 vision tower (model-qwen35.md §5.2; transformers' Qwen3_5VisionModel), written once
// against the backend ops: patch embedding (the Conv3d as a matrix), the bilinearly interpolated
// learned position grid, depth x [LayerNorm, attention with 2-D rotary inside each image, LayerNorm,
// GELU MLP], and the 2x2 patch merger into the text model's hidden size.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "loader/vision_config.h"
#include "loader/vision_weights.h"
#include "media/preprocess.h"

namespace sparkserve {

class VisionTower {
 public:
  VisionTower(Backend& backend, const VisionConfig& config, const VisionWeights& weights);

  // images (each [t*h*w, patch_dim] in merge-block order) -> out: [sum of image tokens, out_hidden]
  // f32 in backend memory, the images' merged tokens in order. Images must have been preprocessed
  // with this tower's patch / merge / temporal sizes (checked).
  Expected<Buffer> encode(const std::vector<const media::PatchedImage*>& images);

 private:
  Buffer buffer(std::vector<int64_t> shape, DType dtype = DType::kF32) {
    return Buffer(&backend_, dtype, std::move(shape));
  }

  Backend& backend_;
  VisionConfig c_;
  const VisionWeights& w_;
  Buffer rope_axis_, rope_inv_freq_;  // [hd/2]: row axis for the first hd/4 pairs, column after
};

// Per-patch position data of images in merge-block order (what transformers' vision_utils computes).
struct VisionPositions {
  std::vector<int32_t> rowcol;      // [N, 2]: patch row, patch column
  std::vector<int32_t> interp_ids;  // [N, 4]: rows of the pos_embed grid (bilinear, align_corners)
  std::vector<float> interp_w;      // [N, 4]
  std::vector<int64_t> segments;    // attention segments: h*w patches per image and frame
};
VisionPositions vision_positions(const std::vector<const media::PatchedImage*>& images, int merge, int grid_side);

}  // namespace sparkserve
