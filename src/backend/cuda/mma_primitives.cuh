// Tensor-core building blocks of the mma.sync kernels: asynchronous global->shared copies,
// ldmatrix, the m16n8k16 bf16 and f16 MMAs with f32 accumulators, and the hi/lo bf16 split of f32 values.
// sm_80+ instructions: they run on sm_90a, sm_100a and sm_120a alike.
//
// The split: hi = bf16(x), lo = bf16(x - hi) carries ~16 significant bits (|x - hi - lo| <= 2^-17 |x|),
// so products of split operands taken as hi·hi + hi·lo + lo·hi are within ~2^-16 of the f32
// products, where one bf16 operand alone would be off by up to 2^-9.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sparkserve {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronous; src_bytes 0 writes zeros (and reads nothing).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
// 4 bytes global -> shared, asynchronous; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes = 4) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most `pending` committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a b: m16n8k16, f32 accumulators (PTX fragment layouts); bf16 operands, or f16 ones (kF16: the
// W8A8 kernels' exact E4M3 values).
template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#define SPARKSERVE_MMA_16816(type)                                                                               \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                                            \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                         \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (kF16)
    SPARKSERVE_MMA_16816("f16");
  else
    SPARKSERVE_MMA_16816("bf16");
#undef SPARKSERVE_MMA_16816
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_16816<false>(d, a, b0, b1);
}
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_16816<true>(d, a, b0, b1);
}
// d += a b: m16n8k8, bf16 operands, f32 accumulators (a: rows g / g + 8, columns 2 t4 + {0, 1}).
__device__ __forceinline__ void mma_bf16_1688(float (&d)[4], const uint32_t (&a)[2], uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b0));
}
// bf16(x0), bf16(x1) (round to nearest even) packed in a pair, x0 in the low half: one packing
// conversion.
__device__ __forceinline__ uint32_t bf16x2_rn(float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// x0, x1 split into hi = bf16(x) and lo = bf16(x - hi), packed in pairs (x0 in the low half). Both
// pairs by the packing conversion (one instruction a pair; single conversions run on the quarter-rate
// XU pipe, which the attention kernels' softmax also needs for its exponentials).
__device__ __forceinline__ void split_pack(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace sparkserve
