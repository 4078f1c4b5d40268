// The epilogue of the W8A8 kernels that split K over the blocks of a thread-block cluster
// (fp8_small_n.cu, fp8_few_tokens.cu): each block has written its partial sums of the row block's
// outputs into its own shared memory; block `split` of the S adds its share of the [T, kRowsPerBlock]
// outputs over the S blocks in split order (0 + p0 + p1 + ...: deterministic) through distributed
// shared memory, then scales and stores them.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

namespace sparkserve {

// part: this block's partial sums [T][kPartLd] (shared memory; the same offset in every block of the
// cluster), scale_s: [T] activation scales, ws: [rows] weight scales -> out [T, ldo] rows
// row_base .. row_base + kRowsPerBlock (those < rows).
template <int kThreads, int kRowsPerBlock, int kPartLd, int kMaxSplits>
__device__ __forceinline__ void cluster_split_sum_store(const cooperative_groups::cluster_group& cluster,
                                                        float* part, int S, int split, int T, int tid,
                                                        int64_t row_base, int64_t rows, float* out, int64_t ldo,
                                                        const float* scale_s, const float* ws) {
  cluster.sync();  // every block's partial sums written
  // Block `split` adds its share of the [T, 128] outputs: elements e0..e1 (row fastest: coalesced).
  const int E = T * kRowsPerBlock, per = (E + S - 1) / S;
  const int e1 = min(E, (split + 1) * per);
  for (int e = split * per + tid; e < e1; e += kThreads) {
    const int t = e / kRowsPerBlock, lr = e % kRowsPerBlock;
    float v[kMaxSplits];
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r) v[r] = r < S ? *cluster.map_shared_rank(part + t * kPartLd + lr, r) : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r)
      if (r < S) sum += v[r];
    const int64_t n = row_base + lr;
    if (n < rows) out[t * ldo + n] = sum * (scale_s[t] * ws[n]);
  }
  cluster.sync();  // no block leaves while another reads its shared memory
}

}  // namespace sparkserve
