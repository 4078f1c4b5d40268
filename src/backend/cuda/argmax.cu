// Backend::argmax: the greedy pick of every row of the logits, with the first NaN / +Inf column.
//
// A row is 248,320 floats (1 MB): one block per row leaves it latency-bound on one SM (~400 us per
// row on the H200), so each row is split over many blocks of kArgmaxCols columns; each block folds
// its columns into one 64-bit key and merges it into the row's result with one atomicMax. The key
// orders (value, index) in one integer compare: the value's bits made monotonic in the high word,
// the inverted index in the low word, so equal maxima keep the lowest index (as the CPU's argmax)
// whatever order the blocks merge in. The first non-finite column merges the same way (inverted).
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kArgmaxThreads = 256;
constexpr int64_t kArgmaxCols = 4096;  // 16 columns per thread: 4 float4 loads in flight each

struct ArgmaxAcc {  // a row's result while blocks merge; all zero = nothing seen yet
  unsigned long long key;
  unsigned int bad_inv;  // 0xffffffff - first non-finite column
  unsigned int pad;
};

__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // order-preserving map of floats to unsigned
  return (static_cast<unsigned long long>(b) << 32) | static_cast<uint32_t>(0x7fffffff - static_cast<int32_t>(i));
}

// grid (column blocks, rows). kVec: the row stride is a multiple of 4 floats, so float4 loads are
// aligned.
template <bool kVec>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(ArgmaxAcc* acc, const float* logits, int64_t V,
                                                                 int64_t vocab, const int32_t* excluded,
                                                                 int num_excluded) {
  const float* row = logits + blockIdx.y * V;
  __shared__ int32_t ex[kArgmaxMaxExcluded];  // a few stop ids, compared with every column
  for (int j = threadIdx.x; j < num_excluded; j += blockDim.x) ex[j] = excluded[j];
  __syncthreads();
  unsigned long long best = 0;  // below every key of a real column
  int32_t bad = 0x7fffffff;
  const auto visit = [&](float v, int64_t i) {
    if (isnan(v) || v == INFINITY) bad = min(bad, static_cast<int32_t>(i));
    bool out_of_play = isnan(v);
    for (int j = 0; j < num_excluded; ++j) out_of_play = out_of_play || ex[j] == static_cast<int32_t>(i);
    if (!out_of_play) {
      const unsigned long long k = argmax_key(v, i);
      if (k > best) best = k;
    }
  };
  const int64_t lo = blockIdx.x * kArgmaxCols, hi = min(vocab, lo + kArgmaxCols);
  if (kVec) {
    constexpr int kPer = static_cast<int>(kArgmaxCols / (4 * kArgmaxThreads));
    float4 q[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {  // all loads first: the block's columns in flight at once
      const int64_t i = lo + 4 * (u * kArgmaxThreads + threadIdx.x);
      q[u] = i + 3 < hi ? *reinterpret_cast<const float4*>(row + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int64_t i = lo + 4 * (u * kArgmaxThreads + threadIdx.x);
      if (i + 3 < hi) {
        visit(q[u].x, i), visit(q[u].y, i + 1), visit(q[u].z, i + 2), visit(q[u].w, i + 3);
      } else {
        for (int64_t c = i; c < hi; ++c) visit(row[c], c);
      }
    }
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) visit(row[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    bad = min(bad, __shfl_xor_sync(0xffffffffu, bad, o));
  }
  __shared__ unsigned long long sk[kArgmaxThreads / 32];
  __shared__ int32_t sb[kArgmaxThreads / 32];
  if (threadIdx.x % 32 == 0) sk[threadIdx.x / 32] = best, sb[threadIdx.x / 32] = bad;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) best = max(best, sk[w]), bad = min(bad, sb[w]);
    if (best != 0) atomicMax(&acc[blockIdx.y].key, best);
    if (bad != 0x7fffffff) atomicMax(&acc[blockIdx.y].bad_inv, 0xffffffffu - static_cast<uint32_t>(bad));
  }
}

}  // namespace

std::vector<RowArgmax> CudaBackend::argmax(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  CHECK(vocab >= 1 && vocab <= V);
  CHECK(excluded.size() <= kArgmaxMaxExcluded);
  CHECK(R <= 65535);  // rows are the grid's y dimension
  std::vector<RowArgmax> out(static_cast<size_t>(R));
  if (R == 0) return out;
  Scratch dev(this, static_cast<size_t>(R) * sizeof(ArgmaxAcc));
  CUDA_CHECK(cudaMemsetAsync(dev.ptr, 0, static_cast<size_t>(R) * sizeof(ArgmaxAcc), stream_));
  // No excluded ids (the common greedy step): no upload, the kernel reads none.
  Scratch ex = excluded.empty() ? Scratch() : upload_scratch(excluded.data(), excluded.size() * sizeof(int32_t));
  const dim3 grid(static_cast<unsigned>((vocab + kArgmaxCols - 1) / kArgmaxCols), static_cast<unsigned>(R));
  const bool vec = V % 4 == 0 && reinterpret_cast<uintptr_t>(logits.ptr<const float>()) % 16 == 0;
  (vec ? argmax_kernel<true> : argmax_kernel<false>)<<<grid, kArgmaxThreads, 0, stream_>>>(
      dev.as<ArgmaxAcc>(), logits.ptr<const float>(), V, vocab, ex.as<const int32_t>(), static_cast<int>(excluded.size()));
  CUDA_CHECK_LAUNCH();
  std::vector<ArgmaxAcc> acc(static_cast<size_t>(R));
  CUDA_CHECK(cudaMemcpyAsync(acc.data(), dev.ptr, acc.size() * sizeof(ArgmaxAcc), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t r = 0; r < acc.size(); ++r) {
    out[r].id = acc[r].key == 0 ? 0 : 0x7fffffff - static_cast<int32_t>(acc[r].key & 0xffffffffu);
    out[r].nonfinite = acc[r].bad_inv == 0 ? -1 : static_cast<int32_t>(0xffffffffu - acc[r].bad_inv);
  }
  return out;
}

}  // namespace sparkserve
