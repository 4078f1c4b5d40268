// Sparse MoE: router softmax + top-k, and the routed SiLU-gated experts, straight from the device
// ids with no host round trip. NVFP4 W4A4 experts (both NVFP4 checkpoint layouts): up to 8 tokens on
// moe_w4a4.cu's integer GEMVs (routing fused), more on moe_grouped.cu's tensor-core kernels. Other
// formats: moe_decode.cu's fused GEMVs (quantized experts, few slots per expert), else per slot a
// GEMV or, for many slots, the slots grouped by expert on the device and a grouped SIMT GEMM (each
// 64-slot tile reads its expert once); then a per-token combine in ascending expert id (HF's eager
// order, as the CPU reference).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe_bf16_grouped.h"
#include "backend/cuda/moe_decode.h"
#include "backend/cuda/moe_grouped.h"
#include "backend/cuda/moe_probe.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/moe_w4a4.h"
#include "backend/cuda/simt_matmul.h"

namespace sparkserve {
namespace {

// One warp per token (moe_route.cuh); probabilities in shared memory [E] where they do not fit in
// registers (and for the checks' reference, `reference`).
__global__ void route_topk_kernel(float* weights, int32_t* ids, const float* logits, int64_t E, int64_t k,
                                  bool reference) {
  extern __shared__ float p[];
  const int64_t t = blockIdx.x;
  if (reference)
    route_topk_warp_smem(p, logits + t * E, E, k, ids + t * k, weights + t * k);
  else
    route_topk_warp(p, logits + t * E, E, k, ids + t * k, weights + t * k);
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

// Groups the slots by expert for the prefill / large-batch path, in one block: counts per expert,
// an exclusive scan, then a scatter of slot indices into expert order, plus a tile table (expert,
// first sorted index, rows) of up to kTileRows rows each for the grouped GEMM. The order of slots
// inside an expert's segment is whatever the atomics give: each output row is computed on its own,
// so the results do not depend on it.
constexpr int kTileRows = kSimtTileRows;

__global__ void group_slots_kernel(const int32_t* ids, int64_t slots, int64_t E, int32_t* counts, int32_t* sorted,
                                   int32_t* tile_e, int32_t* tile_start, int32_t* tile_rows, int32_t* num_tiles) {
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e < 0 || e >= E) __trap();  // the CPU reference CHECKs this too
    atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t offset = 0, tiles = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t c = counts[e];
      for (int32_t r = 0; r < c; r += kTileRows) {
        tile_e[tiles] = static_cast<int32_t>(e);
        tile_start[tiles] = offset + r;
        tile_rows[tiles] = min(kTileRows, c - r);
        ++tiles;
      }
      counts[e] = offset;  // becomes the scatter cursor
      offset += c;
    }
    *num_tiles = tiles;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) sorted[atomicAdd(&counts[ids[s]], 1)] = static_cast<int32_t>(s);
}

}  // namespace

void CudaBackend::moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) {
  const int64_t T = router_logits.dim(0), E = router_logits.dim(1), k = weights.dim(1);
  CHECK(ids.dim(1) == k && k <= E && ids.dtype == DType::kI32);
  CHECK_MSG(E * 4 <= 48 * 1024, "CUDA moe_route_topk supports up to 12288 experts");
  launch_route_topk(stream_, weights.ptr<float>(), ids.ptr<int32_t>(), router_logits.ptr<const float>(), T, E, k);
}

void launch_route_topk(cudaStream_t stream, float* weights, int32_t* ids, const float* logits, int64_t T, int64_t E,
                       int64_t k) {
  if (T == 0) return;
  route_topk_kernel<<<static_cast<unsigned>(T), 32, static_cast<size_t>(E) * 4, stream>>>(weights, ids, logits, E, k,
                                                                                          false);
  CUDA_CHECK_LAUNCH();
}

bool route_topk_probe(Backend& b, const Tensor& weights, const Tensor& ids, const Tensor& logits, bool reference) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  const int64_t T = logits.dim(0), E = logits.dim(1), k = weights.dim(1);
  CHECK(ids.dim(1) == k && k <= E && ids.dtype == DType::kI32 && E * 4 <= 48 * 1024);
  if (T == 0) return true;
  route_topk_kernel<<<static_cast<unsigned>(T), 32, static_cast<size_t>(E) * 4, c->stream()>>>(
      weights.ptr<float>(), ids.ptr<int32_t>(), logits.ptr<const float>(), E, k, reference);
  CUDA_CHECK_LAUNCH();
  return true;
}

namespace {
// The regimes of NVFP4 W4A4 experts, by measurement on the H200 (docs/performance.md, "Decode batches"):
// up to 8 tokens, moe_w4a4.cu's integer GEMVs per (token, expert) pair with the routing fused in
// (repeated experts come from L2; 122B op at T = 4 74 us vs the streamed grouped kernel's 81, T = 8 127
// vs 129; the 122B decode step at batch 8 12.06 ms vs 12.62); more, moe_grouped.cu's tensor-core
// kernels, each distinct expert read once (T = 16 op 204 us vs 231; step at batch 12 15.62 ms vs 16.61,
// batch 16 18.32 vs 19.18).
constexpr int64_t kPairGemvMaxT = 8;
bool pair_gemv_w4a4(int64_t T) { return T <= kPairGemvMaxT; }
bool grouped_w4a4(int64_t T, int64_t k, const float* x, const Linear& gate_up, const Linear& down) {
  return T > kPairGemvMaxT && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && moe_grouped_takes(gate_up, down, k);
}
}  // namespace

void CudaBackend::moe_route_experts(const Tensor& out, const Tensor& weights, const Tensor& ids,
                                    const Tensor& router_logits, const Tensor& x, const Linear& gate_up,
                                    const Linear& down) {
  const int64_t T = x.dim(0), k = ids.dim(1), E = router_logits.dim(1);
  CHECK(router_logits.dim(0) == T && ids.dim(0) == T && weights.numel() == T * k && ids.dtype == DType::kI32);
  CHECK(k <= E && out.numel() == T * x.dim(1));
  if (T > 0 && E == gate_up.weight.dim(0)) {
    if (pair_gemv_w4a4(T) &&
        moe_w4a4(*this, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(),
                 router_logits.ptr<const float>(), T, k, gate_up, down))
      return;
    if (grouped_w4a4(T, k, x.ptr<const float>(), gate_up, down)) {
      moe_grouped(*this, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(),
                  router_logits.ptr<const float>(), T, k, gate_up, down);
      return;
    }
  }
  Backend::moe_route_experts(out, weights, ids, router_logits, x, gate_up, down);  // the two ops
}

namespace {
// The float (f32 / bf16 / non-W4A4) routed experts' paths below the NVFP4 W4A4 ones.
enum class FloatExperts { kByShape = -1, kDecodeGemv = 0, kSlotGemv = 1, kSimtGrouped = 2, kBf16Grouped = 3 };

// bf16 experts are grouped on the tensor cores from 1.25 slots per expert on average (each distinct
// expert read once per tile instead of once per slot by the fused GEMVs). Measured on the H200 at the
// 122B MTP layer's shapes (256 experts, top-8, H 3072, I 1024; gpu_ops --bench-kernels --bench-filter
// "bf16 experts"), op us GEMVs vs tensor-core tiles: 32 tokens (1 slot per expert) 901 vs 990, 48 tokens
// 1561 vs 1242, 64 1850 vs 1374, 192 6387 vs 1851 (the SIMT tiles: 14,699).
bool bf16_grouped_regime(int64_t slots, int64_t E) { return 4 * slots >= 5 * E; }

// moe_experts after the W4A4 paths, the regime chosen by shape (kByShape) or forced (the kernel
// benchmark); false when a forced regime does not take the layout.
bool float_experts(CudaBackend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const Linear& gate_up, const Linear& down, FloatExperts path) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1);
  const int64_t I = down.in_features;
  const int64_t slots = T * k;
  const int64_t E = gate_up.weight.dim(0);
  const cudaStream_t stream = b.stream();
  const bool quantized = is_quantized(gate_up.format) || is_quantized(down.format);
  const bool bf16 = gate_up.format == WeightFormat::kBf16 && down.format == WeightFormat::kBf16;
  const bool tc_takes = bf16 && grouped_bf16_mma_takes(gate_up.weight.data, x.ptr<const float>(), H, 2 * I) &&
                        grouped_bf16_mma_takes(down.weight.data, x.ptr<const float>(), I, H);
  if (path == FloatExperts::kByShape) {
    if (tc_takes && bf16_grouped_regime(slots, E))
      path = FloatExperts::kBf16Grouped;
    else if (quantized || slots <= 4 * E)
      path = FloatExperts::kDecodeGemv;
    else
      path = FloatExperts::kSimtGrouped;
  }
  if (path == FloatExperts::kBf16Grouped && !tc_takes) return false;
  if (path == FloatExperts::kSimtGrouped && quantized) return false;
  // Decode (and quantized experts at any T): moe_decode.cu's two fused launches.
  if (path == FloatExperts::kDecodeGemv) {
    if (decode_moe(b, out.ptr<float>(), x.ptr<const float>(), ids.ptr<const int32_t>(), weights.ptr<const float>(), T,
                   k, gate_up, down))
      return true;
    path = quantized ? FloatExperts::kSlotGemv : (slots <= 4 * E ? FloatExperts::kSlotGemv : FloatExperts::kSimtGrouped);
  }
  CudaBackend::Scratch gu(&b, static_cast<size_t>(slots * 2 * I) * 4), act(&b, static_cast<size_t>(slots * I) * 4),
      y(&b, static_cast<size_t>(slots * H) * 4);
  // Few slots per expert (decode): one GEMV per slot, 16-byte weight loads. Many (prefill): group the
  // slots by expert so each 64-row tile reads an expert's weights once. The SIMT tiles waste most of
  // their work on experts with 1-2 rows (measured slower than the GEMVs at batch 64 of a 256-expert
  // model), hence the switch at 4 rows per expert on average; bf16 experts take the tensor-core tiles.
  const bool grouped = path != FloatExperts::kSlotGemv;
  const int64_t max_tiles = (slots + kTileRows - 1) / kTileRows + E;
  CudaBackend::Scratch meta(&b, grouped ? static_cast<size_t>(E + slots + 3 * max_tiles + 1) * 4 : 0);
  int32_t* counts = meta.as<int32_t>();
  int32_t* sorted = counts + E;
  int32_t* tile_e = sorted + slots;
  int32_t* tile_start = tile_e + max_tiles;
  int32_t* tile_rows = tile_start + max_tiles;
  int32_t* num_tiles = tile_rows + max_tiles;
  if (grouped) {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(E) * 4, stream));
    group_slots_kernel<<<1, 1024, 0, stream>>>(ids.ptr<const int32_t>(), slots, E, counts, sorted, tile_e, tile_start,
                                               tile_rows, num_tiles);
    CUDA_CHECK_LAUNCH();
  }
  const SlotTiles tiles{sorted, tile_e, tile_start, tile_rows, num_tiles, max_tiles};
  // out[slot] = x[slot / x_div] W_e^T for the expert of each slot. x: [*, K] -> out: [slots, N].
  auto expert_matmul = [&](float* o, const float* xin, int64_t x_div, const Linear& w, int64_t K, int64_t N) {
    if (is_quantized(w.format)) {
      b.quant_matmul(o, xin, slots, x_div, ids.ptr<const int32_t>(), w);
      return;
    }
    if (path == FloatExperts::kBf16Grouped)
      launch_grouped_bf16_mma(stream, o, xin, x_div, tiles, w.weight.data, K, N);
    else if (grouped)
      launch_grouped_matmul(stream, o, xin, x_div, tiles, w.weight.data, weight_is_bf16(w), K, N);
    else
      launch_slot_gemv(stream, o, xin, x_div, ids.ptr<const int32_t>(), slots, w.weight.data, weight_is_bf16(w), K, N,
                       E);
  };
  expert_matmul(gu.as<float>(), x.ptr<const float>(), k, gate_up, H, 2 * I);
  slot_silu_mul_kernel<<<blocks_for(slots * I, 256), 256, 0, stream>>>(act.as<float>(), gu.as<const float>(), slots,
                                                                       I);
  CUDA_CHECK_LAUNCH();
  expert_matmul(y.as<float>(), act.as<const float>(), 1, down, I, H);
  combine_kernel<<<blocks_for(T * H, 256), 256, 0, stream>>>(out.ptr<float>(), y.as<const float>(),
                                                             ids.ptr<const int32_t>(), weights.ptr<const float>(), T,
                                                             k, H);
  CUDA_CHECK_LAUNCH();
  return true;
}
}  // namespace

void CudaBackend::moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                              const Linear& gate_up, const Linear& down) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1);
  const int64_t I = down.in_features;
  CHECK(gate_up.out_features == 2 * I && gate_up.in_features == H && down.out_features == H);
  CHECK(out.numel() == T * H && weights.numel() == T * k);
  if (T * k == 0) return;
  if (pair_gemv_w4a4(T) && moe_w4a4(*this, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(),
                                     weights.ptr<float>(), nullptr, T, k, gate_up, down))
    return;
  if (grouped_w4a4(T, k, x.ptr<const float>(), gate_up, down)) {
    moe_grouped(*this, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(), nullptr, T,
                k, gate_up, down);
    return;
  }
  // W4A4 NVFP4 experts the grouped kernels do not take (shapes): integer block dot products.
  if (moe_w4a4(*this, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(), nullptr, T,
               k, gate_up, down))
    return;
  CHECK(float_experts(*this, out, x, ids, weights, gate_up, down, FloatExperts::kByShape));
}

// For the kernel benchmark only (tests/gpu/moe_bf16_bench.cpp declares it: it is built without nvcc):
// the float experts with the regime forced (0 fused decode GEMVs, 1 per-slot GEMVs, 2 SIMT grouped
// tiles, 3 bf16 tensor-core tiles; -1 by shape); false when `b` is not the CUDA backend or the regime
// does not take the layout.
// x: [T, H] f32, ids: [T, k] i32, weights: [T, k] f32 -> out: [T, H] f32
bool float_experts_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                         const Linear& gate_up, const Linear& down, int path) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c || x.dim(0) * ids.dim(1) == 0) return false;
  return float_experts(*c, out, x, ids, weights, gate_up, down, static_cast<FloatExperts>(path));
}

}  // namespace sparkserve
