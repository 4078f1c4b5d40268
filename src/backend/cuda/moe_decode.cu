// The float fused MoE decode path (moe_decode.h: decode_moe): gate_up GEMV + SiLU·mul per (token,
// slot) pair, then the down GEMV over the token's k experts with the routing-weighted sum; the row-dot
// machinery and its numerics are gemv_rows.cuh's.
#include "backend/cuda/gemv_rows.cuh"
#include "backend/cuda/moe_decode.h"
#include "core/check.h"

namespace sparkserve {
namespace {
using namespace gemv;  // NOLINT(google-build-using-namespace): the GEMV building blocks

constexpr int kMaxExperts = 8;                // routed experts per token in the fused MoE

struct MoeArgs {
  // gate_up [E, 2I, H] (P 1 or 2 partitions) and down [E, H, I] (one partition)
  const uint8_t *gw, *gws, *dw, *dws;
  const float *ggs, *gis, *dgs, *dis;
  int64_t g_row_bytes, d_row_bytes;
  int g_cpr, d_cpr, g_act, d_act, g_P, g_modelopt, d_modelopt;
  const float* x;          // [T, H]
  float* xq;               // [T*k, P, padded32(H)]: each slot's gate_up input, quantized once (swizzled)
  float* xts;              // [T*k, P]: its FP8 activation scales
  const int32_t* ids;      // [T, k]
  const float* weights;    // [T, k]
  float* act;              // [T*k, I]: silu(gate)*up, already quantized for down's input
  float* out;              // [T, H]
  int64_t H, I, E, k, rows_per_cta;
};

// Each (token, slot) pair's gate_up input for partition blockIdx.y, quantized once with the
// expert's input scale (was: by every gate_up block of the slot, 32 blocks at T = 1).
__global__ void __launch_bounds__(kThreads) moe_quantize_x_kernel(MoeArgs a) {
  __shared__ float ts[1], red[kWarps];
  const int64_t slot = blockIdx.x, t = slot / a.k;
  const int p = static_cast<int>(blockIdx.y);
  const int64_t e = a.ids[slot];
  if (e < 0 || e >= a.E) __trap();
  const int64_t ldx = padded32(a.H);
  quantize_rows<1>(a.xq + (slot * a.g_P + p) * ldx, ldx, ts, red, a.x + t * a.H, 1, a.H, a.g_act,
                   a.g_modelopt != 0, a.gis ? a.gis[e * a.g_P + p] : 1.0f);
  if (threadIdx.x == 0) a.xts[slot * a.g_P + p] = ts[0];  // only meaningful for FP8 activations
}

// One (token, slot) pair per blockIdx.y, gate rows [n0, n1) per blockIdx.x (a multiple of 16, so the
// epilogue can quantize whole NVFP4 blocks of the down projection's input). Capped at 128 registers
// so that two blocks share an SM (the launch sizes the grid for that).
template <int FMT, int RPW, int U>
__global__ void __launch_bounds__(kThreads, 2) moe_gate_up_kernel(MoeArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [P][H]
  const int64_t ldx = padded32(a.H);
  float* acts = xs + a.g_P * ldx;               // [rows_per_cta]
  __shared__ float ts[2];
  const int64_t slot = blockIdx.y;
  const int64_t e = a.ids[slot];
  if (e < 0 || e >= a.E) __trap();  // the CPU reference CHECKs this too
  const int64_t N = 2 * a.I, H = a.H;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_cta, n1 = min(n0 + a.rows_per_cta, a.I);
  const uint8_t* wbase = a.gw + e * N * a.g_row_bytes;
  const uint8_t* sbase = FMT == kFmtNvfp4 ? a.gws + e * N * (H / 16) : nullptr;
  prefetch_l2(wbase + n0 * a.g_row_bytes, (n1 - n0) * a.g_row_bytes);
  prefetch_l2(wbase + (a.I + n0) * a.g_row_bytes, (n1 - n0) * a.g_row_bytes);
  if (FMT == kFmtNvfp4) {
    prefetch_l2(sbase + n0 * (H / 16), (n1 - n0) * (H / 16));
    prefetch_l2(sbase + (a.I + n0) * (H / 16), (n1 - n0) * (H / 16));
  }
  // The slot's quantized input (moe_quantize_x_kernel) from L2, every load issued before any store.
  {
    stage_to_shared(xs, a.xq + slot * a.g_P * ldx, a.g_P * ldx * 4);
    if (threadIdx.x < a.g_P) ts[threadIdx.x] = a.xts[slot * a.g_P + threadIdx.x];
    __syncthreads();
  }
  const int pu = a.g_P - 1;  // partition of the up rows
  const float gm0 = FMT == kFmtNvfp4 ? nvfp4_gmul(a.ggs[e * a.g_P], a.g_modelopt != 0) : 0.0f;
  const float gm1 = FMT == kFmtNvfp4 ? nvfp4_gmul(a.ggs[e * a.g_P + pu], a.g_modelopt != 0) : 0.0f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* wsf = reinterpret_cast<const float*>(a.gws) + e * N;
  for (int64_t r0 = n0 + warp * RPW; r0 < n1; r0 += kWarps * RPW) {
    Row rows[2 * RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const bool valid = r0 + r < n1;
      const int64_t n = valid ? r0 + r : r0;
      rows[r] = Row{wbase + n * a.g_row_bytes, sbase ? sbase + n * (H / 16) : nullptr, xs, gm0, valid};
      rows[RPW + r] = Row{wbase + (a.I + n) * a.g_row_bytes, sbase ? sbase + (a.I + n) * (H / 16) : nullptr,
                          xs + pu * ldx, gm1, valid};
    }
    float acc[2 * RPW][1];
    rows_dot<FMT, 2 * RPW, U, 1, false>(rows, a.g_cpr, ldx, acc);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float g = finish<FMT>(warp_sum(acc[r][0]), a.g_act, wsf, r0 + r, ts[0]);
      const float u = finish<FMT>(warp_sum(acc[RPW + r][0]), a.g_act, wsf, a.I + r0 + r, ts[pu]);
      if (lane == r && rows[r].valid) acts[r0 + r - n0] = silu_f(g) * u;
    }
  }
  __syncthreads();
  // Epilogue: the down projection's input quantization of these rows (local to 16-blocks / elements),
  // four threads per NVFP4 block as in quantize_rows.
  float* o = a.act + slot * a.I + n0;
  const int64_t nr = n1 - n0;
  const float d_in = a.dis ? a.dis[e] : 1.0f;
  if (a.d_act == kActNvfp4) {
    const bool mo = a.d_modelopt != 0;
    const float gs = mo ? 1.0f / d_in : d_in;
    const int64_t quads = nr / 4, rounds = (quads + kThreads - 1) / kThreads;
    for (int64_t i = 0; i < rounds; ++i) {
      const int64_t qd = i * kThreads + threadIdx.x;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qd < quads) v = *reinterpret_cast<const float4*>(acts + qd * 4);
      float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (qd < quads) {
        float sf, out_scale;
        nvfp4_block_scales(amax, gs, sf, out_scale);
        o[qd * 4] = nvfp4_fake_quant_value(v.x, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 1] = nvfp4_fake_quant_value(v.y, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 2] = nvfp4_fake_quant_value(v.z, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 3] = nvfp4_fake_quant_value(v.w, sf, out_scale, gs, d_in, mo);
      }
    }
  } else if (a.d_act == kActFp8Static) {
    for (int64_t i = threadIdx.x; i < nr; i += kThreads) o[i] = fp8_quant_value(acts[i], d_in);
  } else {
    for (int64_t i = threadIdx.x; i < nr; i += kThreads) o[i] = acts[i];
  }
}

// One token per blockIdx.y, down rows [h0, h1) per blockIdx.x; each warp computes one output row h
// against all of the token's k experts at once (k rows in flight), then the routing-weighted sum in
// ascending expert id (HF's eager order, as the CPU reference).
// Capped at 128 registers: two blocks per SM (16 warps streaming), as the launch's grid assumes.
template <int FMT, int U>
__global__ void __launch_bounds__(kThreads, 2) moe_down_kernel(MoeArgs a) {
  constexpr int KE = kMaxExperts;
  __shared__ int64_t s_e[KE];
  __shared__ float s_w[KE], s_gm[KE], s_ts[KE];
  __shared__ int s_order[KE];
  const int64_t t = blockIdx.y, I = a.I, H = a.H;
  const int k = static_cast<int>(a.k);
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_cta, h1 = min(h0 + a.rows_per_cta, H);
  if (threadIdx.x < k) {
    const int j = threadIdx.x;
    const int64_t e = a.ids[t * k + j];
    if (e < 0 || e >= a.E) __trap();
    s_e[j] = e;
    s_w[j] = a.weights[t * k + j];
    s_gm[j] = FMT == kFmtNvfp4 ? nvfp4_gmul(a.dgs[e], a.d_modelopt != 0) : 0.0f;
    s_ts[j] = a.dis ? a.dis[e] : 1.0f;
  }
  __syncthreads();
  // Each warp prefetches one expert's rows of this block; thread j ranks expert j (ascending id,
  // ids of a token are distinct; equal ids keep slot order).
  for (int j = threadIdx.x / 32; j < k; j += kWarps) {
    const int64_t e = s_e[j];
    const uint8_t* base = a.dw + (e * H + h0) * a.d_row_bytes;
    for (int64_t off = (threadIdx.x % 32) * 128; off < min((h1 - h0) * a.d_row_bytes, int64_t{64 * 1024});
         off += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
  }
  if (threadIdx.x < k) {
    const int i = threadIdx.x;
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += s_e[j] < s_e[i] || (s_e[j] == s_e[i] && j < i);
    s_order[rank] = i;
  }
  __syncthreads();
  // The token's k activation rows (already quantized by the gate_up kernel) into shared memory.
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int64_t ldx = padded32(I);
  for (int j = 0; j < k; ++j)
    for (int64_t g = threadIdx.x; g < I / 4; g += kThreads)
      *reinterpret_cast<float4*>(xs + j * ldx + 4 * swz(g)) =
          *reinterpret_cast<const float4*>(a.act + (t * k + j) * I + 4 * g);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t h = h0 + warp; h < h1; h += kWarps) {
    Row rows[KE];
#pragma unroll
    for (int j = 0; j < KE; ++j) {
      const bool valid = j < k;
      const int64_t e = s_e[valid ? j : 0];
      rows[j] = Row{a.dw + (e * H + h) * a.d_row_bytes, FMT == kFmtNvfp4 ? a.dws + (e * H + h) * (I / 16) : nullptr,
                    xs + (valid ? j : 0) * ldx, s_gm[valid ? j : 0], valid};
    }
    float acc[KE][1];
    rows_dot<FMT, KE, U, 1, false>(rows, a.d_cpr, ldx, acc);
    float y[KE];
#pragma unroll
    for (int j = 0; j < KE; ++j)
      y[j] = finish<FMT>(warp_sum(acc[j][0]), a.d_act, reinterpret_cast<const float*>(a.dws) + s_e[j < k ? j : 0] * H,
                         h, s_ts[j < k ? j : 0]);
    if (lane == 0) {
      float o = 0.0f;
      for (int i = 0; i < k; ++i) {
        const int j = s_order[i];
        float yj = 0.0f;
#pragma unroll
        for (int jj = 0; jj < KE; ++jj)
          if (jj == j) yj = y[jj];
        o += s_w[j] * yj;
      }
      a.out[t * H + h] = o;
    }
  }
}

template <int FMT>
void launch_gate_up(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s) {
  // 2 gate + 2 up rows per warp, 3 chunks each in flight: one pass of the lane loop for an NVFP4 row
  // of H = 3072 (96 chunks), two for FP8.
  auto k = moe_gate_up_kernel<FMT, 2, 3>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int FMT, int U>
void launch_down_t(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s) {
  auto k = moe_down_kernel<FMT, U>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int FMT>
void launch_down(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s, bool two_chunks) {
  if (two_chunks)
    launch_down_t<FMT, 2>(a, grid, smem, s);
  else
    launch_down_t<FMT, 1>(a, grid, smem, s);
}

// decode_moe with only the launches `stages` names (bit 0 gate_up, bit 1 down) and the gate_up grid
// sized for gu_per_sm blocks per SM (0: the default, 2): decode_moe itself, and the kernel
// benchmark's split timing and grid sweep (decode_moe_probe).
bool decode_moe_impl(CudaBackend& b, float* out, const float* x, const int32_t* ids, const float* weights,
                     int64_t T, int64_t k, const Linear& gate_up, const Linear& down, int stages, int gu_per_sm) {
  View g, d;
  if (!make_view(gate_up, g) || !make_view(down, d)) return false;
  const int64_t H = gate_up.in_features, I = down.in_features, E = gate_up.weight.dim(0);
  if (k < 1 || k > kMaxExperts) return false;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0 || H % 4 != 0) return false;  // float4 prologue loads
  const int64_t P = gate_up.partitions;
  if (!(P == 1 || (P == 2 && gate_up.out_features / 2 == I))) return false;
  if (down.partitions != 1) return false;
  if (down.activation == ActivationQuant::kFp8TokenDynamic) return false;  // needs the whole row's amax
  if (d.fmt == kFmtNvfp4 && I % 16 != 0) return false;
  const int64_t slots = T * k;
  if (slots > 65535 || T > 65535) return false;
  // Gate rows per block: a multiple of 16 (the down input's NVFP4 blocks) and of the 16-row step.
  const int64_t unit = 16;
  const int64_t steps = (I + unit - 1) / unit;
  // ~2 blocks per SM (the kernel's register cap lets two share one): at T = 1, 8 slots x 32 blocks of
  // 32 gate rows (was 1 block per SM, 8 warps streaming per SM).
  const int64_t want_blocks =
      std::max<int64_t>(1, (gu_per_sm > 0 ? gu_per_sm : 2) * static_cast<int64_t>(b.sm_count()) / slots);
  const int64_t per_block = std::max<int64_t>(1, (steps + want_blocks - 1) / want_blocks);
  const int64_t rows_gu = unit * per_block;
  const int64_t smem_gu = (P * padded32(H) + rows_gu) * 4;
  const int64_t smem_d = k * padded32(I) * 4;
  if (smem_d > smem_budget() || I % 4 != 0) return false;
  if (smem_gu > smem_budget()) return false;
  if (T == 0) return true;
  CudaBackend::Scratch act(&b, static_cast<size_t>(slots * I) * 4),
      xq(&b, static_cast<size_t>(slots * P * padded32(H)) * 4), xts(&b, static_cast<size_t>(slots * P) * 4);
  MoeArgs a{};
  a.gw = static_cast<const uint8_t*>(gate_up.weight.data);
  a.gws = static_cast<const uint8_t*>(gate_up.weight_scale.data);
  a.dw = static_cast<const uint8_t*>(down.weight.data);
  a.dws = static_cast<const uint8_t*>(down.weight_scale.data);
  a.ggs = g.fmt == kFmtNvfp4 ? static_cast<const float*>(gate_up.global_scale.data) : nullptr;
  a.dgs = d.fmt == kFmtNvfp4 ? static_cast<const float*>(down.global_scale.data) : nullptr;
  a.gis = gate_up.activation != ActivationQuant::kNone ? static_cast<const float*>(gate_up.input_scale.data) : nullptr;
  a.dis = down.activation != ActivationQuant::kNone ? static_cast<const float*>(down.input_scale.data) : nullptr;
  a.g_row_bytes = g.row_bytes;
  a.d_row_bytes = d.row_bytes;
  a.g_cpr = g.cpr;
  a.d_cpr = d.cpr;
  a.g_act = static_cast<int>(gate_up.activation);
  a.d_act = static_cast<int>(down.activation);
  a.g_P = static_cast<int>(P);
  a.g_modelopt = g.modelopt ? 1 : 0;
  a.d_modelopt = d.modelopt ? 1 : 0;
  a.x = x;
  a.ids = ids;
  a.weights = weights;
  a.act = act.as<float>();
  a.xq = xq.as<float>();
  a.xts = xts.as<float>();
  a.out = out;
  a.H = H;
  a.I = I;
  a.E = E;
  a.k = k;
  a.rows_per_cta = rows_gu;
  const dim3 grid_gu(static_cast<unsigned>((I + rows_gu - 1) / rows_gu), static_cast<unsigned>(slots));
  if (stages & 1) {
    moe_quantize_x_kernel<<<dim3(static_cast<unsigned>(slots), static_cast<unsigned>(P)), kThreads, 0, b.stream()>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  if (stages & 1) switch (g.fmt) {
      case kFmtBf16: launch_gate_up<kFmtBf16>(a, grid_gu, smem_gu, b.stream()); break;
      case kFmtFp8: launch_gate_up<kFmtFp8>(a, grid_gu, smem_gu, b.stream()); break;
      default: launch_gate_up<kFmtNvfp4>(a, grid_gu, smem_gu, b.stream()); break;
    }
  // Down: one output row per warp step; at most ~2 blocks per SM, all resident at once (rounded up:
  // at T = 1, 192 blocks of 16 rows instead of 384 of 8, half the activation staging per row).
  const int64_t dsteps = (H + kWarps - 1) / kWarps;
  const int64_t dwant = std::max<int64_t>(1, 2 * static_cast<int64_t>(b.sm_count()) / T);
  a.rows_per_cta = kWarps * std::max<int64_t>(1, (dsteps + dwant - 1) / dwant);
  const dim3 grid_d(static_cast<unsigned>((H + a.rows_per_cta - 1) / a.rows_per_cta), static_cast<unsigned>(T));
  const bool two = d.cpr >= 64;
  if (stages & 2) switch (d.fmt) {
      case kFmtBf16: launch_down<kFmtBf16>(a, grid_d, smem_d, b.stream(), two); break;
      case kFmtFp8: launch_down<kFmtFp8>(a, grid_d, smem_d, b.stream(), two); break;
      default: launch_down<kFmtNvfp4>(a, grid_d, smem_d, b.stream(), two); break;
    }
  return true;
}
}  // namespace

bool decode_moe(CudaBackend& b, float* out, const float* x, const int32_t* ids, const float* weights, int64_t T,
                int64_t k, const Linear& gate_up, const Linear& down) {
  return decode_moe_impl(b, out, x, ids, weights, T, k, gate_up, down, 3, 0);
}

bool decode_moe_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                      const Linear& gate_up, const Linear& down, int stages, int gu_blocks_per_sm) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  return decode_moe_impl(*c, out.ptr<float>(), x.ptr<const float>(), ids.ptr<const int32_t>(),
                         weights.ptr<const float>(), x.dim(0), ids.dim(1), gate_up, down, stages, gu_blocks_per_sm);
}

}  // namespace sparkserve
