// serve's image options: the flags (vLLM's names where vLLM has the flag) and what requests' image
// parts may then use (server/image_input.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "loader/hf_config.h"
#include "server/image_input.h"

namespace sparkserve::cli {

// The flags as given.
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
