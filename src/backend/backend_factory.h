// Picks a backend by name for the CLI and tests: "cpu" always exists; "cuda" exists when the build
// has the CUDA backend (SPARKSERVE_CUDA=ON) and a device is present.
#pragma once

#include <memory>
#include <string>

#include "backend/ops.h"
#include "core/status.h"

namespace sparkserve {

// threads: CPU worker threads (ignored by CUDA). Errors: unknown name, "this build has no CUDA
// backend", "no CUDA device (...)".
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, int threads);

// Whether this binary was built with the CUDA backend.
bool build_has_cuda();

// The most device memory the backend's buffers have held at once, in bytes (CUDA: the memory
// pool's high-water mark); -1 where not tracked (CPU).
int64_t backend_peak_memory_bytes(const Backend& b);

}  // namespace sparkserve
