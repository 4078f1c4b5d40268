#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"

namespace sparkserve {

#ifdef SPARKSERVE_WITH_CUDA
// Defined in backend/cuda/memory.cu.
Expected<std::unique_ptr<Backend>> make_cuda_backend_on(int device);
int64_t cuda_pool_peak_bytes();
#endif

int64_t backend_peak_memory_bytes(const Backend& b) {
#ifdef SPARKSERVE_WITH_CUDA
  if (b.device() == Device::kCuda) return cuda_pool_peak_bytes();
#endif
  return -1;
}

bool build_has_cuda() {
#ifdef SPARKSERVE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") {
#ifdef SPARKSERVE_WITH_CUDA
    return make_cuda_backend_on(0);
#else
    return make_error("this build has no CUDA backend (configure with -DSPARKSERVE_CUDA=ON)");
#endif
  }
  return make_error("unknown device '" + name + "' (expected cpu or cuda)");
}

}  // namespace sparkserve
