// Routed experts with NVFP4 weights AND NVFP4 activations (W4A4, the compressed-tensors "nvfp4"
// scheme of the Qwen3.5 NVFP4 checkpoints) on integer dot products: moe_w4a4.h.
//
// Why: the float path (moe_decode.cu) decodes every E2M1 weight to f32 and multiplies it by an f32
// x̂ from shared memory, ~8 instructions per weight; Nsight Compute showed its gate_up and down
// kernels issue-bound (0.4-0.6 instructions per cycle per scheduler, DRAM 12-23% busy). But a W4A4
// product is a product of two E2M1 codes times two block factors, and 2·e2m1 is a small integer
// (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12), so a 16-value block's sum Σ (2w_i)(2a_i) is an exact int32
// that dp4a computes four products at a time. Weight nibbles become int8 magnitudes with one byte
// permute (prmt) per four codes: with the code as the selector, a positive code picks its
// magnitude from an 8-byte table and a negative one (selector bit 3) replicates that byte's sign
// bit, i.e. 0; the same permute of the code with bit 3 flipped gives the negative codes'
// magnitudes, so Σ = dp4a(pos, a) - dp4a(neg, a). ~1.8 instructions per weight.
//
// Numerics vs the CPU specification (backend/cpu/quant_linear.cpp): the activation codes and block
// scales are the CPU's (quant_math.cuh, same operations); the CPU multiplies dequantized f32 weights
// by x̂ = e2m1·sf/gs element by element, here each block's exact integer sum is scaled once by
// fw·fa/4 (fw = fp8(sfw)/gsw, fa = sf/gs): the same real number with different f32 roundings,
// ~1e-7 relative, inside gpu_ops' 1e-5 bound (tests/gpu/ops_vs_cpu.cpp, groups decode_moe*).
//
// Three launches: quantize x once per (slot, partition); gate_up (+ SiLU·mul + the down input's
// quantization into codes) per (slot, row range); down over the token's k experts + the routing-
// weighted sum in ascending expert id (HF's eager order, as the CPU).
#include "backend/cuda/moe_w4a4.h"

#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/quant_math.cuh"

namespace sparkserve {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxK = 8;  // routed experts per token

// Activation codes live in "half-major" order so that lane i of a warp reading the 32 codes of
// 16-byte weight chunk i touches consecutive 16-byte granules (no bank conflicts): for a row of K
// values with cpr = K/32 chunks, byte (h·cpr + c)·16 + j holds the int8 code of value 32c + 16h + j.
// Factors: one f32 per 16-value block, block b at index b.
__host__ __device__ inline int64_t code_offset(int64_t i, int64_t cpr) {
  const int64_t c = i / 32, h = (i / 16) % 2;
  return (h * cpr + c) * 16 + i % 16;
}

struct Args {
  // gate_up [E, 2I, H/2] NVFP4 (P = 1 or 2 partitions: gate rows, then up rows), down [E, H, I/2]
  const uint8_t *gw, *gws, *dw, *dws;   // payloads and E4M3 block scales [rows, K/16]
  const float *ggs, *gis, *dgs, *dis;   // weight global scales / input scales: [E, P] and [E]
  int g_P, g_modelopt, d_modelopt;
  const float* x;          // [T, H]
  int8_t* xq;              // [slots, P, H] codes (half-major per row)
  float* xf;               // [slots, P, xfs] block factors (H/16 used; rows padded to 16 bytes)
  const int32_t* ids;      // [T, k]
  const float* weights;    // [T, k]
  const float* logits;     // [T, E] router logits when the routing is fused (ids / weights are then its output)
  int32_t* ids_out;        // = ids, written by the fused routing
  float* weights_out;      // = weights
  int8_t* aq;              // [slots, I] the down input's codes (half-major)
  float* af;               // [slots, afs] its block factors (I/16 used; rows padded to 16 bytes)
  float* out;              // [T, H]
  int64_t H, I, E, k, rows_gu, rows_d;
  int64_t xfs, afs;        // factor row strides: H/16 and I/16 rounded up to a multiple of 4
};

__host__ __device__ constexpr int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// 2·|e2m1| for magnitude index 0..7, as the bytes of a prmt table.
constexpr uint32_t kMagLo = 0x03020100u, kMagHi = 0x0C080604u;

// Σ_{i<8} (2 e2m1(w_i)) · a_i for the eight nibbles of `w` (value i in bits 4i..4i+3) and the int8
// codes a0 (values 0-3) and a1 (values 4-7).
__device__ __forceinline__ int dot8(uint32_t w, uint32_t a0, uint32_t a1) {
  const uint32_t wn = w ^ 0x88888888u;
  const int pos = __dp4a(static_cast<int>(prmt(kMagLo, kMagHi, w >> 16)), static_cast<int>(a1),
                         __dp4a(static_cast<int>(prmt(kMagLo, kMagHi, w)), static_cast<int>(a0), 0));
  const int neg = __dp4a(static_cast<int>(prmt(kMagLo, kMagHi, wn >> 16)), static_cast<int>(a1),
                         __dp4a(static_cast<int>(prmt(kMagLo, kMagHi, wn)), static_cast<int>(a0), 0));
  return pos - neg;
}

__device__ __forceinline__ float e4m3_byte(uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b & 0xffu), __NV_E4M3)));
}

// One 16-byte weight chunk (32 codes = 2 blocks) against its 32 activation codes (lo: values 0-15,
// hi: 16-31) and the activation factors of the two blocks; sc: the two E4M3 weight block scales.
// Returns Σ_b isum_b · fp8(sfw_b) · fa_b (the weight's global factor and the 1/4 applied per row).
__device__ __forceinline__ float chunk_dot(const uint4& w, uint32_t sc, const uint4& lo, const uint4& hi, float2 fa) {
  const int s0 = dot8(w.x, lo.x, lo.y) + dot8(w.y, lo.z, lo.w);
  const int s1 = dot8(w.z, hi.x, hi.y) + dot8(w.w, hi.z, hi.w);
  return static_cast<float>(s0) * (e4m3_byte(sc) * fa.x) + static_cast<float>(s1) * (e4m3_byte(sc >> 8) * fa.y);
}

// Weight global factor with the 1/4 of the two doubled codes: CT divides by the weight global scale,
// ModelOpt multiplies by weight_scale_2.
__device__ __forceinline__ float weight_factor(float g, bool modelopt) {
  return modelopt ? 0.25f * g : 0.25f / g;
}

// Four consecutive values v of one 16-value block (the block's four threads are consecutive lanes)
// quantized as the CPU does with input scale in_s: int8 codes 2·e2m1 packed in a word, and the
// block factor fa (x̂ = e2m1 · fa up to one rounding).
__device__ __forceinline__ void quantize_quad(float4 v, float in_s, bool modelopt, uint32_t& codes, float& fa) {
  const float gs = modelopt ? 1.0f / in_s : in_s;
  uint32_t c[4];
  float sf;
  nvfp4_quantize_quad(v, gs, c, sf);
  codes = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t b = prmt(kMagLo, kMagHi, c[i] & 7u) & 0xffu;
    if (c[i] & 8u) b = (0u - b) & 0xffu;
    codes |= b << (8 * i);
  }
  fa = modelopt ? __fmul_rn(sf, in_s) : __fdiv_rn(sf, gs);
}

// x[t] quantized for partition blockIdx.y of slot blockIdx.x with the slot's expert's input scale.
// With a.logits, the routing runs here first (route_topk_warp, the same function as the separate
// route_topk kernel, so the same ids and weights): every block of token t computes it, the block of
// slot (t, 0), partition 0 writes it out for the gate_up / down kernels. Launched with programmatic
// stream serialization (its launch overlaps the router's kernel where that one lets it: bf16_few_tokens.cu).
__global__ void __launch_bounds__(kThreads) w4a4_quantize_x_kernel(Args a) {
  extern __shared__ float probs[];  // [E] with fused routing
  __shared__ int32_t s_ids[kMaxK];
  __shared__ float s_w[kMaxK];
  asm volatile("griddepcontrol.wait;" ::: "memory");  // launched programmatically: the logits / x are ready
  const int64_t slot = blockIdx.x, t = slot / a.k, j = slot % a.k;
  const int p = static_cast<int>(blockIdx.y);
  int64_t e;
  if (a.logits) {
    if (threadIdx.x < 32) route_topk_warp(probs, a.logits + t * a.E, a.E, a.k, s_ids, s_w);
    __syncthreads();
    e = s_ids[j];
    if (j == 0 && p == 0 && threadIdx.x < a.k) {
      a.ids_out[t * a.k + threadIdx.x] = s_ids[threadIdx.x];
      a.weights_out[t * a.k + threadIdx.x] = s_w[threadIdx.x];
    }
  } else {
    e = a.ids[slot];
  }
  if (e < 0 || e >= a.E) __trap();  // the CPU reference CHECKs this too
  const float in_s = a.gis[e * a.g_P + p];
  const int64_t H = a.H, cpr = H / 32;
  const float* x = a.x + t * H;
  int8_t* q = a.xq + (slot * a.g_P + p) * H;
  float* f = a.xf + (slot * a.g_P + p) * a.xfs;
  // Every thread runs every pass (the amax shuffles need whole warps); quads past H see zeros.
  for (int64_t base = 0; base < H; base += kThreads * 4) {
    const int64_t i = base + static_cast<int64_t>(threadIdx.x) * 4;
    uint32_t codes;
    float fa;
    const float4 v = i < H ? *reinterpret_cast<const float4*>(x + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    quantize_quad(v, in_s, a.g_modelopt != 0, codes, fa);
    if (i < H) {
      *reinterpret_cast<uint32_t*>(q + code_offset(i, cpr)) = codes;
      if (i % 16 == 0) f[i / 16] = fa;
    }
  }
}

// gate_up for one (token, slot) pair per blockIdx.y and gate rows [n0, n0 + rows_gu) per blockIdx.x
// (a multiple of 16: the epilogue quantizes whole blocks of the down input). Warp w takes RPW gate
// rows and their up rows per step; lane c reads 16-byte chunks c, c + 32, ... of each (U in flight).
template <int RPW, int U>
__global__ void __launch_bounds__(kThreads, 2) w4a4_gate_up_kernel(Args a) {
  extern __shared__ uint4 smem[];
  const int64_t H = a.H, I = a.I, cpr = H / 32, P = a.g_P;
  uint8_t* xs = reinterpret_cast<uint8_t*>(smem);          // [P][H] codes
  float* fs = reinterpret_cast<float*>(xs + P * H);         // [P][xfs]
  float* acts = fs + P * a.xfs;                             // [rows_gu]
  const int64_t slot = blockIdx.y;
  const int64_t e = a.ids[slot];
  if (e < 0 || e >= a.E) __trap();
  const int64_t N = 2 * I, rb = H / 2, sb = H / 16;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * a.rows_gu, n1 = min(n0 + a.rows_gu, I);
  const uint8_t* wbase = a.gw + e * N * rb;
  const uint8_t* sbase = a.gws + e * N * sb;
  const int pu = static_cast<int>(P) - 1;  // partition of the up rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Work items of a warp: (step r0, chunk pass base); each item's weight loads are issued before
  // the previous item's arithmetic, and the first item's before the activation staging, so the
  // DRAM latency of the first loads overlaps the L2 round trips of the staging.
  uint4 q[U][2 * RPW];
  uint32_t sc[U][2 * RPW];
  auto load = [&](int64_t r0, int64_t base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + lane + 32 * u;
#pragma unroll
      for (int r = 0; r < 2 * RPW; ++r) {
        const int64_t n = (r < RPW ? 0 : I) + min(r0 + r % RPW, n1 - 1);
        const bool ok = c < cpr;
        q[u][r] = ok ? ld_stream16(wbase + n * rb + c * 16) : make_uint4(0, 0, 0, 0);
        sc[u][r] = ok ? __ldg(reinterpret_cast<const unsigned short*>(sbase + n * sb) + c) : 0u;
      }
    }
  };
  int64_t r0 = n0 + warp * RPW, base = 0;
  if (r0 < n1) load(r0, base);
  prefetch_l2(wbase + n0 * rb, (n1 - n0) * rb);
  prefetch_l2(wbase + (I + n0) * rb, (n1 - n0) * rb);
  stage_to_shared(xs, a.xq + slot * P * H, P * H);
  stage_to_shared(fs, a.xf + slot * P * a.xfs, P * a.xfs * 4);
  __syncthreads();
  const float g0 = weight_factor(a.ggs[e * P], a.g_modelopt != 0);
  const float g1 = weight_factor(a.ggs[e * P + pu], a.g_modelopt != 0);
  float acc[2 * RPW];
#pragma unroll
  for (int r = 0; r < 2 * RPW; ++r) acc[r] = 0.0f;
  while (r0 < n1) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + lane + 32 * u;
      if (c >= cpr) continue;
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        const int p = part == 0 ? 0 : pu;
        const uint4 lo = reinterpret_cast<const uint4*>(xs + p * H)[c];
        const uint4 hi = reinterpret_cast<const uint4*>(xs + p * H)[cpr + c];
        const float2 fa = reinterpret_cast<const float2*>(fs + p * a.xfs)[c];
#pragma unroll
        for (int r = 0; r < RPW; ++r) acc[part * RPW + r] += chunk_dot(q[u][part * RPW + r], sc[u][part * RPW + r], lo, hi, fa);
      }
    }
    base += 32 * U;
    const int64_t cur = r0;
    const bool step_done = base >= cpr;
    if (step_done) {
      base = 0;
      r0 += kWarps * RPW;
    }
    if (r0 < n1) load(r0, base);
    if (step_done) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const float g = warp_sum(acc[r]) * g0;
        const float u = warp_sum(acc[RPW + r]) * g1;
        if (lane == r && cur + r < n1) acts[cur + r - n0] = silu_f(g) * u;
        acc[r] = 0.0f;
        acc[RPW + r] = 0.0f;
      }
    }
  }
  __syncthreads();
  // Epilogue: these rows of the down projection's input, quantized with the down expert's input
  // scale into codes (half-major) and block factors; four threads per 16-block as above.
  const int64_t nr = n1 - n0, dcpr = I / 32;
  const float d_in = a.dis[e];
  for (int64_t base = 0; base < nr; base += kThreads * 4) {  // whole warps, as in the quantize kernel
    const int64_t i = base + static_cast<int64_t>(threadIdx.x) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < nr) v = *reinterpret_cast<const float4*>(acts + i);
    uint32_t codes;
    float fa;
    quantize_quad(v, d_in, a.d_modelopt != 0, codes, fa);
    if (i < nr) {
      *reinterpret_cast<uint32_t*>(a.aq + slot * I + code_offset(n0 + i, dcpr)) = codes;
      if (i % 16 == 0) a.af[slot * a.afs + (n0 + i) / 16] = fa;
    }
  }
}

// down for token blockIdx.y, output rows [h0, h0 + rows_d) per blockIdx.x: each warp computes R
// output rows against all k experts at once (R·k weight chunks in flight per lane), then the
// routing-weighted sum in ascending expert id.
template <int R>
__global__ void __launch_bounds__(kThreads, 2) w4a4_down_kernel(Args a) {
  extern __shared__ uint4 smem[];
  __shared__ int64_t s_e[kMaxK];
  __shared__ float s_w[kMaxK], s_g[kMaxK];
  __shared__ int s_order[kMaxK];
  const int64_t t = blockIdx.y, I = a.I, H = a.H, cpr = I / 32, rb = I / 2, sb = I / 16;
  const int k = static_cast<int>(a.k);
  uint8_t* xs = reinterpret_cast<uint8_t*>(smem);  // [k][I] codes
  float* fs = reinterpret_cast<float*>(xs + k * I);  // [k][afs]
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * a.rows_d, h1 = min(h0 + a.rows_d, H);
  if (threadIdx.x < k) {
    const int j = threadIdx.x;
    const int64_t e = a.ids[t * k + j];
    if (e < 0 || e >= a.E) __trap();
    s_e[j] = e;
    s_w[j] = a.weights[t * k + j];
    s_g[j] = weight_factor(a.dgs[e], a.d_modelopt != 0);
  }
  __syncthreads();
  if (threadIdx.x < k) {  // rank of expert j among the token's ids (ties keep slot order)
    const int i = threadIdx.x;
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += s_e[j] < s_e[i] || (s_e[j] == s_e[i] && j < i);
    s_order[rank] = i;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // As in gate_up: each (rows, chunk) item's loads before the previous item's arithmetic, the
  // first before the activation staging.
  uint4 q[R][kMaxK];
  uint32_t sc[R][kMaxK];
  auto load = [&](int64_t hb, int64_t c) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < kMaxK; ++j) {
        const bool ok = j < k && c < cpr;
        const int64_t row = s_e[j < k ? j : 0] * H + min(hb + r, h1 - 1);
        q[r][j] = ok ? ld_stream16(a.dw + row * rb + c * 16) : make_uint4(0, 0, 0, 0);
        sc[r][j] = ok ? __ldg(reinterpret_cast<const unsigned short*>(a.dws + row * sb) + c) : 0u;
      }
  };
  int64_t hb = h0 + warp * R, base = 0;
  if (hb < h1) load(hb, base + lane);
  stage_to_shared(xs, a.aq + t * k * I, k * I);
  stage_to_shared(fs, a.af + t * k * a.afs, k * a.afs * 4);
  __syncthreads();
  float acc[R][kMaxK];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) acc[r][j] = 0.0f;
  while (hb < h1) {
    const int64_t c = base + lane;
    if (c < cpr) {
#pragma unroll
      for (int j = 0; j < kMaxK; ++j) {
        if (j >= k) break;
        const uint4 lo = reinterpret_cast<const uint4*>(xs + j * I)[c];
        const uint4 hi = reinterpret_cast<const uint4*>(xs + j * I)[cpr + c];
        const float2 fa = reinterpret_cast<const float2*>(fs + j * a.afs)[c];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][j] += chunk_dot(q[r][j], sc[r][j], lo, hi, fa);
      }
    }
    base += 32;
    const int64_t cur = hb;
    const bool rows_done = base >= cpr;
    if (rows_done) {
      base = 0;
      hb += kWarps * R;
    }
    if (hb < h1) load(hb, base + lane);
    if (!rows_done) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float y[kMaxK];
#pragma unroll
      for (int j = 0; j < kMaxK; ++j) {
        y[j] = warp_sum(acc[r][j]) * s_g[j < k ? j : 0];
        acc[r][j] = 0.0f;
      }
      if (lane == 0 && cur + r < h1) {
        float o = 0.0f;
        for (int i = 0; i < k; ++i) {
          const int j = s_order[i];
          float yj = 0.0f;
#pragma unroll
          for (int jj = 0; jj < kMaxK; ++jj)
            if (jj == j) yj = y[jj];
          o += s_w[j] * yj;
        }
        a.out[t * H + cur + r] = o;
      }
    }
  }
}

bool takes(const Linear& w) {
  return is_nvfp4(w.format) && w.activation == ActivationQuant::kNvfp4 && w.input_scale.data != nullptr &&
         w.global_scale.data != nullptr && w.in_features % 32 == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 1u) == 0;
}

}  // namespace

bool moe_w4a4(CudaBackend& b, float* out, const float* x, int32_t* ids, float* weights, const float* router_logits,
              int64_t T, int64_t k, const Linear& gate_up, const Linear& down) {
  if (!takes(gate_up) || !takes(down) || gate_up.format != down.format) return false;
  const int64_t H = gate_up.in_features, I = down.in_features, E = gate_up.weight.dim(0), P = gate_up.partitions;
  if (k < 1 || k > kMaxK || down.out_features != H || gate_up.out_features != 2 * I) return false;
  if (!(P == 1 || P == 2) || down.partitions != 1) return false;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;
  const int64_t slots = T * k;
  if (slots > 65535 || T > 65535) return false;
  // Gate rows per block: multiples of 16, ~2 blocks per SM over all slots (8 slots x 32 blocks of 32
  // rows at T = 1); down rows: 16 per block (8 warps x 2 rows), ~2 blocks per SM at T = 1.
  const int64_t want = std::max<int64_t>(1, 2 * static_cast<int64_t>(b.sm_count()) / slots);
  const int64_t steps = (I + 15) / 16;
  const int64_t rows_gu = 16 * std::max<int64_t>(1, (steps + want - 1) / want);
  const int64_t xfs = round4(H / 16), afs = round4(I / 16);
  const int64_t smem_gu = P * H + P * xfs * 4 + rows_gu * 4;
  const int64_t smem_d = k * I + k * afs * 4;
  if (smem_gu > smem_budget() || smem_d > smem_budget()) return false;
  if (router_logits && E * 4 > 40 * 1024) return false;  // the routing's probabilities in shared memory
  if (T == 0) return true;
  CudaBackend::Scratch xq(&b, static_cast<size_t>(slots * P * H)), xf(&b, static_cast<size_t>(slots * P * xfs) * 4),
      aq(&b, static_cast<size_t>(slots * I)), af(&b, static_cast<size_t>(slots * afs) * 4);
  Args a{};
  a.gw = static_cast<const uint8_t*>(gate_up.weight.data);
  a.gws = static_cast<const uint8_t*>(gate_up.weight_scale.data);
  a.dw = static_cast<const uint8_t*>(down.weight.data);
  a.dws = static_cast<const uint8_t*>(down.weight_scale.data);
  a.ggs = static_cast<const float*>(gate_up.global_scale.data);
  a.gis = static_cast<const float*>(gate_up.input_scale.data);
  a.dgs = static_cast<const float*>(down.global_scale.data);
  a.dis = static_cast<const float*>(down.input_scale.data);
  a.g_P = static_cast<int>(P);
  a.g_modelopt = gate_up.format == WeightFormat::kNvfp4ModelOpt ? 1 : 0;
  a.d_modelopt = down.format == WeightFormat::kNvfp4ModelOpt ? 1 : 0;
  a.x = x;
  a.xq = xq.as<int8_t>();
  a.xf = xf.as<float>();
  a.ids = ids;
  a.weights = weights;
  a.logits = router_logits;
  a.ids_out = ids;
  a.weights_out = weights;
  a.aq = aq.as<int8_t>();
  a.af = af.as<float>();
  a.out = out;
  a.H = H;
  a.I = I;
  a.E = E;
  a.k = k;
  a.rows_gu = rows_gu;
  a.rows_d = 16;
  a.xfs = xfs;
  a.afs = afs;
  const size_t smem_q = router_logits ? static_cast<size_t>(E) * 4 : 0;
  {
    const PdlLaunch l(dim3(static_cast<unsigned>(slots), static_cast<unsigned>(P)), dim3(kThreads),
                      static_cast<int64_t>(smem_q), b.stream());
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, w4a4_quantize_x_kernel, a));
    CUDA_CHECK_LAUNCH();
  }
  {
    auto kern = w4a4_gate_up_kernel<2, 3>;
    static int64_t allowed = 0;
    allow_smem(kern, smem_gu, allowed);
    kern<<<dim3(static_cast<unsigned>((I + rows_gu - 1) / rows_gu), static_cast<unsigned>(slots)), kThreads,
           static_cast<size_t>(smem_gu), b.stream()>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  {
    auto kern = w4a4_down_kernel<2>;
    static int64_t allowed = 0;
    allow_smem(kern, smem_d, allowed);
    kern<<<dim3(static_cast<unsigned>((H + a.rows_d - 1) / a.rows_d), static_cast<unsigned>(T)), kThreads,
           static_cast<size_t>(smem_d), b.stream()>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  return true;
}

// For the kernel benchmark only (tests/gpu/moe_grouped_bench.cpp declares it: built without nvcc):
// moe_w4a4 at any T, to compare the grouped path with it. False when not taken.
bool moe_w4a4_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                    const Linear& gate_up, const Linear& down) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c && moe_w4a4(*c, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(), nullptr,
                       x.dim(0), ids.dim(1), gate_up, down);
}

}  // namespace sparkserve
