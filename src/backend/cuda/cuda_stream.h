// Host-only access to the CUDA backend's stream for code compiled without nvcc (tests/gpu's kernel
// benchmark times the ops with CUDA events and graph capture on that stream). cuda_backend.h itself
// holds device helpers and is for the .cu files only.
#pragma once

#include <cuda_runtime_api.h>

namespace sparkserve {
class Backend;
// The stream every op of a CUDA backend runs on; null when `b` is not the CUDA backend.
cudaStream_t cuda_stream_of(Backend& b);
}  // namespace sparkserve
