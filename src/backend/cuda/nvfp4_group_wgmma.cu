// Grouped NVFP4 W4A4 GEMM on Hopper's warpgroup MMA (sm_90a only; the other targets take
// nvfp4_group_gemm.cu's mma.sync kernel): wgmma.mma_async m64nNk16 with the weights as the A operand in
// registers, decoded from the packed E2M1 bytes of a shared-memory stage (nvfp4_group_common.cuh:
// e2m1·sf·2^-14, exact in fp16), and the prepared activations as the B operand read by the tensor
// cores from shared memory (K-major, 128-byte swizzle, filled by cp.async). N per work item is the
// smallest of 16, 32, 64, 128 that holds the pair's rows (the MMA's cost grows with N, a 10-row pair
// at N = 128 would waste 12/13 of it).
//
// k order: B is read in the prepared layout's order, so logical k = 16s + kk of a 64-k stage holds
// value 8m + (j % 2) * 4 + j / 2 of 8-group m = 2s + kk / 8 (j = kk % 8). The A fragment's logical k
// 2t, 2t+1 | 2t+8, 2t+9 (thread t of a quad, rows g and g+8) are then the values 16s + t, +4 |
// 16s + 8 + t, +4: nibbles t and t+4 of the row's two words of block s, one nibble pair each.
//
// CTA: 2 warpgroups, 256 weight rows (gate_up: 128 gate rows and the same up rows; warpgroup w takes
// gate rows 64w.. and their up rows, or plain rows 128w..) x kBN activation rows, stages of 64 k.
// Pipeline: each k16 step's MMAs stay in flight while the next step's A fragments are decoded (two
// fragment buffers, wgmma.wait_group 1), so a stage's buffer is refilled two stages after it was
// read (loads run kStages - 2 stages ahead). The large tile groups two k16 steps per fence / commit
// / wait instead (half of them per stage: 1-6% faster on the H200); the medium tile's 128 registers
// cannot hold a second step's fragments (ptxas then serializes the wgmmas). Tiles (GroupTile):
// kBN = 128 (prefill; 5 stages of 41 KB, 1 CTA per SM) and the medium tile kBN = 64 (a few dozen
// rows per expert; 4 stages of 25 KB, 2 CTAs per SM in 128 registers: a few values spill, reloaded
// per stage and in the epilogue).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"
#include "backend/cuda/wgmma_primitives.cuh"

namespace sparkserve {
namespace {

constexpr int kThreads = 256, BM = 256;  // and 64 k per stage
template <bool kGateUp, int kBN>
struct Stage {
  static constexpr int kStages = kBN == 128 ? 5 : 4;
  static constexpr int kMinBlocks = kBN == 128 ? 1 : 2;  // CTAs per SM
  static constexpr int kParts = kGateUp ? 2 : 1;
  static constexpr int kBBytes = kBN * 128;  // one activation operand of a stage: kBN rows of 64 fp16
  static constexpr int kA = kParts * kBBytes;  // offsets within a stage: B operands first (1 KB-aligned)
  static constexpr int kS = kA + BM * 32;
  static constexpr int kBytes = kS + BM * 4;
  static constexpr int kSmem = kStages * kBytes + 1024;  // + alignment of the base to 1 KB
  static_assert(kBytes % 1024 == 0, "stages keep the 128-byte swizzle's 1 KB alignment");
};

#ifdef SPARKSERVE_HAS_WGMMA

// cp.async with an L2 prefetch-size hint: a stage copies 32 bytes of each weight row and 4 of its
// scale row, so on a miss the L2 fetches the whole 256-byte (weights) / 128-byte (scales) block and
// the next stages' slices of the same rows hit it (measured: medium gate_up 11% faster, the 8K large
// tile 3.5%; explicit prefetches of each row's next 128 bytes instead were ~30% slower).
__device__ __forceinline__ void cp_async16_l2_256(void* smem, const void* gmem) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(gmem));
}
__device__ __forceinline__ void cp_async4_l2_128(void* smem, const void* gmem) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 4;" ::"r"(d), "l"(gmem));
}

// Nibbles t and t+4 of w as fp16 e2m1·2^-14 (nibble_pair with a run-time t).
__device__ __forceinline__ uint32_t nibble_pair_rt(uint32_t w, int t) {
  const uint32_t s = w << (12 - 4 * t);
  return (s & 0x80008000u) | ((s >> 3) & 0x0E000E00u);
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

template <int kN>
__device__ __forceinline__ void wgmma_step(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kN == 128)
    wgmma_m64n128k16(d, a, desc);
  else if constexpr (kN == 64)
    wgmma_m64n64k16(d, a, desc);
  else if constexpr (kN == 32)
    wgmma_m64n32k16(d, a, desc);
  else
    wgmma_m64n16k16(d, a, desc);
}

// The four block scales (k16 steps 0-3) of a stage's shared-memory rows r and r + 8 as fp16 pairs:
// [row][step / 2] = (step 2i's, step 2i + 1's). Loaded once per stage, not once per step.
struct RowScales {
  __half2 v[2][2];
};
__device__ __forceinline__ __half2 e4m3x2(uint32_t bits) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits & 0xffffu), __NV_E4M3);
  return __half2(h);
}
__device__ __forceinline__ RowScales load_scales(const uint8_t* ss, int r) {
  const uint32_t v0 = *reinterpret_cast<const uint32_t*>(ss + r * 4);
  const uint32_t v8 = *reinterpret_cast<const uint32_t*>(ss + (r + 8) * 4);
  return {{{e4m3x2(v0), e4m3x2(v0 >> 16)}, {e4m3x2(v8), e4m3x2(v8 >> 16)}}};
}

// The A fragment of k16 step s from shared-memory row r (and r + 8) of a stage.
template <int S>
__device__ __forceinline__ void decode_step(const uint8_t* sa, const RowScales& sc, int r, int t, uint32_t (&a)[4]) {
  const uint2 w0 = *reinterpret_cast<const uint2*>(sa + r * 32 + 8 * S);
  const uint2 w1 = *reinterpret_cast<const uint2*>(sa + (r + 8) * 32 + 8 * S);
  const __half2 s0 = S % 2 ? __high2half2(sc.v[0][S / 2]) : __low2half2(sc.v[0][S / 2]);
  const __half2 s1 = S % 2 ? __high2half2(sc.v[1][S / 2]) : __low2half2(sc.v[1][S / 2]);
  a[0] = hmul2(nibble_pair_rt(w0.x, t), s0);
  a[1] = hmul2(nibble_pair_rt(w1.x, t), s1);
  a[2] = hmul2(nibble_pair_rt(w0.y, t), s0);
  a[3] = hmul2(nibble_pair_rt(w1.y, t), s1);
}
#endif  // SPARKSERVE_HAS_WGMMA

template <bool kGateUp, int kBN, int kN>
__device__ __forceinline__ void run_item(const GroupGemmArgs& a, uint8_t* smem, int64_t e, int64_t start, int rows,
                                         int64_t m0) {
#ifdef SPARKSERVE_HAS_WGMMA
  using St = Stage<kGateUp, kBN>;
  constexpr int kStages = St::kStages, kAhead = kStages - 2;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wq = warp % 4;
  const int64_t K = a.K, M = a.M, KT = K / 64, rb = K / 2, sb = K / 16;
  const int64_t Mp = M / a.P;
  const int part0 = kGateUp ? 0 : static_cast<int>(m0 / Mp);
  const int part1 = kGateUp ? a.P - 1 : part0;
  const int read0 = read_partition(a.in_scale, e, a.P, part0), read1 = read_partition(a.in_scale, e, a.P, part1);
  const bool two_b = read0 != read1;
  // Copy sources: weight rows tid/2 + 128m (gate_up: m = 1 is the up half), chunk tid % 2; scale row
  // tid; activation rows tid/8 + 32m, chunk tid % 8.
  auto weight_row = [&](int r) -> int64_t {
    if (!kGateUp) return m0 + r;
    return r < BM / 2 ? m0 + r : M / 2 + m0 + (r - BM / 2);
  };
  const uint8_t* a_src0 = a.w + (e * M + weight_row(tid / 2)) * rb + (tid % 2) * 16;
  const uint8_t* a_src1 = a.w + (e * M + weight_row(tid / 2 + 128)) * rb + (tid % 2) * 16;
  const uint8_t* s_src = a.ws + (e * M + weight_row(tid)) * sb;
  const int b_j = tid / 8, b_c = tid % 8;
  const __half* b_src = a.xq + (start + b_j) * a.P * K + b_c * 8;
  const int64_t b_rows32 = 32 * a.P * K;
  auto load_stage = [&](int stage, int64_t kt) {
    uint8_t* st = smem + stage * St::kBytes;
    cp_async16_l2_256(st + St::kA + (tid / 2) * 32 + (tid % 2) * 16, a_src0 + kt * 32);
    cp_async16_l2_256(st + St::kA + (tid / 2 + 128) * 32 + (tid % 2) * 16, a_src1 + kt * 32);
    cp_async4_l2_128(st + St::kS + tid * 4, s_src + kt * 4);
#pragma unroll
    for (int m = 0; m < kN / 32 + (kN < 32); ++m) {  // the rows the MMA reads (kN of them)
      const int j = b_j + 32 * m;
      if (j >= rows) break;
      const int dst = j * 128 + ((b_c ^ (j & 7)) << 4);  // 128-byte swizzle
      const __half* src = b_src + m * b_rows32 + kt * 64;
      cp_async16(st + dst, src + read0 * K);
      if (kGateUp && two_b) cp_async16(st + St::kBBytes + dst, src + read1 * K);
    }
  };
  float acc_x[kN / 2], acc_y[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc_x[i] = acc_y[i] = 0.0f;
  // This warp's rows: tile x (gate / first plain half) and tile y (up / second half).
  const int row_x = (kGateUp ? wg * 64 : wg * 128) + wq * 16 + g;
  const int row_y = (kGateUp ? BM / 2 + wg * 64 : wg * 128 + 64) + wq * 16 + g;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  uint32_t ax[2][4], ay[2][4];
  uint32_t px[2][2][4], py[2][2][4];  // large tile: [pair of steps % 2][step of the pair][fragment]
  // Descriptor of stage 0's first activation operand; a stage, a k16 step, the second operand are
  // offsets in its 16-byte address field (shared addresses < 256 KB: no carry out of the field).
  const uint64_t desc0 = sw128_desc(smem);  // K-major: 32-byte k16 slices of 128-byte rows
  for (int64_t kt = 0; kt < KT; ++kt) {
    // Stage kt has landed; the buffer refilled now was read by stage kt - 2, whose MMAs every thread
    // has waited for (wait_group 1 after the issue of stage kt - 1's steps).
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();  // this thread's copies are visible to the tensor cores' reads
    __syncthreads();
    const int64_t nk = kt + kAhead;
    if (nk < KT) load_stage(static_cast<int>(nk % kStages), nk);
    cp_async_commit();
    const int stage = static_cast<int>(kt % kStages);
    const uint8_t* st = smem + stage * St::kBytes;
    const uint8_t* sa = st + St::kA;
    const RowScales sx = load_scales(st + St::kS, row_x), sy = load_scales(st + St::kS, row_y);
    const uint64_t dx = desc0 + static_cast<uint64_t>((stage * St::kBytes) >> 4);
    const uint64_t dy = kGateUp && two_b ? dx + (St::kBBytes >> 4) : dx;
    auto step = [&](auto s_const) {
      constexpr int s = decltype(s_const)::value;
      // Buffer s % 2 was read by the step before last, complete since the last wait.
      decode_step<s>(sa, sx, row_x, t, ax[s % 2]);
      decode_step<s>(sa, sy, row_y, t, ay[s % 2]);
      wgmma_fence();
      wgmma_step<kN>(acc_x, ax[s % 2], dx + 2 * s);  // + 32 bytes per k16 step
      wgmma_step<kN>(acc_y, ay[s % 2], dy + 2 * s);
      wgmma_commit();
      wgmma_wait<1>();
    };
    if constexpr (kBN >= 128) {
      auto pair = [&](auto p_const) {
        constexpr int p = decltype(p_const)::value;
        decode_step<2 * p>(sa, sx, row_x, t, px[p][0]);
        decode_step<2 * p>(sa, sy, row_y, t, py[p][0]);
        decode_step<2 * p + 1>(sa, sx, row_x, t, px[p][1]);
        decode_step<2 * p + 1>(sa, sy, row_y, t, py[p][1]);
        wgmma_fence();
        wgmma_step<kN>(acc_x, px[p][0], dx + 4 * p);
        wgmma_step<kN>(acc_y, py[p][0], dy + 4 * p);
        wgmma_step<kN>(acc_x, px[p][1], dx + 4 * p + 2);
        wgmma_step<kN>(acc_y, py[p][1], dy + 4 * p + 2);
        wgmma_commit();
        wgmma_wait<1>();
      };
      pair(std::integral_constant<int, 0>{});
      pair(std::integral_constant<int, 1>{});
    } else {
      step(std::integral_constant<int, 0>{});
      step(std::integral_constant<int, 1>{});
      step(std::integral_constant<int, 2>{});
      step(std::integral_constant<int, 3>{});
    }
  }
  wgmma_wait<0>();
  const int64_t r_x = m0 + (kGateUp ? wg * 64 : wg * 128) + wq * 16;
  auto& fx = *reinterpret_cast<float(*)[kN / 8][4]>(acc_x);
  auto& fy = *reinterpret_cast<float(*)[kN / 8][4]>(acc_y);
  if constexpr (kGateUp) {
    const float d_in = a.act_in_scale[e];
    const float fg = global_factor(a.w_global[e * a.P + part0], a.in_scale[e * a.P + part0], a.modelopt);
    const float fu = global_factor(a.w_global[e * a.P + part1], a.in_scale[e * a.P + part1], a.modelopt);
    store_gate_up<kN / 8>(fx, fy, fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start, r_x, 0, rows, g, t);
  } else {
    const float f = global_factor(a.w_global[e * a.P + part0], a.in_scale[e * a.P + part0], a.modelopt);
    store_plain<kN / 8>(fx, f, a.out, a.ldo, a.out_row, start, r_x, 0, rows, g, t);
    store_plain<kN / 8>(fy, f, a.out, a.ldo, a.out_row, start, r_x + 64, 0, rows, g, t);
  }
  __syncthreads();  // every warp is done with the stages before the next item's loads
#endif
}

template <bool kGateUp, int kBN>
__global__ void __launch_bounds__(kThreads, Stage<kGateUp, kBN>::kMinBlocks) group_wgmma_kernel(const GroupGemmArgs a) {
  extern __shared__ uint8_t smem_raw[];
  // Offset rather than a rounded integer address: the pointer stays a known shared one (LDS, not
  // generic loads, for the fragments' decode).
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (base & 1023u)) & 1023u);
  const int64_t M = a.M;
  const int64_t m_tiles = kGateUp ? (M / 2) / (BM / 2) : M / BM;
  const int64_t num_pairs = num_work_pairs(a, kBN);
  for (int64_t work = blockIdx.x; work < num_pairs * m_tiles; work += gridDim.x) {
    const int64_t pair = work / m_tiles, mtile = work % m_tiles;
    const WorkPair wp = work_pair(a, pair, kBN);
    const int64_t m0 = kGateUp ? mtile * (BM / 2) : mtile * BM;
    if (kBN >= 128 && wp.rows > 64)
      run_item<kGateUp, kBN, (kBN >= 128 ? 128 : 16)>(a, smem, wp.e, wp.start, wp.rows, m0);
    else if (kBN >= 64 && wp.rows > 32)
      run_item<kGateUp, kBN, (kBN >= 64 ? 64 : 16)>(a, smem, wp.e, wp.start, wp.rows, m0);
    else if (wp.rows > 16)
      run_item<kGateUp, kBN, 32>(a, smem, wp.e, wp.start, wp.rows, m0);
    else
      run_item<kGateUp, kBN, 16>(a, smem, wp.e, wp.start, wp.rows, m0);
  }
}

template <bool kGateUp, int kBN>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  using St = Stage<kGateUp, kBN>;
  auto kern = group_wgmma_kernel<kGateUp, kBN>;
  static int64_t allowed = 0;
  allow_smem(kern, St::kSmem, allowed);
  static const int per_sm = [&] {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, St::kSmem));
    return std::max(1, n);
  }();
  const int64_t m_tiles = kGateUp ? (a.M / 2) / (BM / 2) : a.M / BM;
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + kBN - 1) / kBN;
  const int64_t grid = std::min<int64_t>(pairs * m_tiles, static_cast<int64_t>(per_sm) * b.sm_count());
  if (grid <= 0) return;
  kern<<<static_cast<unsigned>(grid), kThreads, St::kSmem, b.stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <bool kGateUp>
void launch_tile(CudaBackend& b, const GroupGemmArgs& a, int bn) {
  if (bn == 128)
    launch<kGateUp, 128>(b, a);
  else
    launch<kGateUp, 64>(b, a);
}

}  // namespace

bool group_wgmma_available() {
  static const bool ok = [] {
    // The largest tile needs 206 KB of shared memory (no static arrays: the device's whole opt-in
    // limit is ours).
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return sm90a_kernel_runs(reinterpret_cast<const void*>(group_wgmma_kernel<true, 128>)) &&
           Stage<true, 128>::kSmem <= optin;
  }();
  return ok;
}

void launch_group_wgmma(CudaBackend& b, const GroupGemmArgs& a, int bn) {
  if (a.gate_up)
    launch_tile<true>(b, a, bn);
  else
    launch_tile<false>(b, a, bn);
}

}  // namespace sparkserve
