// Device pieces shared by the grouped NVFP4 W4A4 kernels (nvfp4_group_gemm.cu: large N through shared
// memory; nvfp4_group_slice.cu / nvfp4_group_gemv.cu: small N): the E2M1 decode into exact fp16 mma
// operands, the mma, the global factors and the two epilogues.
//
// The weight decode: a 32-bit word holds 8 E2M1 nibbles n0..n7 (n_i = k + i). The fp16 whose bits are
// s·2^15 | eem·2^9 is e2m1·2^-14 exactly (the 0.5 code lands on the fp16 subnormal 2^-15, zero on
// zero); nibbles j and j+4 become the two halves of one word (nibble_pair). One HMUL2 by the row's
// E4M3 block scale (exact in fp16) then gives e2m1·sf·2^-14 exactly: every such product is a multiple
// of 2^-24 with at most 6 significant bits, inside fp16's range. So a word decodes into the pairs
// (n0,n4), (n1,n5), (n2,n6), (n3,n7): one m16n8k16 mma takes pairs (n0,n4) and (n1,n5) of a word (its
// k slots 2t,2t+1 and 2t+8,2t+9), the next (n2,n6) and (n3,n7), against activation values stored in
// the order 0,4,1,5,2,6,3,7 within each 8-group (the prepared layout), so A and B agree on the physical
// k of every slot. Which words a thread holds is each kernel's choice, as long as its activation loads
// follow.
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"
#include "backend/cuda/quant_math.cuh"

namespace sparkserve {

// A work pair: expert, first activation row, rows (at most tile_n). From the device lists, or for
// dense layers (pair_e null) the static tiling of rows [0, dense_rows) of expert 0.
struct WorkPair {
  int64_t e, start;
  int rows;
};
__device__ __forceinline__ int64_t num_work_pairs(const GroupGemmArgs& a, int tile_n) {
  return a.pair_e ? static_cast<int64_t>(*a.num_pairs) : (a.dense_rows + tile_n - 1) / tile_n;
}
__device__ __forceinline__ WorkPair work_pair(const GroupGemmArgs& a, int64_t pair, int tile_n) {
  if (a.pair_e) return {a.pair_e[pair], a.pair_start[pair], a.pair_rows[pair]};
  const int64_t start = pair * tile_n;
  return {0, start, static_cast<int>(min(static_cast<int64_t>(tile_n), a.dense_rows - start))};
}

// Asynchronous global -> shared copies (cp.async): 16 bytes bypassing L1, 4 bytes through it.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The fp16 high bytes (s·2^7 | eem·2: the low byte of e2m1·2^-14 is zero) of a word's eight nibbles,
// built four at a time in byte lanes: lo holds nibbles 0, 2, 4, 6 (each byte's low nibble), hi nibbles
// 1, 3, 5, 7. 7 instructions per word instead of 4 per nibble pair.
struct NibbleBytes {
  uint32_t lo, hi;
};
__device__ __forceinline__ NibbleBytes nibble_bytes(uint32_t w) {
  return {((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu), (w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu)};
}

// Nibbles j and j+4 of w as fp16 e2m1·2^-14 (low half: nibble j): bytes j/2 and j/2 + 2 of nibble_bytes'
// lo (j even) or hi (j odd) moved into the high byte of each half by one byte permute. Callers decoding
// all four pairs of a word share one nibble_bytes (the compiler merges the common subexpression).
template <int J>
__device__ __forceinline__ uint32_t nibble_pair(uint32_t w) {
  const NibbleBytes b = nibble_bytes(w);
  return __byte_perm(J % 2 ? b.hi : b.lo, 0u, J / 2 ? 0x3414u : 0x2404u);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, __half2 b) {
  __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), b);
  return *reinterpret_cast<uint32_t*>(&r);
}

// The A fragment of one mma from one weight word of rows g (w0) and g+8 (w1) with their block scales:
// pairs 2h and 2h+1 (h = 0: nibbles (0,4),(1,5); h = 1: (2,6),(3,7)).
template <int H>
__device__ __forceinline__ void decode_a(uint32_t w0, uint32_t w1, __half2 s0, __half2 s1, uint32_t (&a)[4]) {
  a[0] = hmul2(nibble_pair<2 * H>(w0), s0);
  a[1] = hmul2(nibble_pair<2 * H>(w1), s1);
  a[2] = hmul2(nibble_pair<2 * H + 1>(w0), s0);
  a[3] = hmul2(nibble_pair<2 * H + 1>(w1), s1);
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 bytes (lo, hi) -> (fp16(lo), fp16(hi)), exact.
__device__ __forceinline__ __half2 e4m3x2_to_half2(uint32_t lo, uint32_t hi) {
  const __half l(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(lo), __NV_E4M3));
  const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(hi), __NV_E4M3));
  return __halves2half2(l, h);
}

// The epilogue's factor: 2^14 (the weight decode's) times the weight's and the activation's global
// factors (compressed-tensors divides by its global scales, ModelOpt multiplies).
__device__ __forceinline__ float global_factor(float w_global, float in_scale, bool modelopt) {
  return modelopt ? 16384.0f * w_global * in_scale : 16384.0f / (w_global * in_scale);
}

// e2m1_value(f32_to_e2m1(x)) (quant_math.cuh: core/nvfp4.cpp's threshold table, ties to the even
// mantissa, zero always +0) for x in [-6, 6], by rounding on the E2M1 grid with ties to even: steps of
// 0.5 below 2, of 1 below 4, of 2 from 4 (5 goes to 4). The round is the magic-number add: x + c with c
// = 1.5·2^(22+k) lands in a binade whose spacing is the grid's step 2^(k-1) (k = 0, 1, 2 for |x| below
// 2, below 4, from 4: c's exponent from |x|'s, at least 1's), so the f32 addition rounds x to the grid
// (ties to even), and subtracting c is exact (+0 for a zero result). Checked equal to the table, sign
// of zero included, for every float in [-6, 6] (a host program, and the device check
// e2m1_round_mismatches_probe). 5 instructions (the grid rounding by steps it replaces: ~12).
__device__ __forceinline__ float e2m1_round(float x) {
  const float c = __uint_as_float(max(__float_as_uint(x) & 0x7F800000u, 0x3F800000u) + 0x0B400000u);
  return __fsub_rn(__fadd_rn(x, c), c);
}

// Slot of value i (0..7) of an 8-group in the prepared layout (0,4,1,5,2,6,3,7).
__device__ __forceinline__ int prepared_slot(int i) { return 2 * (i % 4) + i / 4; }

// The chunk-major variant of the prepared layout (GroupTile::kSliceN): within each 128-k chunk the
// sixteen 8-groups, numbered 4t + i (lane t of a quad takes groups 4t .. 4t + 3 of a chunk, one per
// step i), are stored in the order 4i + t, so the four lanes of a quad read 64 contiguous bytes of a row
// per step instead of four 16-byte pieces 64 bytes apart. In odd rows the two 64-byte halves of each
// 128 bytes trade places: the kernel copies a slice of 16 rows into shared memory at a 512-byte stride,
// and the two rows a quarter warp reads per 16-byte load then fall on different banks. Position of
// 8-group `group` of activation row `row`:
__host__ __device__ __forceinline__ int64_t chunk_major_group(int64_t group, int64_t row) {
  return ((group & ~int64_t{15}) | ((group & 3) << 2) | ((group >> 2) & 3)) ^ ((row & 1) << 2);
}

// The activation partition a GEMM reads for weight partition p of expert e: a partition whose input
// scale equals partition 0's quantizes x identically, so the prepare step wrote only partition 0's
// copy. (gate_proj and up_proj read the same x, so calibrated checkpoints usually give them one scale.)
__device__ __forceinline__ int read_partition(const float* in_scale, int64_t e, int P, int p) {
  return p > 0 && in_scale[e * P + p] == in_scale[e * P] ? 0 : p;
}

// gate_up epilogue of one warp's m16 gate tile and the matching up tile (accumulators of kNT n8
// column tiles from column n0; columns >= rows are padding): the down input silu(gate·fg)·(up·fu)
// quantized with the down expert's input scale (quantize direction gs) into act[start + column,
// i_base ..] as fp16 e2m1·sf in the prepared layout. Its 16-blocks run along i: the tile's rows g and
// g+8 of one column, held by the 8 lanes of one t. kChunkMajor: act in the chunk-major layout.
template <int kNT, bool kChunkMajor = false>
__device__ __forceinline__ void store_gate_up(const float (&gate)[kNT][4], const float (&up)[kNT][4], float fg,
                                              float fu, float gs, __half* act, int64_t I, int64_t start,
                                              int64_t i_base, int n0, int rows, int g, int t) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = silu_f(gate[nt][q] * fg) * (up[nt][q] * fu);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float amax = fmaxf(fabsf(v[c]), fabsf(v[c + 2]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
      float sf, out_scale;
      nvfp4_block_scales(amax, gs, sf, out_scale);
      const int col = n0 + nt * 8 + 2 * t + c;
      if (col >= rows) continue;
      __half* arow = act + (start + col) * I + prepared_slot(g);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float q = e2m1_round(fminf(fmaxf(__fmul_rn(v[c + 2 * rr], out_scale), -6.0f), 6.0f));
        const int64_t group = i_base / 8 + rr;
        arow[8 * (kChunkMajor ? chunk_major_group(group, start + col) : group)] = __float2half_rn(q * sf);
      }
    }
  }
}

// Plain epilogue of one m16 tile whose first row is r0: out[out_row(start + column), r0 + ...] = acc·f
// (out_row null: the row start + column itself).
template <int kNT>
__device__ __forceinline__ void store_plain(const float (&acc)[kNT][4], float f, float* out, int64_t ldo,
                                            const int32_t* out_row, int64_t start, int64_t r0, int n0, int rows,
                                            int g, int t) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = n0 + nt * 8 + 2 * t + (q & 1);
      if (col >= rows) continue;
      const int64_t orow = out_row ? out_row[start + col] : start + col;
      out[orow * ldo + r0 + g + (q >= 2 ? 8 : 0)] = acc[nt][q] * f;
    }
}

// ---- The copy-engine ring of the streamed kernel (nvfp4_group_slice.cu): a
// producer lane fills shared-memory stages with bulk copies that complete on a `full` mbarrier; the
// consumer warps release a stage by arriving on its `empty` mbarrier.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared by the copy engine, counted
// on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
// Programmatic dependent launch (PTX griddepcontrol, sm_90+; no-ops for launches that did not ask for
// it): launch_dependents lets the stream's next kernel be scheduled onto SMs this grid frees (the down
// GEMM's weight stream starts under the gate_up GEMM's tail); wait blocks until the previous kernel has
// completed and its writes are visible. Only the consumers wait: the producer reads the work pairs
// (written before the previous kernel started) and the weights.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// The box at (c0 innermost, c1) of a 2-D tensor map (tensor_map.h) into shared memory, counted on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
// L2 policy for the weights: each is read once per call, so they are the first out of L2.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// L2 policy for data several CTAs re-read (the activations): the ordinary priority, above the weights'.
__device__ __forceinline__ uint64_t evict_normal_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Word i of a 16-byte load.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// This lane's operands of one 128-k chunk of its m16 tile: 16 payload bytes of rows g (q0) and g + 8
// (q1) and their two block scales (s0, s1).
struct ChunkOps {
  uint4 q0, q1;
  uint32_t s0, s1;
};
__device__ __forceinline__ ChunkOps load_chunk(const uint8_t* w, int w8, const uint8_t* sc, int s8) {
  return {*reinterpret_cast<const uint4*>(w), *reinterpret_cast<const uint4*>(w + w8),
          *reinterpret_cast<const unsigned short*>(sc), *reinterpret_cast<const unsigned short*>(sc + s8)};
}

// kern<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization (the kernel may
// start under the previous one's tail; its consumers pdl_wait).
template <class Kernel, class... Args>
void launch_with_pdl(Kernel kern, unsigned grid, unsigned block, int64_t smem, cudaStream_t stream, const Args&... args) {
  const PdlLaunch l(dim3(grid), dim3(block), smem, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kern, args...));
  CUDA_CHECK_LAUNCH();
}

// Shared memory of this device (host side).
struct SmemLimits {
  int64_t optin, per_sm, reserved;  // per block (opt-in), per SM, reserved per block
};
inline const SmemLimits& smem_limits() {
  static const SmemLimits v = [] {
    int dev = 0, optin = 0, per_sm = 0, reserved = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    return SmemLimits{optin, per_sm, reserved};
  }();
  return v;
}

}  // namespace sparkserve
