// Sparse MoE: router softmax + top-k, and the routed SiLU-gated experts. The experts run per
// (token, slot) pair straight from the device ids, with no host round trip: a GEMV per slot for
// gate_up and for down, then a per-token combine in ascending expert id (HF's eager order, as the
// CPU reference). Prefill re-reads an expert's weights once per routed token; grouped expert GEMMs
// are a later step.
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

// One warp per token; probabilities in shared memory [E].
__global__ void route_topk_kernel(float* weights, int32_t* ids, const float* logits, int64_t E, int64_t k) {
  extern __shared__ float p[];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* l = logits + t * E;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) sum += (p[e] = expf(l[e] - mx));
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32) p[e] /= sum;
  __syncwarp();
  float top_sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    // Largest remaining probability, lowest id among ties (a stable descending sort's order).
    float best = -1.0f;
    int32_t best_e = -1;
    for (int64_t e = lane; e < E; e += 32)
      if (p[e] > best) {
        best = p[e];
        best_e = static_cast<int32_t>(e);
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe >= 0 && (best_e < 0 || ob > best || (ob == best && oe < best_e))) {
        best = ob;
        best_e = oe;
      }
    }
    if (lane == 0) {
      ids[t * k + j] = best_e;
      weights[t * k + j] = best;  // probability for now, renormalised below
      p[best_e] = -2.0f;          // taken
    }
    top_sum += best;
    __syncwarp();
  }
  if (lane == 0)
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] /= top_sum;
}

constexpr int kWarps = 8;

// out[slot, n] = x[slot / x_div] . W_e[n], e = ids[slot], W_e = payload + e * N * K.
// x: [*, K] f32, out: [slots, N] f32.
__global__ void __launch_bounds__(kWarps * 32) slot_gemv_kernel(float* out, const float* x, int64_t x_div,
                                                                const int32_t* ids, const void* w, bool bf16,
                                                                int64_t K, int64_t N, int64_t E) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  const int64_t slot = blockIdx.x;
  if (n >= N) return;
  const int64_t e = ids[slot];
  if (e < 0 || e >= E) __trap();  // the CPU reference CHECKs this too
  const float* xr = x + (slot / x_div) * K;
  const int64_t base = (e * N + n) * K;
  float acc = 0.0f;
  // 16-byte weight loads where rows are aligned (K % 8 == 0 and an aligned x), else element-wise.
  const bool vec = K % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15u) == 0;
  if (vec) {
    for (int64_t c = lane * 8; c < K; c += 256) {
      float wv[8];
      if (bf16)
        load8<true>(w, base + c, wv);
      else
        load8<false>(w, base + c, wv);
      const float4 a = *reinterpret_cast<const float4*>(xr + c), b = *reinterpret_cast<const float4*>(xr + c + 4);
      acc += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z +
             wv[7] * b.w;
    }
  } else {
    for (int64_t c = lane; c < K; c += 32) acc += load_weight(w, bf16, base + c) * xr[c];
  }
  acc = warp_sum(acc);
  if (lane == 0) out[slot * N + n] = acc;
}

__global__ void slot_silu_mul_kernel(float* act, const float* gu, int64_t slots, int64_t I) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= slots * I) return;
  const int64_t s = i / I, c = i % I;
  act[i] = silu_f(gu[s * 2 * I + c]) * gu[s * 2 * I + I + c];
}

// out[t] = sum over the token's slots in ascending expert id of weight * y[slot].
__global__ void combine_kernel(float* out, const float* y, const int32_t* ids, const float* w, int64_t T,
                               int64_t k, int64_t H) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * H) return;
  const int64_t t = i / H, c = i % H;
  const int32_t* id = ids + t * k;
  float o = 0.0f;
  int32_t prev = -1;
  for (int64_t n = 0; n < k; ++n) {
    // Next slot: smallest id above the previous one (ids of a token are distinct).
    int64_t pick = -1;
    for (int64_t j = 0; j < k; ++j)
      if (id[j] > prev && (pick < 0 || id[j] < id[pick])) pick = j;
    if (pick < 0) break;
    prev = id[pick];
    o += w[t * k + pick] * y[(t * k + pick) * H + c];
  }
  out[i] = o;
}

}  // namespace

void CudaBackend::moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) {
  const int64_t T = router_logits.dim(0), E = router_logits.dim(1), k = weights.dim(1);
  CHECK(ids.dim(1) == k && k <= E && ids.dtype == DType::kI32);
  CHECK_MSG(E * 4 <= 48 * 1024, "CUDA moe_route_topk supports up to 12288 experts");
  if (T == 0) return;
  route_topk_kernel<<<static_cast<unsigned>(T), 32, static_cast<size_t>(E) * 4, stream_>>>(
      weights.ptr<float>(), ids.ptr<int32_t>(), router_logits.ptr<const float>(), E, k);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                              const Linear& gate_up, const Linear& down) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1);
  const int64_t I = down.in_features;
  CHECK(gate_up.out_features == 2 * I && gate_up.in_features == H && down.out_features == H);
  CHECK(out.numel() == T * H && weights.numel() == T * k);
  const int64_t slots = T * k;
  if (slots == 0) return;
  const int64_t E = gate_up.weight.dim(0);
  Scratch gu(this, static_cast<size_t>(slots * 2 * I) * 4), act(this, static_cast<size_t>(slots * I) * 4),
      y(this, static_cast<size_t>(slots * H) * 4);
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(2 * I, kWarps)), kWarps * 32, 0, stream_>>>(
      gu.as<float>(), x.ptr<const float>(), k, ids.ptr<const int32_t>(), gate_up.weight.data,
      weight_is_bf16(gate_up), H, 2 * I, E);
  CUDA_CHECK_LAUNCH();
  slot_silu_mul_kernel<<<blocks_for(slots * I, 256), 256, 0, stream_>>>(act.as<float>(), gu.as<const float>(),
                                                                        slots, I);
  CUDA_CHECK_LAUNCH();
  slot_gemv_kernel<<<dim3(static_cast<unsigned>(slots), blocks_for(H, kWarps)), kWarps * 32, 0, stream_>>>(
      y.as<float>(), act.as<const float>(), 1, ids.ptr<const int32_t>(), down.weight.data, weight_is_bf16(down), I,
      H, E);
  CUDA_CHECK_LAUNCH();
  combine_kernel<<<blocks_for(T * H, 256), 256, 0, stream_>>>(out.ptr<float>(), y.as<const float>(),
                                                              ids.ptr<const int32_t>(), weights.ptr<const float>(),
                                                              T, k, H);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
