// Gated DeltaNet: causal conv with state, gating, and the delta rule token by token (decode, the
// speculative verify that leaves the state as it is, and the fused decode / verify steps). The chunked
// prefill form is gdn_chunked.cu.
#include <cooperative_groups.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn_state.cuh"
#include "backend/cuda/launch_config.cuh"

namespace sparkserve {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kMaxConvKernel = 5;  // Qwen3.5 / Qwen3-Next: 4

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "gdn.cu needs sm_90 or newer (programmatic dependent launch, thread-block clusters)"
#endif

// Programmatic dependent launch (PTX griddepcontrol, sm_90+). launch_dependents lets the next
// kernel of the stream start (when it was launched with programmatic stream serialization);
// wait blocks until the grids this one depends on have completed and their writes are visible.
// Both are no-ops for launches that did not ask for it.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// One thread per (span, channel): the window of the last K inputs lives in registers.
__global__ void gdn_conv_kernel(float* out, const float* x, const float* w, float* state_pool, DeviceLayout L,
                                int64_t C, int K) {
  pdl_launch_dependents();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(L.num_seqs) * C) return;
  const int s = static_cast<int>(i / C);
  const int64_t c = i % C;
  const int S = K - 1;
  float* state = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * C + c) * S;
  float win[kMaxConvKernel], wc[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    win[j] = j < S ? state[j] : 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
  }
  const int64_t r0 = L.row_begin(s), n = L.num_tokens(s);
  for (int64_t t = 0; t < n; ++t) {
    // win[0..S) = previous inputs, win[S] = this one.
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j == S) win[j] = x[(r0 + t) * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < K) acc += wc[j] * win[j];
    out[(r0 + t) * C + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j)
      if (j < S) win[j] = win[j + 1];
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < S) state[j] = win[j];
}

// Multi-token conv (the gdn_conv op): one block per (kConvRows rows of a span, kThreads channels), so
// a long prompt spreads over the whole GPU instead of walking its tokens one by one in C threads; a
// thread slides one window over its rows (each input loaded once, not K times). Block x is the x-th
// row group of the spans in span order: only span rows are launched, and a block finds its rows
// without a division. Inputs before a span's first row come from its state slot (the K-1 previous
// inputs). state_out (null: the pools are only read, gdn_verify) gets the new conv states: the slot
// := the last K-1 inputs of (old state, the span's rows), each save's row (SeqSpan::saves) := the K-1
// inputs before its position. A span's first row group is the only block that reads its slot (later
// groups start at t0 >= kConvRows >= K-1), so that block writes them, after its reads, in place.
constexpr int kConvRows = 4;
static_assert(kMaxConvKernel - 1 <= kConvRows, "the first row group must hold every read of the old conv state");
__global__ void gdn_conv_rows_kernel(float* out, const float* x, const float* w, const float* state_pool,
                                     float* state_out, DeviceLayout L, int64_t C, int K) {
  pdl_launch_dependents();  // the verify step kernel after it waits for its output
  const int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int s = 0, g = static_cast<int>(blockIdx.x), n = 0;
  for (; s < L.num_seqs; ++s) {
    n = L.num_tokens(s);
    const int groups = (n + kConvRows - 1) / kConvRows;
    if (g < groups) break;
    g -= groups;
  }
  if (s >= L.num_seqs || c >= C) return;
  const int S = K - 1, t0 = g * kConvRows;
  const int64_t r0 = L.row_begin(s);
  const float* state = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * C + c) * S;
  // win[i]: the input at span position t0 - S + i (< 0: held in the state).
  constexpr int W = kMaxConvKernel - 1 + kConvRows;
  float win[W], wt[kMaxConvKernel];
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const int p = t0 - S + i;
    if (i < S + kConvRows && p < n) win[i] = p >= 0 ? x[(r0 + p) * C + c] : state[S + p];
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < K) wt[j] = w[c * K + j];
#pragma unroll
  for (int r = 0; r < kConvRows; ++r) {
    if (t0 + r >= n) break;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < K) acc += wt[j] * win[r + j];
    out[(r0 + t0 + r) * C + c] = silu_f(acc);
  }
  if (state_out == nullptr || g != 0) return;
  // dst := the K-1 inputs before span position t >= 1; win[0..S) hold the old state.
  auto write = [&](float* dst, int t) {
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j) {
      if (j >= S) break;
      const int p = t - S + j;
      float v = 0.0f;
      if (p >= 0) {
        v = x[(r0 + p) * C + c];
      } else {
#pragma unroll
        for (int m = 0; m < kMaxConvKernel - 1; ++m)
          if (m == S + p) v = win[m];
      }
      dst[j] = v;
    }
  };
  const int saves = L.num_saves(s);
  for (int i = 0; i < saves; ++i) {
    const int2 v = L.save(s, i);
    write(state_out + (static_cast<int64_t>(v.y) * C + c) * S, v.x);
  }
  write(state_out + (static_cast<int64_t>(L.gdn_slot(s)) * C + c) * S, n);
}

// gdn_conv_rows_kernel over the rows of batch's spans.
void launch_conv_rows(cudaStream_t stream, float* out, const float* x, const float* w, const float* state_pool,
                      float* state_out, const DeviceLayout& L, const BatchLayout& batch, int64_t C, int64_t K) {
  int64_t groups = 0;
  for (const SeqSpan& sp : batch.seqs) groups += (sp.num_tokens + kConvRows - 1) / kConvRows;
  if (groups == 0) return;
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  gdn_conv_rows_kernel<<<grid, kThreads, 0, stream>>>(out, x, w, state_pool, state_out, L, C, static_cast<int>(K));
  CUDA_CHECK_LAUNCH();
}

__global__ void gdn_gating_kernel(float* g, float* beta, const float* a, const float* b, const float* A_log,
                                  const float* dt_bias, int64_t T, int64_t Hv) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * Hv) return;
  const int64_t h = i % Hv;
  const float x = a[i] + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch softplus, threshold 20
  g[i] = -expf(A_log[h]) * softplus;
  beta[i] = sigmoid_f(b[i]);
}

// The delta rule with the state in registers. A head's [dk, dv] state (64 KiB at 128 x 128) is
// spread over blocks of 32 state columns: the delta rule of column j needs only q, k, v[j] and
// S[:, j]. Each warp owns 8 columns whole: lane (rg, quad) holds 4 adjacent columns (one 16-byte
// access) on rows rg, rg + 16, ... in registers for all of a span's tokens, so S is read and written
// once and the column sums S^T k, S^T q are warp shuffles (no shared memory, no block barrier).
constexpr int kTileThreads = 128;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kTileCols = 32;                          // state columns per block, 8 per warp
constexpr int kTileGroups = 16;                        // row groups: lane = 2 rg + quad
constexpr int kTileMaxDk = 128;
constexpr int kTileMaxDv = 128;                        // at most 4 blocks per cluster
constexpr int kTileRows = kTileMaxDk / kTileGroups;    // rows per thread
constexpr int kTileSlots = kTileMaxDv / kTileCols * kTileWarps;
constexpr int kTileAbUnroll = 8;

// q and k of one token (rows of the conv output), L2-normalised as HF's l2norm (x * rsqrt(sum x^2 +
// 1e-6), q also scaled by dk^-0.5), handed to the thread's rows: qn[m], kn[m] = element rg + 16 m.
// Every warp loads both whole (lane l holds l, l + 32, ...).
template <int kRows>
__device__ __forceinline__ void load_qk(float (&qn)[kRows], float (&kn)[kRows], const float* qs, const float* ks,
                                        int dk, float scale, int lane, int rg) {
  constexpr int kQk = kRows / 2;
  float qr[kQk], kr[kQk];
#pragma unroll
  for (int u = 0; u < kQk; ++u) {
    const int i = lane + 32 * u;
    qr[u] = i < dk ? qs[i] : 0.0f;
    kr[u] = i < dk ? ks[i] : 0.0f;
  }
  float ssq_q = 0.0f, ssq_k = 0.0f;
#pragma unroll
  for (int u = 0; u < kQk; ++u) {
    ssq_q += qr[u] * qr[u];
    ssq_k += kr[u] * kr[u];
  }
  ssq_q = warp_sum(ssq_q);
  ssq_k = warp_sum(ssq_k);
  const float iq = 1.0f / sqrtf(ssq_q + 1e-6f) * scale, ik = 1.0f / sqrtf(ssq_k + 1e-6f);
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = rg + m * kTileGroups;  // held by lane i % 32 as element i / 32 = m / 2
    const float qi = __shfl_sync(0xffffffffu, qr[m / 2], rg + 16 * (m & 1));
    const float ki = __shfl_sync(0xffffffffu, kr[m / 2], rg + 16 * (m & 1));
    qn[m] = i < dk ? qi * iq : 0.0f;
    kn[m] = i < dk ? ki * ik : 0.0f;
  }
}

// One token of the delta rule on the thread's tile, in the CPU reference's order: S = e^g S;
// kv = S^T k; delta = beta (v - kv); S += k delta^T; returns o = S^T q for its 4 columns, summed
// over the warp's row groups.
template <int kRows>
__device__ __forceinline__ float4 delta_token(float4 (&st)[kRows], const float (&qn)[kRows], const float (&kn)[kRows],
                                              float4 v, float decay, float bt) {
  float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    st[m].x *= decay;
    st[m].y *= decay;
    st[m].z *= decay;
    st[m].w *= decay;
    kv.x += st[m].x * kn[m];
    kv.y += st[m].y * kn[m];
    kv.z += st[m].z * kn[m];
    kv.w += st[m].w * kn[m];
  }
#pragma unroll
  for (int o = 2; o < 32; o <<= 1) {
    kv.x += __shfl_xor_sync(0xffffffffu, kv.x, o);
    kv.y += __shfl_xor_sync(0xffffffffu, kv.y, o);
    kv.z += __shfl_xor_sync(0xffffffffu, kv.z, o);
    kv.w += __shfl_xor_sync(0xffffffffu, kv.w, o);
  }
  const float4 delta = make_float4((v.x - kv.x) * bt, (v.y - kv.y) * bt, (v.z - kv.z) * bt, (v.w - kv.w) * bt);
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    st[m].x += kn[m] * delta.x;
    st[m].y += kn[m] * delta.y;
    st[m].z += kn[m] * delta.z;
    st[m].w += kn[m] * delta.w;
    o.x += st[m].x * qn[m];
    o.y += st[m].y * qn[m];
    o.z += st[m].z * qn[m];
    o.w += st[m].w * qn[m];
  }
#pragma unroll
  for (int k = 2; k < 32; k <<= 1) {
    o.x += __shfl_xor_sync(0xffffffffu, o.x, k);
    o.y += __shfl_xor_sync(0xffffffffu, o.y, k);
    o.z += __shfl_xor_sync(0xffffffffu, o.z, k);
    o.w += __shfl_xor_sync(0xffffffffu, o.w, k);
  }
  return o;
}

// The thread's tile of state S [dk, dv] (rows rg + 16 m, columns c .. c + 3): loaded (widened to
// f32), stored (rounded to the pool's dtype: gdn_state.cuh).
template <int kRows, class St>
__device__ __forceinline__ void load_tile(float4 (&st)[kRows], const St* S, int dk, int dv, int c, bool col_ok,
                                          int rg) {
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = rg + m * kTileGroups;
    st[m] = col_ok && i < dk ? state_load4(S + static_cast<int64_t>(i) * dv + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}
template <int kRows, class St>
__device__ __forceinline__ void store_tile(const float4 (&st)[kRows], St* S, int dk, int dv, int c, bool col_ok,
                                           int rg) {
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const int i = rg + m * kTileGroups;
    if (col_ok && i < dk) state_store4(S + static_cast<int64_t>(i) * dv + c, st[m]);
  }
}

// gdn_recurrent (kWrite: the state advances) and gdn_verify (the state is only read): the delta rule
// over each span's tokens on the register tile, one block per (span, value head, 32 columns).
// kRows: rows per thread (dk <= 16 kRows). At dk <= 128 at most 96 registers (no spills), so five
// blocks fit an SM instead of four: a batch of 64 sequences is ~25 waves of blocks, not ~31. St: the
// state pool's storage (gdn_state.cuh); a bf16 state is rounded only where it is stored (the span's
// end and its saves).
template <int kRows, bool kWrite, class St>
__global__ void __launch_bounds__(kTileThreads, kRows <= kTileRows ? 5 : 1) gdn_delta_kernel(
    float* out, const float* qkv, const float* g, const float* beta, St* state_pool, DeviceLayout L, int Hv,
    int Hk, int dk, int dv, int64_t conv_dim, float scale) {
  const int col_blocks = (dv + kTileCols - 1) / kTileCols;
  const int head = static_cast<int>(blockIdx.x) / col_blocks, cb = static_cast<int>(blockIdx.x) % col_blocks;
  const int s = head / Hv, h = head % Hv, kh = h / (Hv / Hk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 2;
  const int c = cb * kTileCols + warp * 8 + (lane & 1) * 4;  // this thread's first column
  const bool col_ok = c < dv;                                 // dv % 4 == 0
  const int64_t key_dim = static_cast<int64_t>(Hk) * dk;
  St* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;
  float4 st[kRows];
  load_tile(st, S, dk, dv, c, col_ok, rg);
  const int64_t r0 = L.row_begin(s), n = L.num_tokens(s);
  // The next state save (SeqSpan::saves) of the span: {tokens, row}; tokens 0 when none is left.
  const int saves = kWrite ? L.num_saves(s) : 0;
  int next = 0;
  int2 save = saves > 0 ? L.save(s, 0) : make_int2(0, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = r0 + t;
    const float* qs = qkv + row * conv_dim + static_cast<int64_t>(kh) * dk;
    float qn[kRows], kn[kRows];
    load_qk(qn, kn, qs, qs + key_dim, dk, scale, lane, rg);
    const float4 v = col_ok ? *reinterpret_cast<const float4*>(qkv + row * conv_dim + 2 * key_dim +
                                                               static_cast<int64_t>(h) * dv + c)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 o = delta_token(st, qn, kn, v, expf(g[row * Hv + h]), beta[row * Hv + h]);
    if (rg == 0 && col_ok) *reinterpret_cast<float4*>(out + (row * Hv + h) * dv + c) = o;
    for (; save.x == t + 1; save = ++next < saves ? L.save(s, next) : make_int2(0, 0))
      store_tile(st, state_pool + (static_cast<int64_t>(save.y) * Hv + h) * dk * dv, dk, dv, c, col_ok, rg);
  }
  if (kWrite) store_tile(st, S, dk, dv, c, col_ok, rg);
}

// gdn_verify_step's chain after the conv, per token of a span from the live state, which is never
// written: gating (g, beta, both kept: the speculative stash) -> L2-norm q, k -> delta step -> gated
// RMSNorm of the head's dv outputs. A cluster of nc blocks per (span, value head), block r owning
// state columns [32r, 32r + 32) in the register layout above. What the warps of a head share crosses
// the cluster once each way per token, every warp writing its partial into a slot of every block's
// shared memory and every block adding the slots in order (deterministic, the same in every block):
// the a/b dot products (each block does 1/nc of the H terms) and the RMSNorm's sum of squares. The
// state tile is loaded first, so its DRAM round trip overlaps the a/b products and the wait for the
// conv kernel (programmatic dependent launch). Used while the grid fits one wave (gdn_verify_step).
template <class St>
__global__ void __launch_bounds__(kTileThreads) gdn_verify_step_kernel(
    float* out, const float* qkv, const float* z, const float* a, const float* b, const float* hid,
    const void* wa, const void* wb, bool w_bf16, int64_t H, const float* A_log, const float* dt_bias,
    const float* norm_w, float eps, const St* state_pool, float* g_out, float* beta_out, DeviceLayout L, int Hv,
    int Hk, int dk, int dv, int64_t conv_dim, float scale) {
  __shared__ float ab_all[kTileSlots][2];  // [rank * warps + warp]: that warp's share of a and b
  __shared__ double ssq_all[kTileSlots];   // [rank * warps + warp]: sum of squares of its outputs

  const cg::cluster_group cluster = cg::this_cluster();
  const int nc = static_cast<int>(cluster.num_blocks());
  const int cb = static_cast<int>(cluster.block_rank());
  const int head = static_cast<int>(blockIdx.x) / nc;  // span * Hv + value head
  const int s = head / Hv, h = head % Hv, kh = h / (Hv / Hk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 2;
  const int slot = cb * kTileWarps + warp;
  const int c = cb * kTileCols + warp * 8 + (lane & 1) * 4;  // this thread's first column
  const bool col_ok = c < dv;                                 // dv % 8 == 0: a warp's quads are all in or out
  const int64_t key_dim = static_cast<int64_t>(Hk) * dk;
  const St* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // A block may write another's shared memory only once that one has started: arrive here, wait
  // before the first remote write.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  float4 st[kTileRows];
  load_tile(st, S, dk, dv, c, col_ok, rg);
  const int64_t r0 = L.row_begin(s), n = L.num_tokens(s);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = r0 + t;
    const int64_t oi = (row * Hv + h) * dv + c;
    const float4 zv = rg == 0 && col_ok ? *reinterpret_cast<const float4*>(z + oi) : zero4;

    float a_val, b_val, pa = 0.0f, pb = 0.0f;
    if (wa) {
      const int64_t chunk = (H + nc - 1) / nc, beg = cb * chunk, end = beg + chunk < H ? beg + chunk : H;
      const float* hr = hid + row * H;
      for (int64_t base = beg + threadIdx.x; base < end; base += kTileAbUnroll * kTileThreads) {
        float xv[kTileAbUnroll], av[kTileAbUnroll], bv[kTileAbUnroll];
#pragma unroll
        for (int u = 0; u < kTileAbUnroll; ++u) {
          const int64_t i = base + static_cast<int64_t>(u) * kTileThreads;
          const bool in = i < end;
          xv[u] = in ? hr[i] : 0.0f;
          av[u] = in ? load_weight(wa, w_bf16, h * H + i) : 0.0f;
          bv[u] = in ? load_weight(wb, w_bf16, h * H + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kTileAbUnroll; ++u) {
          pa += xv[u] * av[u];
          pb += xv[u] * bv[u];
        }
      }
      pa = warp_sum(pa);
      pb = warp_sum(pb);
    }
    // Before the first remote write: every block of the cluster has started (first token), every
    // block has read the previous token's slots (later tokens; the a/b exchange's sync does it too).
    if (t == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    else if (!wa) cluster.sync();
    if (wa) {
      if (lane < nc) {  // lane r writes this warp's slot in block r
        float* dst = cluster.map_shared_rank(&ab_all[slot][0], lane);
        dst[0] = pa;
        dst[1] = pb;
      }
      cluster.sync();
      a_val = 0.0f;
      b_val = 0.0f;
      for (int k = 0; k < nc * kTileWarps; ++k) {
        a_val += ab_all[k][0];
        b_val += ab_all[k][1];
      }
    } else {
      a_val = a[row * Hv + h];
      b_val = b[row * Hv + h];
    }
    // Gating as gdn_gating_kernel computes it.
    const float x = a_val + dt_bias[h];
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    const float g = -expf(A_log[h]) * softplus;
    const float bt = sigmoid_f(b_val);
    if (cb == 0 && threadIdx.x == 0) {
      g_out[row * Hv + h] = g;
      beta_out[row * Hv + h] = bt;
    }

    if (t == 0) pdl_wait();  // qkv is the conv kernel's output
    const float* qs = qkv + row * conv_dim + static_cast<int64_t>(kh) * dk;
    float qn[kTileRows], kn[kTileRows];
    load_qk(qn, kn, qs, qs + key_dim, dk, scale, lane, rg);
    const float4 v = col_ok ? *reinterpret_cast<const float4*>(qkv + row * conv_dim + 2 * key_dim +
                                                               static_cast<int64_t>(h) * dv + c)
                            : zero4;
    const float4 o = delta_token(st, qn, kn, v, expf(g), bt);

    // Gated RMSNorm over the head's dv outputs (sum of squares in double, as norm.cu). Every lane
    // holds its quad's sums, so after adding the two quads every lane has the warp's share.
    double sq = col_ok ? static_cast<double>(o.x) * o.x + static_cast<double>(o.y) * o.y +
                             static_cast<double>(o.z) * o.z + static_cast<double>(o.w) * o.w
                       : 0.0;
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    if (lane < nc) *cluster.map_shared_rank(&ssq_all[slot], lane) = sq;
    cluster.sync();  // every warp's slot written (no shared memory is touched across blocks after this)
    if (rg == 0 && col_ok) {
      double tot = 0.0;
      for (int k = 0; k < nc * kTileWarps; ++k) tot += ssq_all[k];
      const float rs = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(dv) + eps));
      float4 y;
      y.x = o.x * rs * norm_w[c] * silu_f(zv.x);
      y.y = o.y * rs * norm_w[c + 1] * silu_f(zv.y);
      y.z = o.z * rs * norm_w[c + 2] * silu_f(zv.z);
      y.w = o.w * rs * norm_w[c + 3] * silu_f(zv.w);
      *reinterpret_cast<float4*>(out + oi) = y;
    }
  }
}

// The decode chain after the conv, every span one token: gating (g, beta) -> L2-norm q, k -> delta
// step -> gated RMSNorm of the head's dv outputs. What moves is the head's [dk, dv] f32 state (64 KB
// at 128 x 128), read once and written once, so the kernel is built to keep state loads in flight:
// one block of 8 warps per (span, value head), each warp owning 16 columns (lane = 4 rg + quad: 4
// adjacent columns in one 16-byte access, on rows rg, rg + 8, ..., 16 rows in registers); a block
// issues its 64 KB of state loads first, and 126 registers give 2 blocks (128 KB of loads) per SM.
// The state is loaded and stored evict-first (ld/st .cs: it is not read again before the other
// layers have streamed through L2), which measured 3-7% faster than default caching. The column sums
// S^T k, S^T q are warp shuffles; the a/b partials and the RMSNorm's sum of squares (in double) meet
// in shared memory behind one __syncthreads each, added in warp order. q and k are normalised once
// per block by warps 0 and 1 into shared memory. The state loads and the a/b products overlap the
// conv kernel (programmatic dependent launch); only the reads of its output wait at
// griddepcontrol.wait. (A cluster of 4 blocks of 4 warps x 8 columns per head, the kernel this
// replaced, ran at batch 64 16,384 blocks of 16 KB each through a ~10 us chain of two cluster
// barriers and serial L2 round trips: ~2.1 TB/s. Splitting a head over a cluster of 2 or 4 blocks,
// which puts more SMs to work at batch 1, measured no faster there and slower at every batch >= 2.)
constexpr int kStepMaxDk = 128;
constexpr int kStepMaxDv = 128;
constexpr int kStepThreads = 256;                      // per head
constexpr int kStepWarps = kStepThreads / 32;
constexpr int kStepCols = 16;                          // state columns per warp
constexpr int kStepGroups = 8;                         // row groups: lane = 4 rg + quad
constexpr int kStepRows = kStepMaxDk / kStepGroups;    // rows per thread
constexpr int kStepAbUnroll = 3;                       // 4-element groups of H per thread and round

// Four consecutive weight elements from element i (i % 4 == 0; 8-byte aligned bf16 or 16-byte f32).
__device__ __forceinline__ float4 load_weight4(const void* w, bool bf16, int64_t i) {
  if (bf16) {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(w) + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
  return *reinterpret_cast<const float4*>(static_cast<const float*>(w) + i);
}

// The a/b partial dot products of this thread (a block of kThreads over the H terms of row `row` of
// h against value head h's rows of in_proj_a/b), summed over its warp: 16-byte loads of h when ab_vec
// (H % 4 == 0 and aligned rows), else element by element.
template <int kThreads>
__device__ __forceinline__ void ab_partials(float& pa, float& pb, const float* hid, const void* wa, const void* wb,
                                            bool w_bf16, bool ab_vec, int64_t H, int64_t row, int h) {
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  pa = 0.0f;
  pb = 0.0f;
  const float* hr = hid + row * H;
  const int64_t wrow = static_cast<int64_t>(h) * H;
  const int64_t n4 = ab_vec ? H / 4 : 0;
  for (int64_t base = threadIdx.x; base < n4; base += kStepAbUnroll * kThreads) {
    float4 xv[kStepAbUnroll], av[kStepAbUnroll], bv[kStepAbUnroll];
#pragma unroll
    for (int u = 0; u < kStepAbUnroll; ++u) {
      const int64_t j = base + static_cast<int64_t>(u) * kThreads;
      const bool in = j < n4;
      xv[u] = in ? reinterpret_cast<const float4*>(hr)[j] : zero4;
      av[u] = in ? load_weight4(wa, w_bf16, wrow + 4 * j) : zero4;
      bv[u] = in ? load_weight4(wb, w_bf16, wrow + 4 * j) : zero4;
    }
#pragma unroll
    for (int u = 0; u < kStepAbUnroll; ++u) {
      pa += xv[u].x * av[u].x + xv[u].y * av[u].y + xv[u].z * av[u].z + xv[u].w * av[u].w;
      pb += xv[u].x * bv[u].x + xv[u].y * bv[u].y + xv[u].z * bv[u].z + xv[u].w * bv[u].w;
    }
  }
  // The elements past 4 * n4 (all of H when !ab_vec).
#pragma unroll 1
  for (int64_t i = 4 * n4 + threadIdx.x; i < H; i += kThreads) {
    pa += hr[i] * load_weight(wa, w_bf16, wrow + i);
    pb += hr[i] * load_weight(wb, w_bf16, wrow + i);
  }
  pa = warp_sum(pa);
  pb = warp_sum(pb);
}

// Warp 0: q (HF l2norm: x * rsqrt(sum x^2 + 1e-6), times dk^-0.5), warp 1: k, of key head kh of
// row `row` into qk_n (zero past dk).
__device__ __forceinline__ void normalise_qk(float (&qk_n)[2][kStepMaxDk], const float* qkv, int64_t row,
                                             int64_t conv_dim, int64_t key_dim, int kh, int dk, float scale,
                                             int warp, int lane) {
  const float* src = qkv + row * conv_dim + warp * key_dim + static_cast<int64_t>(kh) * dk;
  float x[kStepMaxDk / 32], ss = 0.0f;
#pragma unroll
  for (int t = 0; t < kStepMaxDk / 32; ++t) {
    const int i = lane + 32 * t;
    x[t] = i < dk ? src[i] : 0.0f;
    ss += x[t] * x[t];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss + 1e-6f) * (warp == 0 ? scale : 1.0f);
#pragma unroll
  for (int t = 0; t < kStepMaxDk / 32; ++t) qk_n[warp][lane + 32 * t] = x[t] * inv;
}

// A step kernel's gating of (span row `row`, value head h), as gdn_gating_kernel computes it: a and b
// summed over the block's warps in warp order where the kernel projected them itself (fused: ab_all[w]
// holds warp w's share), else read from a, b [T, Hv]. decay = e^g, bt = sigmoid(b).
template <int kWarps>
__device__ __forceinline__ void step_gating(const float (&ab_all)[kWarps][2], bool fused, const float* a,
                                            const float* b, const float* A_log, const float* dt_bias, int64_t row,
                                            int Hv, int h, float& decay, float& bt) {
  float a_val, b_val;
  if (fused) {
    a_val = 0.0f;
    b_val = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      a_val += ab_all[k][0];
      b_val += ab_all[k][1];
    }
  } else {
    a_val = a[row * Hv + h];
    b_val = b[row * Hv + h];
  }
  const float x = a_val + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  decay = expf(-expf(A_log[h]) * softplus);
  bt = sigmoid_f(b_val);
}

// St: the state pool's storage (gdn_state.cuh). Used for f32; a bf16 state takes gdn_step_bf16_kernel.
template <class St>
__global__ void __launch_bounds__(kStepThreads) gdn_step_kernel(
    float* out, const float* qkv, const float* z, const float* a, const float* b, const float* hid,
    const void* wa, const void* wb, bool w_bf16, bool ab_vec, int64_t H, const float* A_log, const float* dt_bias,
    const float* norm_w, float eps, St* state_pool, DeviceLayout L, int Hv, int Hk, int dk, int dv,
    int64_t conv_dim, float scale) {
  __shared__ float qk_n[2][kStepMaxDk];     // normalised q (scaled), k; zero past dk
  __shared__ float ab_all[kStepWarps][2];   // that warp's share of a and b
  __shared__ double ssq_all[kStepWarps];    // sum of squares of that warp's outputs

  const int head = static_cast<int>(blockIdx.x);  // span * Hv + value head
  const int s = head / Hv, h = head % Hv, kh = h / (Hv / Hk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 4;
  const int c = warp * kStepCols + (lane & 3) * 4;  // this thread's first column
  const bool col_ok = c < dv;                       // dv % 4 == 0: a thread's 4 columns are all in or out
  const int64_t row = L.row_begin(s);
  const int64_t key_dim = static_cast<int64_t>(Hk) * dk;
  St* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  float4 st[kStepRows];
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const int i = rg + m * kStepGroups;
    // (The pointer computed first: the same expression inside the call measured 140 registers for the
    // f32 kernel instead of 126, one block per SM instead of two.)
    const St* src = S + static_cast<int64_t>(i) * dv + c;
    st[m] = col_ok && i < dk ? state_load4_cs(src) : zero4;
  }
  const int64_t oi = (row * Hv + h) * dv + c;
  const float4 zv = rg == 0 && col_ok ? *reinterpret_cast<const float4*>(z + oi) : zero4;

  float pa = 0.0f, pb = 0.0f;
  if (wa) ab_partials<kStepThreads>(pa, pb, hid, wa, wb, w_bf16, ab_vec, H, row, h);

  pdl_wait();  // qkv is the conv kernel's output
  if (warp < 2) normalise_qk(qk_n, qkv, row, conv_dim, key_dim, kh, dk, scale, warp, lane);
  const float4 v = col_ok ? *reinterpret_cast<const float4*>(qkv + row * conv_dim + 2 * key_dim +
                                                             static_cast<int64_t>(h) * dv + c)
                          : zero4;
  if (wa && lane == 0) {
    ab_all[warp][0] = pa;
    ab_all[warp][1] = pb;
  }
  __syncthreads();  // also for qk_n
  float decay, bt;
  step_gating(ab_all, wa != nullptr, a, b, A_log, dt_bias, row, Hv, h, decay, bt);

  // S = e^g S; kv = S^T k (this thread's rows, then the warp's 8 row groups: lanes 4 apart).
  float4 kv = zero4;
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const float ki = qk_n[1][rg + m * kStepGroups];
    st[m].x *= decay;
    st[m].y *= decay;
    st[m].z *= decay;
    st[m].w *= decay;
    kv.x += st[m].x * ki;
    kv.y += st[m].y * ki;
    kv.z += st[m].z * ki;
    kv.w += st[m].w * ki;
  }
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    kv.x += __shfl_xor_sync(0xffffffffu, kv.x, o);
    kv.y += __shfl_xor_sync(0xffffffffu, kv.y, o);
    kv.z += __shfl_xor_sync(0xffffffffu, kv.z, o);
    kv.w += __shfl_xor_sync(0xffffffffu, kv.w, o);
  }
  const float4 delta = make_float4((v.x - kv.x) * bt, (v.y - kv.y) * bt, (v.z - kv.z) * bt, (v.w - kv.w) * bt);

  // S += k delta^T; o = S^T q.
  float4 o = zero4;
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const int i = rg + m * kStepGroups;
    const float ki = qk_n[1][i], qi = qk_n[0][i];
    st[m].x += ki * delta.x;
    st[m].y += ki * delta.y;
    st[m].z += ki * delta.z;
    st[m].w += ki * delta.w;
    if (col_ok && i < dk) state_store4_cs(S + static_cast<int64_t>(i) * dv + c, st[m]);
    o.x += st[m].x * qi;
    o.y += st[m].y * qi;
    o.z += st[m].z * qi;
    o.w += st[m].w * qi;
  }
#pragma unroll
  for (int k = 4; k < 32; k <<= 1) {
    o.x += __shfl_xor_sync(0xffffffffu, o.x, k);
    o.y += __shfl_xor_sync(0xffffffffu, o.y, k);
    o.z += __shfl_xor_sync(0xffffffffu, o.z, k);
    o.w += __shfl_xor_sync(0xffffffffu, o.w, k);
  }

  // Gated RMSNorm over the head's dv outputs (sum of squares in double, as norm.cu). Every lane
  // holds its quad's sums, so after adding the four quads every lane has the warp's share.
  double sq = col_ok ? static_cast<double>(o.x) * o.x + static_cast<double>(o.y) * o.y +
                           static_cast<double>(o.z) * o.z + static_cast<double>(o.w) * o.w
                     : 0.0;
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  sq += __shfl_xor_sync(0xffffffffu, sq, 2);
  if (lane == 0) ssq_all[warp] = sq;
  __syncthreads();
  if (rg == 0 && col_ok) {
    double tot = 0.0;
#pragma unroll
    for (int k = 0; k < kStepWarps; ++k) tot += ssq_all[k];
    const float rs = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(dv) + eps));
    float4 y;
    y.x = o.x * rs * norm_w[c] * silu_f(zv.x);
    y.y = o.y * rs * norm_w[c + 1] * silu_f(zv.y);
    y.z = o.z * rs * norm_w[c + 2] * silu_f(zv.z);
    y.w = o.w * rs * norm_w[c + 3] * silu_f(zv.w);
    *reinterpret_cast<float4*>(out + oi) = y;
  }
}

// gdn_step_kernel for a bf16 state. Half the bytes per head (32 KB at 128 x 128) in the f32
// kernel's layout would halve the bytes in flight per SM (2 blocks of 32 KB: measured ~2 TB/s, 38.4
// against 45.3 us at 122B b16), so a lane owns twice the columns: one block of 4 warps per (span,
// value head), each warp 32 columns (lane = 4 rg + quad: 8 adjacent columns in one 16-byte access, on
// rows rg, rg + 8, ..., 16 rows), and the state stays in registers as loaded (16 x 8 bf16 = 64
// registers, the f32 kernel's count). The decay is applied twice from the same bf16 values (for
// S^T k, then for the update): the same f32 products the f32 kernel keeps. 4 blocks of 128 threads
// fit an SM: 128 KB of state loads in flight per SM, as in the f32 kernel.
constexpr int kStepB16Threads = 128;
constexpr int kStepB16Warps = kStepB16Threads / 32;
constexpr int kStepB16Cols = 32;  // state columns per warp

__device__ __forceinline__ void unpack_bf16x8(const uint4 u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __uint_as_float(w[j] << 16);
    f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

__global__ void __launch_bounds__(kStepB16Threads) gdn_step_bf16_kernel(
    float* out, const float* qkv, const float* z, const float* a, const float* b, const float* hid,
    const void* wa, const void* wb, bool w_bf16, bool ab_vec, int64_t H, const float* A_log, const float* dt_bias,
    const float* norm_w, float eps, uint16_t* state_pool, DeviceLayout L, int Hv, int Hk, int dk, int dv,
    int64_t conv_dim, float scale) {
  __shared__ float qk_n[2][kStepMaxDk];      // normalised q (scaled), k; zero past dk
  __shared__ float ab_all[kStepB16Warps][2];  // that warp's share of a and b
  __shared__ double ssq_all[kStepB16Warps];   // sum of squares of that warp's outputs

  const int head = static_cast<int>(blockIdx.x);  // span * Hv + value head
  const int s = head / Hv, h = head % Hv, kh = h / (Hv / Hk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 4;
  const int c = warp * kStepB16Cols + (lane & 3) * 8;  // this thread's first column
  const bool col_ok = c < dv;                           // dv % 8 == 0: a thread's 8 columns are all in or out
  const int64_t row = L.row_begin(s);
  const int64_t key_dim = static_cast<int64_t>(Hk) * dk;
  uint16_t* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;

  uint4 st[kStepRows];
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const int i = rg + m * kStepGroups;
    const uint4* src = reinterpret_cast<const uint4*>(S + static_cast<int64_t>(i) * dv + c);
    st[m] = col_ok && i < dk ? __ldcs(src) : make_uint4(0u, 0u, 0u, 0u);
  }
  const int64_t oi = (row * Hv + h) * dv + c;

  float pa = 0.0f, pb = 0.0f;
  if (wa) ab_partials<kStepB16Threads>(pa, pb, hid, wa, wb, w_bf16, ab_vec, H, row, h);

  pdl_wait();  // qkv is the conv kernel's output
  if (warp < 2) normalise_qk(qk_n, qkv, row, conv_dim, key_dim, kh, dk, scale, warp, lane);
  float v[8] = {};
  if (col_ok) {
    const float* vs = qkv + row * conv_dim + 2 * key_dim + static_cast<int64_t>(h) * dv + c;
    const float4 v0 = *reinterpret_cast<const float4*>(vs), v1 = *reinterpret_cast<const float4*>(vs + 4);
    v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
  }
  if (wa && lane == 0) {
    ab_all[warp][0] = pa;
    ab_all[warp][1] = pb;
  }
  __syncthreads();  // also for qk_n
  float decay, bt;
  step_gating(ab_all, wa != nullptr, a, b, A_log, dt_bias, row, Hv, h, decay, bt);

  // kv = (e^g S)^T k over this thread's rows, then the warp's 8 row groups (lanes 4 apart).
  float kv[8] = {};
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const float ki = qk_n[1][rg + m * kStepGroups];
    float f[8];
    unpack_bf16x8(st[m], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float sd = f[j] * decay;
      kv[j] += sd * ki;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) kv[j] += __shfl_xor_sync(0xffffffffu, kv[j], o);
  float delta[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) delta[j] = (v[j] - kv[j]) * bt;

  // S = e^g S + k delta^T, stored rounded; o = S^T q (from the f32 values).
  float o[8] = {};
#pragma unroll
  for (int m = 0; m < kStepRows; ++m) {
    const int i = rg + m * kStepGroups;
    const float ki = qk_n[1][i], qi = qk_n[0][i];
    // The packed words again, opaque to the compiler: otherwise it keeps the 128 products e^g S of
    // the first pass alive across the shuffles (168 registers) instead of recomputing them.
    uint4 u = st[m];
    asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
    float f[8];
    unpack_bf16x8(u, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float sd = f[j] * decay;
      f[j] = sd + ki * delta[j];
      o[j] += f[j] * qi;
    }
    if (col_ok && i < dk) {
      const uint2 lo = bf16x4_bits(make_float4(f[0], f[1], f[2], f[3]));
      const uint2 hi = bf16x4_bits(make_float4(f[4], f[5], f[6], f[7]));
      __stcs(reinterpret_cast<uint4*>(S + static_cast<int64_t>(i) * dv + c), make_uint4(lo.x, lo.y, hi.x, hi.y));
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int k = 4; k < 32; k <<= 1) o[j] += __shfl_xor_sync(0xffffffffu, o[j], k);

  // Gated RMSNorm over the head's dv outputs (sum of squares in double, as norm.cu).
  double sq = 0.0;
  if (col_ok)
#pragma unroll
    for (int j = 0; j < 8; ++j) sq += static_cast<double>(o[j]) * o[j];
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  sq += __shfl_xor_sync(0xffffffffu, sq, 2);
  if (lane == 0) ssq_all[warp] = sq;
  __syncthreads();
  if (rg == 0 && col_ok) {
    double tot = 0.0;
#pragma unroll
    for (int k = 0; k < kStepB16Warps; ++k) tot += ssq_all[k];
    const float rs = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(dv) + eps));
    const float4 z0 = *reinterpret_cast<const float4*>(z + oi), z1 = *reinterpret_cast<const float4*>(z + oi + 4);
    const float zv[8] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
    float y[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = o[j] * rs * norm_w[c + j] * silu_f(zv[j]);
    *reinterpret_cast<float4*>(out + oi) = make_float4(y[0], y[1], y[2], y[3]);
    *reinterpret_cast<float4*>(out + oi + 4) = make_float4(y[4], y[5], y[6], y[7]);
  }
}

}  // namespace

namespace {

void check_state_dtype(const Tensor& state_pool) {
  CHECK_MSG(state_pool.dtype == DType::kF32 || state_pool.dtype == DType::kBF16,
            "a GDN recurrent state pool is f32 or bf16");
}

bool plain_weight(const Linear& w) {
  return (w.format == WeightFormat::kBf16 || w.format == WeightFormat::kF32) && w.activation == ActivationQuant::kNone;
}

// gdn_verify_step (the conv and the delta rule read the pools only; g, beta: the gates out): the conv
// rows kernel, then the verify step kernel. False (nothing run) for a geometry outside its limits.
bool run_verify_step(CudaBackend& be, const Tensor& out, const Tensor& g, const Tensor& beta, const Tensor& h,
              const Tensor& mixed, const Tensor& z, const Linear& in_proj_a, const Linear& in_proj_b,
              const Tensor& conv_w, const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
              const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, C = d.conv_dim(), K = d.conv_kernel;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dv > kTileMaxDv || dv < 16 || dv % 8 != 0 || dk > kTileMaxDk || K < 1 || K > kMaxConvKernel || dk % 4 != 0 ||
      !aligned16(out.data) || !aligned16(z.data) || !aligned16(state_pool.data))
    return false;
  const int64_t T = batch.total_rows, H = h.numel() / std::max<int64_t>(T, 1);
  CHECK(h.numel() == T * H && mixed.numel() == T * C && z.numel() == T * Hv * dv && out.numel() == z.numel());
  CHECK(in_proj_a.out_features == Hv && in_proj_b.out_features == Hv && in_proj_a.in_features == H &&
        in_proj_b.in_features == H && A_log.numel() == Hv && dt_bias.numel() == Hv);
  CHECK(norm_w.numel() == dv && conv_w.dim(0) == C && conv_w.dim(1) == K);
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK(state_pool.dim(1) == Hv && state_pool.dim(2) == dk && state_pool.dim(3) == dv && Hv % d.num_k_heads == 0);
  CHECK(g.numel() == T * Hv && beta.numel() == T * Hv);
  check_state_dtype(state_pool);
  for (const SeqSpan& s : batch.seqs) {
    CHECK(s.gdn_slot >= 0 && s.gdn_slot < state_pool.dim(0) && s.gdn_slot < conv_state_pool.dim(0));
  }
  if (batch.seqs.empty() || T == 0) return true;
  // a and b inside the kernel when both weights are plain f32/bf16 of one kind; else as linear ops.
  const bool fuse_ab = plain_weight(in_proj_a) && plain_weight(in_proj_b) && in_proj_a.format == in_proj_b.format;
  std::optional<CudaBackend::Scratch> ab;
  const float* ab_dev = nullptr;  // b rows then a rows
  if (!fuse_ab) {
    ab.emplace(&be, static_cast<size_t>(2 * T * Hv) * sizeof(float));
    const Tensor b_t(ab->as<float>(), DType::kF32, {T, Hv}, Device::kCuda);
    const Tensor a_t(ab->as<float>() + T * Hv, DType::kF32, {T, Hv}, Device::kCuda);
    be.linear(b_t, h, in_proj_b);
    be.linear(a_t, h, in_proj_a);
    ab_dev = ab->as<const float>();
  }
  DeviceLayout L = be.device_layout(batch);
  // The conv output stays in stream-ordered scratch between the two kernels.
  CudaBackend::Scratch qkv(&be, static_cast<size_t>(T * C) * sizeof(float));
  // Every span row from the state's window and the rows before it (reads the state only).
  launch_conv_rows(be.stream(), qkv.as<float>(), mixed.ptr<const float>(), conv_w.ptr<const float>(),
                   conv_state_pool.ptr<const float>(), nullptr, L, batch, C, K);
  // A cluster of nc blocks per (span, value head): 4 at dv = 128, 256 blocks at batch 1 on the H200.
  const int nc = static_cast<int>((dv + kTileCols - 1) / kTileCols);
  // The verify step kernel may start while the conv kernel runs (it waits for qkv at
  // griddepcontrol.wait): its state loads and a/b products overlap the conv.
  const PdlLaunch launch(dim3(static_cast<unsigned>(batch.seqs.size() * Hv * nc)), dim3(kTileThreads), 0, be.stream(),
                         static_cast<unsigned>(nc));
  const float* a_dev = fuse_ab ? nullptr : ab_dev + T * Hv;
  const float* b_dev = ab_dev;
  const void* wa_dev = fuse_ab ? in_proj_a.weight.data : nullptr;
  const void* wb_dev = fuse_ab ? in_proj_b.weight.data : nullptr;
  const bool w_bf16 = in_proj_a.format == WeightFormat::kBf16;
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  auto launch_for = [&](auto* pool) {
    using St = std::remove_const_t<std::remove_pointer_t<decltype(pool)>>;
    CUDA_CHECK(cudaLaunchKernelEx(&launch.cfg, gdn_verify_step_kernel<St>, out.ptr<float>(), qkv.as<const float>(),
                                  z.ptr<const float>(), a_dev, b_dev, h.ptr<const float>(), wa_dev, wb_dev, w_bf16, H,
                                  A_log.ptr<const float>(), dt_bias.ptr<const float>(), norm_w.ptr<const float>(), eps,
                                  pool, g.ptr<float>(), beta.ptr<float>(), L, static_cast<int>(Hv),
                                  static_cast<int>(d.num_k_heads), static_cast<int>(dk), static_cast<int>(dv), C,
                                  scale));
  };
  if (state_pool.dtype == DType::kBF16) launch_for(state_pool.ptr<const uint16_t>());
  else launch_for(state_pool.ptr<const float>());
  CUDA_CHECK_LAUNCH();
  return true;
}

// The delta rule of gdn_recurrent (write: the state advances) and gdn_verify (the state is only read).
void run_delta(CudaBackend& be, bool write, const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
               const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  CHECK(qkv.dim(1) == d.conv_dim() && state_pool.dim(1) == Hv && state_pool.dim(2) == dk &&
        state_pool.dim(3) == dv && Hv % d.num_k_heads == 0);
  CHECK(out.numel() == batch.total_rows * Hv * dv && g.numel() == batch.total_rows * Hv && beta.numel() == g.numel());
  CHECK_MSG(dk <= 2 * kTileMaxDk && dk % 4 == 0 && dv % 4 == 0,
            "CUDA Gated DeltaNet supports k_head_dim <= 256 and head sizes that are multiples of 4");
  CHECK(aligned16(state_pool.data) && aligned16(qkv.data) && aligned16(out.data));
  check_state_dtype(state_pool);
  for (const SeqSpan& s : batch.seqs) CHECK(gdn_rows_ok(s, state_pool.dim(0)));
  if (batch.seqs.empty()) return;
  DeviceLayout L = be.device_layout(batch);
  const unsigned blocks = static_cast<unsigned>(batch.seqs.size() * Hv * ((dv + kTileCols - 1) / kTileCols));
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  auto launch = [&](auto* pool) {
    using St = std::remove_pointer_t<decltype(pool)>;
    auto kernel = dk <= kTileMaxDk
                      ? (write ? gdn_delta_kernel<kTileRows, true, St> : gdn_delta_kernel<kTileRows, false, St>)
                      : (write ? gdn_delta_kernel<2 * kTileRows, true, St> : gdn_delta_kernel<2 * kTileRows, false, St>);
    kernel<<<blocks, kTileThreads, 0, be.stream()>>>(out.ptr<float>(), qkv.ptr<const float>(), g.ptr<const float>(),
                                                     beta.ptr<const float>(), pool, L, static_cast<int>(Hv),
                                                     static_cast<int>(d.num_k_heads), static_cast<int>(dk),
                                                     static_cast<int>(dv), d.conv_dim(), scale);
  };
  if (state_pool.dtype == DType::kBF16) launch(state_pool.ptr<uint16_t>());
  else launch(state_pool.ptr<float>());
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::gdn_decode_step(const Tensor& out, const Tensor& h, const Tensor& mixed, const Tensor& z,
                                  const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                                  const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                                  const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                                  const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, C = d.conv_dim(), K = d.conv_kernel;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dv > kStepMaxDv || dv < 16 || dv % 8 != 0 || dk > kStepMaxDk || K < 1 || K > kMaxConvKernel || dk % 4 != 0 ||
      !aligned16(out.data) || !aligned16(z.data) || !aligned16(state_pool.data)) {
    // Geometry outside the fused kernel's limits: the op chain.
    Backend::gdn_decode_step(out, h, mixed, z, in_proj_a, in_proj_b, conv_w, A_log, dt_bias, norm_w, eps,
                             conv_state_pool, state_pool, batch, d);
    return;
  }
  const int64_t T = batch.total_rows, H = h.numel() / std::max<int64_t>(T, 1);
  CHECK(h.numel() == T * H && mixed.numel() == T * C && z.numel() == T * Hv * dv && out.numel() == z.numel());
  CHECK(in_proj_a.out_features == Hv && in_proj_b.out_features == Hv && in_proj_a.in_features == H &&
        in_proj_b.in_features == H && A_log.numel() == Hv && dt_bias.numel() == Hv);
  CHECK(norm_w.numel() == dv && conv_w.dim(0) == C && conv_w.dim(1) == K);
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK(state_pool.dim(1) == Hv && state_pool.dim(2) == dk && state_pool.dim(3) == dv && Hv % d.num_k_heads == 0);
  check_state_dtype(state_pool);
  for (const SeqSpan& s : batch.seqs) {
    CHECK_MSG(s.num_tokens == 1 && s.num_saves == 0, "gdn_decode_step takes single-token spans without saves");
    CHECK(s.gdn_slot >= 0 && s.gdn_slot < state_pool.dim(0) && s.gdn_slot < conv_state_pool.dim(0));
  }
  if (batch.seqs.empty()) return;
  // a and b inside the kernel when both weights are plain f32/bf16 of one kind; else as linear ops.
  const bool fuse_ab = plain_weight(in_proj_a) && plain_weight(in_proj_b) && in_proj_a.format == in_proj_b.format;
  std::optional<Scratch> ab;
  const float* ab_dev = nullptr;  // b rows then a rows
  if (!fuse_ab) {
    ab.emplace(this, static_cast<size_t>(2 * T * Hv) * sizeof(float));
    const Tensor b_t(ab->as<float>(), DType::kF32, {T, Hv}, Device::kCuda);
    const Tensor a_t(ab->as<float>() + T * Hv, DType::kF32, {T, Hv}, Device::kCuda);
    linear(b_t, h, in_proj_b);
    linear(a_t, h, in_proj_a);
    ab_dev = ab->as<const float>();
  }
  DeviceLayout L = device_layout(batch);
  // The conv output stays in stream-ordered scratch between the two kernels.
  Scratch qkv(this, static_cast<size_t>(T * C) * sizeof(float));
  const int64_t n = static_cast<int64_t>(batch.seqs.size()) * C;
  gdn_conv_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
      qkv.as<float>(), mixed.ptr<const float>(), conv_w.ptr<const float>(), conv_state_pool.ptr<float>(), L, C,
      static_cast<int>(K));
  CUDA_CHECK_LAUNCH();
  // One block per (span, value head). The step kernel may start while the conv kernel runs (it
  // waits for qkv at griddepcontrol.wait): its state loads and a/b products overlap the conv.
  const bool bf16 = state_pool.dtype == DType::kBF16;
  const PdlLaunch launch(dim3(static_cast<unsigned>(batch.seqs.size() * Hv)), dim3(bf16 ? kStepB16Threads : kStepThreads),
                         0, stream_);
  const float* a_dev = fuse_ab ? nullptr : ab_dev + T * Hv;
  const float* b_dev = ab_dev;
  const void* wa_dev = fuse_ab ? in_proj_a.weight.data : nullptr;
  const void* wb_dev = fuse_ab ? in_proj_b.weight.data : nullptr;
  const bool w_bf16 = in_proj_a.format == WeightFormat::kBf16;
  // 16-byte loads of h and 4 weights at a time: rows start aligned when H % 4 == 0.
  const bool ab_vec = fuse_ab && H % 4 == 0 && aligned16(h.data) && aligned16(wa_dev) && aligned16(wb_dev);
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  auto launch_for = [&](auto kernel, auto* pool) {
    CUDA_CHECK(cudaLaunchKernelEx(&launch.cfg, kernel, out.ptr<float>(), qkv.as<const float>(), z.ptr<const float>(),
                                  a_dev, b_dev, h.ptr<const float>(), wa_dev, wb_dev, w_bf16, ab_vec, H,
                                  A_log.ptr<const float>(), dt_bias.ptr<const float>(), norm_w.ptr<const float>(), eps,
                                  pool, L, static_cast<int>(Hv), static_cast<int>(d.num_k_heads),
                                  static_cast<int>(dk), static_cast<int>(dv), C, scale));
  };
  if (bf16) launch_for(gdn_step_bf16_kernel, state_pool.ptr<uint16_t>());
  else launch_for(gdn_step_kernel<float>, state_pool.ptr<float>());
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_verify_step(const Tensor& out, const Tensor& g, const Tensor& beta, const Tensor& h,
                                  const Tensor& mixed, const Tensor& z, const Linear& in_proj_a,
                                  const Linear& in_proj_b, const Tensor& conv_w, const Tensor& A_log,
                                  const Tensor& dt_bias, const Tensor& norm_w, float eps,
                                  const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                                  const GdnDims& d) {
  // The fused kernel walks a span's tokens one after another, two cluster barriers each, and past one
  // wave of resident blocks that latency repeats per wave; the op chain (a/b projections as GEMMs, the
  // barrier-free register delta kernel) is then faster. H200, 122B, k = 2: batch 1 8.04 ms per verify
  // step fused against 8.63 ms chained; batch 64 86.0 against 73.9 ms.
  auto resident_blocks = [&](const void* kernel) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTileThreads, 0));
    return static_cast<int64_t>(std::max(1, per_sm)) * sm_count_;
  };
  static const int64_t resident_f32 = resident_blocks(reinterpret_cast<const void*>(gdn_verify_step_kernel<float>));
  static const int64_t resident_bf16 = resident_blocks(reinterpret_cast<const void*>(gdn_verify_step_kernel<uint16_t>));
  const int64_t resident = state_pool.dtype == DType::kBF16 ? resident_bf16 : resident_f32;
  const int64_t blocks = static_cast<int64_t>(batch.seqs.size()) * d.num_v_heads * ((d.v_head_dim + kTileCols - 1) / kTileCols);
  if (blocks > resident ||
      !run_verify_step(*this, out, g, beta, h, mixed, z, in_proj_a, in_proj_b, conv_w, A_log, dt_bias, norm_w, eps,
                       conv_state_pool, state_pool, batch, d))  // or a geometry outside the fused kernel: the op chain
    Backend::gdn_verify_step(out, g, beta, h, mixed, z, in_proj_a, in_proj_b, conv_w, A_log, dt_bias, norm_w, eps,
                             conv_state_pool, state_pool, batch, d);
}

void CudaBackend::gdn_conv(const Tensor& out, const Tensor& mixed, const Tensor& weight,
                           const Tensor& conv_state_pool, const BatchLayout& batch) {
  const int64_t C = weight.dim(0), K = weight.dim(1);
  CHECK(mixed.numel() == batch.total_rows * C && out.numel() == mixed.numel());
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK_MSG(K >= 1 && K <= kMaxConvKernel, "CUDA gdn_conv supports kernel sizes 1..5");
  for (const SeqSpan& s : batch.seqs) CHECK(gdn_rows_ok(s, conv_state_pool.dim(0)));
  const int64_t n = static_cast<int64_t>(batch.seqs.size()) * C, rows = batch.total_rows * C;
  if (n == 0 || rows == 0) return;
  DeviceLayout L = device_layout(batch);
  launch_conv_rows(stream_, out.ptr<float>(), mixed.ptr<const float>(), weight.ptr<const float>(),
                   conv_state_pool.ptr<const float>(), conv_state_pool.ptr<float>(), L, batch, C, K);
}

void CudaBackend::gdn_gating(const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                             const Tensor& A_log, const Tensor& dt_bias) {
  const int64_t Hv = A_log.numel(), T = a.numel() / Hv;
  CHECK(b.numel() == a.numel() && g.numel() == a.numel() && beta.numel() == a.numel());
  if (T * Hv == 0) return;
  gdn_gating_kernel<<<blocks_for(T * Hv, kThreads), kThreads, 0, stream_>>>(
      g.ptr<float>(), beta.ptr<float>(), a.ptr<const float>(), b.ptr<const float>(), A_log.ptr<const float>(),
      dt_bias.ptr<const float>(), T, Hv);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                                const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  run_delta(*this, true, out, qkv, g, beta, state_pool, batch, d);
}

void CudaBackend::gdn_verify(const Tensor& out, const Tensor& qkv, const Tensor& mixed, const Tensor& conv_w,
                             const Tensor& g, const Tensor& beta, const Tensor& conv_state_pool,
                             const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t C = d.conv_dim(), K = conv_w.dim(1), T = batch.total_rows;
  CHECK(mixed.numel() == T * C && qkv.numel() == mixed.numel() && conv_w.dim(0) == C);
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK_MSG(K >= 1 && K <= kMaxConvKernel, "CUDA gdn_verify supports conv kernel sizes 1..5");
  for (const SeqSpan& s : batch.seqs)
    CHECK(s.gdn_slot >= 0 && s.gdn_slot < conv_state_pool.dim(0) && s.num_saves == 0);
  if (batch.seqs.empty() || T == 0) return;
  DeviceLayout L = device_layout(batch);
  // The conv of every span row from the state's window and the rows before it (reads the state only).
  launch_conv_rows(stream_, qkv.ptr<float>(), mixed.ptr<const float>(), conv_w.ptr<const float>(),
                   conv_state_pool.ptr<const float>(), nullptr, L, batch, C, K);
  run_delta(*this, false, out, qkv, g, beta, state_pool, batch, d);
}

}  // namespace sparkserve
