// gpu_ops --bench-kernels --bench-filter state_restore: a prefix-cache snapshot restore at the
// 35B-A3B shapes (30 GDN layers' conv [8192, 3] and recurrent [32, 128, 128] f32 rows, 10 attention
// layers' K and V blocks [16, 2, 256] bf16: 80 copies, 62 MB) as one Backend::copy_batch, against one
// cudaMemcpyAsync per copy (what the model runner issued before copy_batch). host us: the wall time
// of issuing it, which a later agent turn waits before its forward is launched; GPU us: events around
// it on the stream. Medians of 30.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_stream.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

void check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s in state_restore bench\n", cudaGetErrorName(e));
    std::exit(1);
  }
}

// Median host and GPU microseconds of issue().
std::pair<double, double> time_issue(Backend& gpu, const std::function<void()>& issue) {
  const cudaStream_t s = cuda_stream_of(gpu);
  cudaEvent_t a, b;
  check(cudaEventCreate(&a));
  check(cudaEventCreate(&b));
  std::vector<double> host, dev;
  for (int r = 0; r < 33; ++r) {
    gpu.synchronize();
    check(cudaEventRecord(a, s));
    const auto t0 = std::chrono::steady_clock::now();
    issue();
    const auto t1 = std::chrono::steady_clock::now();
    check(cudaEventRecord(b, s));
    check(cudaEventSynchronize(b));
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b));
    if (r < 3) continue;  // warm-up
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    dev.push_back(1e3 * ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(host.begin(), host.end());
  std::sort(dev.begin(), dev.end());
  return {host[host.size() / 2], dev[dev.size() / 2]};
}

void bench_state_restore(Backend& gpu) {
  std::vector<Buffer> pools;
  for (int l = 0; l < 30; ++l) {
    pools.emplace_back(&gpu, DType::kF32, std::vector<int64_t>{2, 8192, 3});
    pools.emplace_back(&gpu, DType::kF32, std::vector<int64_t>{2, 32, 128, 128});
  }
  for (int l = 0; l < 20; ++l) pools.emplace_back(&gpu, DType::kBF16, std::vector<int64_t>{2, 16, 2, 256});
  std::vector<TensorCopy> copies;
  double bytes = 0;
  for (const Buffer& p : pools) {
    gpu.fill_zero(p.tensor());
    copies.push_back({p.tensor().rows(0, 1), p.tensor().rows(1, 1)});
    bytes += static_cast<double>(copies.back().dst.nbytes());
  }
  const cudaStream_t s = cuda_stream_of(gpu);
  const auto [batch_host, batch_gpu] = time_issue(gpu, [&] { gpu.copy_batch(copies); });
  const auto [each_host, each_gpu] = time_issue(gpu, [&] {
    for (const TensorCopy& c : copies)
      check(cudaMemcpyAsync(c.dst.data, c.src.data, c.dst.nbytes(), cudaMemcpyDeviceToDevice, s));
  });
  std::printf("%-44s %9s %9s %9s\n", "state_restore (35B: 80 copies)", "MB", "host us", "GPU us");
  std::printf("%-44s %9.1f %9.1f %9.1f\n", "  copy_batch (one launch)", bytes / 1e6, batch_host, batch_gpu);
  std::printf("%-44s %9.1f %9.1f %9.1f\n", "  one cudaMemcpyAsync per copy", bytes / 1e6, each_host, each_gpu);
}

RegisterKernelBench register_state_restore_bench("state_restore", bench_state_restore);

}  // namespace
}  // namespace sparkserve
