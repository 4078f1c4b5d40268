// Backend::run_branches on CUDA: independent op sequences of one layer (the routed experts beside
// the shared expert, projections of one input) forked onto side streams. Inside a CUDA graph
// capture the fork / join events become graph edges, so a replay runs the branches as parallel
// paths; op by op they overlap the same way. Why: at batch 1 most of these ops are latency-bound
// (a few µs for a few MB, docs/performance.md), so one alone leaves most of the GPU idle.
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

void CudaBackend::run_branches(const std::vector<std::function<void()>>& branches) {
  // Nested calls and the opt-out run in order on the current stream.
  if (!branches_concurrent_ || in_branches_ || branches.size() < 2) {
    for (const auto& b : branches) b();
    return;
  }
  const size_t sides = branches.size() - 1;
  if (!fork_) CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  while (side_.size() < sides) {
    SideStream s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    side_.push_back(s);
  }
  const cudaStream_t origin = stream_;
  CUDA_CHECK(cudaEventRecord(fork_, origin));
  for (size_t i = 0; i < sides; ++i) CUDA_CHECK(cudaStreamWaitEvent(side_[i].stream, fork_, 0));
  in_branches_ = true;
  branches[0]();
  for (size_t i = 0; i < sides; ++i) {
    stream_ = side_[i].stream;
    branches[i + 1]();
    CUDA_CHECK(cudaEventRecord(side_[i].done, stream_));
  }
  stream_ = origin;
  in_branches_ = false;
  for (size_t i = 0; i < sides; ++i) CUDA_CHECK(cudaStreamWaitEvent(origin, side_[i].done, 0));
}

}  // namespace sparkserve
