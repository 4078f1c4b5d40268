// The Qwen2-VL / Qwen3.5 image processor (transformers' Qwen2VLImageProcessor, torchvision backend):
// smart_resize to multiples of patch x merge within [min_pixels, max_pixels], antialiased bicubic
// resize (media/resize.h), (x - 255·mean) / (255·std) in fp32, the frame repeated
// temporal_patch_size times, and patches in merge-block order.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "media/image.h"

namespace sparkserve::media {

struct PreprocessorConfig {
  int64_t min_pixels = 65536;     // size.shortest_edge (or min_pixels)
  int64_t max_pixels = 16777216;  // size.longest_edge (or max_pixels)
  int patch_size = 16;
  int temporal_patch_size = 2;
  int merge_size = 2;
  std::array<float, 3> image_mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> image_std{0.5f, 0.5f, 0.5f};
  double rescale_factor = 1.0 / 255.0;
  int factor() const { return patch_size * merge_size; }
};

// Parses preprocessor_config.json text. Unknown keys are ignored; options this implementation does
// not have (resample other than bicubic, do_resize/do_rescale/do_normalize false) are errors that
// name the key.
Expected<PreprocessorConfig> parse_preprocessor_config(const std::string& json_text, const std::string& source);
// dir/preprocessor_config.json, or `fallback` when the file does not exist.
Expected<PreprocessorConfig> load_preprocessor_config(const std::filesystem::path& dir,
                                                      const PreprocessorConfig& fallback);

// transformers' smart_resize: (height, width) of the resized image. Error for an aspect ratio above
// 200 or an image that would resize to nothing.
Expected<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor,
                                                   int64_t min_pixels, int64_t max_pixels);

// One image as the vision tower takes it.
struct PatchedImage {
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;  // in patches
  int64_t patch_dim = 0;                       // channels * temporal_patch_size * patch_size^2
  std::vector<float> pixels;                   // [grid_t*grid_h*grid_w, patch_dim]
  uint64_t content_hash = 0;                   // of the resized pixels and the preprocessing (see below)
  int64_t num_patches() const { return grid_t * grid_h * grid_w; }
  // Tokens the image takes in the prompt (one per merge x merge block).
  int64_t num_tokens(int merge_size) const { return num_patches() / (int64_t{merge_size} * merge_size); }
};

PatchedImage preprocess_image(const RgbImage& image, const PreprocessorConfig& config, int64_t resized_height,
                              int64_t resized_width);
// smart_resize + preprocess_image.
Expected<PatchedImage> preprocess_image(const RgbImage& image, const PreprocessorConfig& config);

}  // namespace sparkserve::media
