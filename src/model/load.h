// Opening a model folder: config.json + safetensors -> a Qwen35Model on a backend.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/load_options.h"
#include "model/qwen35.h"

namespace sparkserve {

// Loads config and weights; `notes` receives the loader's one-line notes (unused vision / MTP
// tensors, unexpected tensors) for the caller to print. `options`: the host staging budget the
// weights stream through, page-cache dropping and the progress line (loader/load_options.h).
Expected<std::unique_ptr<Qwen35Model>> load_qwen35(const std::filesystem::path& dir, Backend& backend,
                                                   std::vector<std::string>* notes = nullptr,
                                                   const LoadOptions& options = {});

}  // namespace sparkserve
