// `--image FILE` (repeatable) of generate and logits: each file decoded and preprocessed with the
// model folder's preprocessor_config.json, and each image token of the prompt ids expanded into its
// image's merged-patch count (as transformers' processor expands <|image_pad|>).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/qwen35.h"
#include "server/image_input.h"

namespace sparkserve::cli {

// ids: in, one config.image_token_id per image; out, expanded. Null when `images` is empty.
Expected<std::unique_ptr<MultimodalPrompt>> load_cli_images(const std::string& model_dir, const Qwen35Model& model,
                                                            const std::vector<std::string>& images,
                                                            std::vector<int32_t>& ids);

// serve's image flags (vLLM's names where vLLM has the flag).
struct ServeImageFlags {
  std::string allowed_local_media_path;
  std::string limit_mm_per_prompt;
  std::string mm_processor_kwargs;
  int64_t max_image_pixels = ImageInputOptions{}.max_image_pixels;
};
void add_serve_image_flags(CLI::App* cmd, ServeImageFlags& f);
// What image parts of requests may use, from the flags and the model (its config.json's
// vision_config, its folder's preprocessor_config.json). Errors name the flag.
// config.vision.present stands for the tower (the loader loads it wherever the config has one and the
// checkpoint holds it; a checkpoint without its tensors fails such a request with the model's error).
Expected<ImageInputOptions> serve_image_options(const std::string& model_dir, const ModelConfig& config,
                                                const ServeImageFlags& f);

}  // namespace sparkserve::cli
