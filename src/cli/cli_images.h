// `--image FILE` (repeatable) of generate and logits: each file decoded and preprocessed with the
// model folder's preprocessor_config.json, and each image token of the prompt ids expanded into its
// image's merged-patch count (as transformers' processor expands <|image_pad|>).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/qwen35.h"

namespace sparkserve::cli {

// ids: in, one config.image_token_id per image; out, expanded. Null when `images` is empty.
Expected<std::unique_ptr<MultimodalPrompt>> load_cli_images(const std::string& model_dir, const Qwen35Model& model,
                                                            const std::vector<std::string>& images,
                                                            std::vector<int32_t>& ids);

}  // namespace sparkserve::cli
