// Where a model named on the command line lives, and vLLM-style size arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace sparkserve {

struct ModelLocation {
  std::string dir;   // the folder to load
  std::string note;  // how it was found, when not given as a folder ("" otherwise)
};

// `model` as a folder (must hold config.json), or a Hugging Face id ("Qwen/Qwen3.5-35B-A3B")
// already downloaded into the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
// ~/.cache/huggingface/hub: the snapshot that refs/main names, else the newest). Nothing is
// downloaded; errors say what to run instead.
Expected<ModelLocation> resolve_model_dir(const std::string& model);

// A token count as vLLM takes it: "32768", "32k" (x1000), "32K" (x1024), "1m"/"1M", "25.6k";
// -1 stays -1 (vLLM's "as large as the model allows"). `flag` names the option in errors.
Expected<int64_t> parse_token_count(std::string_view text, std::string_view flag);

}  // namespace sparkserve
