// Backend::draw: the sampler's random draw (core/truncated_draw.h) where the logits are, so a sampled
// row comes back as one id instead of 248,320 floats.
//
// The kept set of a real row is small: top_k keeps k tokens, top_p and min_p the ones near the
// maximum, where nearly all the mass is. So each row is spread over many blocks of kCols columns
// (coalesced loads) that find what the pick needs, and one block per row picks from a short list:
//   1. scan: first NaN / +Inf, max s (s = logit / temperature), how many tokens are possible, and a
//      histogram of s in 1/4 nat bins; the row's last block chooses the lowest bin such that the
//      tokens at or above it (the candidates) fit in kCap, and whether they hold the whole kept set
//      (top_k <= their count, or every token below them fails min_p).
//   2. weigh: the candidates, written in id order within each block's run, and where the kept set
//      may reach below them (no top_k), each block's sum of kept weights exp(s - max).
//   3. pick, one block per row: the candidates in id order in shared memory; top_k and top_p are
//      MSB-first radix selects over an order-preserving key of s, as the general path does (top_p
//      keeps the fewest tokens of the crossing s, lowest ids first: the host's (w desc, id asc)
//      prefix); then the inverse-CDF walk over the kept candidates, or, when the whole row is kept
//      (no top_k / top_p, min_p too low to decide), over the block sums and then one block's run.
// A row the list cannot decide (top_k above kCap candidates, top_p mass reaching below them) is
// drawn by draw_row.cu over the whole row. Weights and all sums are doubles, as on the host; only
// summation order and exp's last bit differ.
#include <cfloat>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/draw_common.cuh"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;  // scan / weigh blocks
constexpr int kPer = 16;       // columns per thread, all loads in flight at once
constexpr int64_t kCols = kThreads * kPer;
constexpr int kBins = 2048;  // s histogram: s in [-256, 256) in 1/4 nat steps, the ends clamped
constexpr int kCap = 4096;   // candidates per row
constexpr int kMaxChunks = 1024;
constexpr int kPickThreads = 1024;
constexpr int kPickRun = kCap / kPickThreads;  // candidates per pick thread, a contiguous run

enum Mode : int32_t {
  kListHoldsKept = 0,  // the candidates hold every kept token
  kNeedSums = 1,       // the kept set may reach below the candidates: the blocks' weight sums
  kGeneral = 2,        // top_k above the candidates: draw_row.cu
};

struct RowState {  // zeroed before every call
  uint32_t bad_inv;  // 0xffffffff - the first NaN / +Inf column; 0: none
  uint32_t max_key;  // order_key of the max s over the possible tokens; 0: none
  uint32_t possible;
  uint32_t blocks_done;
  int32_t thresh_bin;  // candidates: the possible tokens with s_bin(s) >= thresh_bin
  int32_t mode;
  uint32_t cand_n;
  uint32_t pad;
  uint32_t hist[kBins];
};

struct Chunk {            // one scan block's run of columns
  double sum;             // kept weights exp(s - scale) (rows whose kept set may reach below the list)
  uint32_t scale_key;     // order_key of `scale`: the block's max s (scan) or the row's (weigh)
  int32_t last;           // last kept column, -1: none
  uint32_t base, count;   // its candidates: cand[base, base + count), in id order
};

struct Cand {
  float s;
  int32_t id;
};

__device__ __forceinline__ int s_bin(float s) {
  return static_cast<int>(floorf(fminf(fmaxf(s * 4.0f, -1024.0f), 1023.0f))) + 1024;
}

__device__ __forceinline__ double min_p_cut(float min_p) {
  return min_p > 0.0f ? log(static_cast<double>(min_p)) - 1e-6 : 0.0;
}

// The weight exp(s - max) of a possible token, false when min_p drops it (far below the cut
// without the exp, as the host).
__device__ __forceinline__ bool kept_weight(float s, double mx, float min_p, double cut, double& w) {
  const double d = static_cast<double>(s) - mx;
  if (min_p > 0.0f && (d < cut || exp(d) < static_cast<double>(min_p))) return false;
  w = exp(d);
  return true;
}

// Rows without min_p and top_k keep every possible token before top_p: the scan sums their weights
// against its block's max (the row's is not known yet) while the columns are in registers; the pick
// rescales each sum by exp(block max - row max). Other rows that need sums get them from weigh.
__device__ __forceinline__ bool sums_in_scan(const RowDraw& p, int64_t vocab) {
  return p.min_p == 0.0f && (p.top_k <= 0 || p.top_k >= vocab);
}

__device__ __forceinline__ bool is_excluded(const int32_t* ex, int n, int64_t i) {
  bool e = false;
  for (int j = 0; j < n; ++j) e = e || ex[j] == static_cast<int32_t>(i);
  return e;
}

// The row's last scan block: the candidate bin and the mode. kThreads threads.
__device__ void choose_candidates(RowState& S, const RowDraw& p) {
  const uint32_t possible = __ldcg(&S.possible);
  if (__ldcg(&S.bad_inv) != 0 || possible == 0) return;
  constexpr int kBinsPer = kBins / kThreads;
  __shared__ uint32_t tmp[kThreads / 32];
  __shared__ int thresh;
  __shared__ uint32_t ncand;
  uint32_t c[kBinsPer], mine = 0;
  for (int j = 0; j < kBinsPer; ++j) mine += c[j] = __ldcg(&S.hist[kBins - 1 - (kBinsPer * threadIdx.x + j)]);
  uint32_t above = block_exclusive_scan<kThreads>(mine, tmp);
  if (threadIdx.x == 0) thresh = 0, ncand = possible;
  __syncthreads();
  for (int j = 0; j < kBinsPer; ++j) {  // one thread holds the bin where the count passes kCap
    if (above <= kCap && above + c[j] > kCap) {
      thresh = kBins - kBinsPer * static_cast<int>(threadIdx.x) - j;
      ncand = above;
    }
    above += c[j];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const double mx = key_value(__ldcg(&S.max_key));
  int mode = kNeedSums;
  if (p.top_k > 0 && static_cast<uint32_t>(p.top_k) < possible)
    mode = static_cast<uint32_t>(p.top_k) <= ncand ? kListHoldsKept : kGeneral;
  else if (thresh == 0)
    mode = kListHoldsKept;
  else if (thresh < kBins && p.min_p > 0.0f && (thresh - 1024) * 0.25 - mx <= min_p_cut(p.min_p))
    mode = kListHoldsKept;  // every token below the candidates has s < (thresh - 1024) / 4: min_p drops it
  S.thresh_bin = thresh;
  S.mode = mode;
}

// grid (column blocks, rows).
__global__ void __launch_bounds__(kThreads) draw_scan_kernel(RowState* state, Chunk* chunks, const float* logits,
                                                              int64_t V, int64_t vocab, const int32_t* excluded,
                                                              int num_excluded, const RowDraw* rows) {
  const RowDraw p = rows[blockIdx.y];
  if (!(p.temperature > 0.0f)) return;
  RowState& S = state[blockIdx.y];
  const float* row = logits + blockIdx.y * V;
  __shared__ int32_t ex[kArgmaxMaxExcluded];
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t tmp[kThreads / 32];
  __shared__ double dtmp[kThreads / 32];
  __shared__ int32_t itmp[kThreads / 32];
  __shared__ bool last;
  for (int j = threadIdx.x; j < num_excluded; j += kThreads) ex[j] = excluded[j];
  for (int b = threadIdx.x; b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  const int64_t lo = blockIdx.x * kCols;
  float v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = lo + u * kThreads + threadIdx.x;
    v[u] = i < vocab ? row[i] : -INFINITY;
  }
  uint32_t bad = UINT_MAX, mk = 0, count = 0;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = lo + u * kThreads + threadIdx.x;
    if (isnan(v[u]) || v[u] == INFINITY) {
      bad = min(bad, static_cast<uint32_t>(i));
      v[u] = -INFINITY;
    } else if (v[u] > -INFINITY && !is_excluded(ex, num_excluded, i)) {
      v[u] /= p.temperature;  // s from here on
      mk = max(mk, order_key(v[u]));
      ++count;
      atomicAdd(&hist[s_bin(v[u])], 1u);
    } else {
      v[u] = -INFINITY;
    }
  }
  bad = block_reduce<kThreads>(bad, tmp, [](uint32_t a, uint32_t b) { return min(a, b); });
  mk = block_reduce<kThreads>(mk, tmp, [](uint32_t a, uint32_t b) { return max(a, b); });
  count = block_reduce<kThreads>(count, tmp, [](uint32_t a, uint32_t b) { return a + b; });
  if (sums_in_scan(p, vocab) && bad == UINT_MAX) {
    const double scale = key_value(mk);
    double sum = 0.0;
    int32_t at = -1;
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      if (v[u] > -INFINITY) sum += exp(static_cast<double>(v[u]) - scale), at = static_cast<int32_t>(lo + u * kThreads + threadIdx.x);
    sum = block_reduce<kThreads>(sum, dtmp, [](double a, double b) { return a + b; });
    at = block_reduce<kThreads>(at, itmp, [](int32_t a, int32_t b) { return max(a, b); });
    if (threadIdx.x == 0) {
      Chunk& c = chunks[blockIdx.y * gridDim.x + blockIdx.x];
      c.sum = count != 0 ? sum : 0.0;
      c.scale_key = mk;
      c.last = at;
    }
  }
  if (threadIdx.x == 0) {
    if (bad != UINT_MAX) atomicMax(&S.bad_inv, 0xffffffffu - bad);
    if (mk != 0) atomicMax(&S.max_key, mk);
    if (count != 0) atomicAdd(&S.possible, count);
  }
  for (int b = threadIdx.x; b < kBins; b += kThreads)
    if (hist[b] != 0) atomicAdd(&S.hist[b], hist[b]);
  // The last block of the row to finish sees every block's atomics.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&S.blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  choose_candidates(S, p);
}

// grid (column blocks, rows).
__global__ void __launch_bounds__(kThreads) draw_weigh_kernel(RowState* state, Chunk* chunks, Cand* cand,
                                                               const float* logits, int64_t V, int64_t vocab,
                                                               const int32_t* excluded, int num_excluded,
                                                               const RowDraw* rows) {
  // Rows and blocks in the scan's reverse order: the columns it read last are still in L2.
  const int64_t r = gridDim.y - 1 - blockIdx.y, chunk = gridDim.x - 1 - blockIdx.x;
  const RowDraw p = rows[r];
  if (!(p.temperature > 0.0f)) return;
  RowState& S = state[r];
  if (S.bad_inv != 0 || S.possible == 0 || S.mode == kGeneral) return;
  const bool sums = S.mode == kNeedSums && !sums_in_scan(p, vocab), list = S.mode == kListHoldsKept || p.top_p < 1.0f;
  if (!sums && !list) return;
  const int thresh = S.thresh_bin;
  const double mx = key_value(S.max_key), cut = min_p_cut(p.min_p);
  const float* row = logits + r * V;
  __shared__ int32_t ex[kArgmaxMaxExcluded];
  __shared__ uint32_t offset[kPer][kThreads / 32];  // candidates before each (column group, warp)
  __shared__ double dtmp[kThreads / 32];
  __shared__ int32_t itmp[kThreads / 32];
  __shared__ uint32_t base, block_n;
  for (int j = threadIdx.x; j < num_excluded; j += kThreads) ex[j] = excluded[j];
  __syncthreads();
  const int64_t lo = chunk * kCols;
  float s[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = lo + u * kThreads + threadIdx.x;
    s[u] = i < vocab ? row[i] : -INFINITY;
  }
  uint32_t is_cand = 0;
  double sum = 0.0;
  int32_t last = -1;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = lo + u * kThreads + threadIdx.x;
    if (!(s[u] > -INFINITY) || is_excluded(ex, num_excluded, i)) continue;
    s[u] /= p.temperature;
    if (list && s_bin(s[u]) >= thresh) is_cand |= 1u << u;
    double w;
    if (sums && kept_weight(s[u], mx, p.min_p, cut, w)) sum += w, last = static_cast<int32_t>(i);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (list) {  // id order: column group u, then warp, then lane
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const uint32_t b = __ballot_sync(0xffffffffu, (is_cand >> u) & 1u);
      if (lane == 0) offset[u][warp] = __popc(b);
    }
    __syncthreads();
    if (warp == 0) {
      constexpr int kEach = kPer * (kThreads / 32) / 32;
      uint32_t* flat = &offset[0][0];
      uint32_t c[kEach], mine = 0;
      for (int j = 0; j < kEach; ++j) mine += c[j] = flat[kEach * lane + j];
      uint32_t inc = mine;
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
      }
      uint32_t run = inc - mine;
      for (int j = 0; j < kEach; ++j) flat[kEach * lane + j] = run, run += c[j];
      if (lane == 31) block_n = inc, base = atomicAdd(&S.cand_n, inc);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const uint32_t b = __ballot_sync(0xffffffffu, (is_cand >> u) & 1u);
      if ((is_cand >> u) & 1u) {
        const uint32_t at = base + offset[u][warp] + __popc(b & ((1u << lane) - 1u));
        if (at < kCap) cand[r * kCap + at] = Cand{s[u], static_cast<int32_t>(lo + u * kThreads + threadIdx.x)};
      }
    }
  }
  if (sums) {
    sum = block_reduce<kThreads>(sum, dtmp, [](double a, double b) { return a + b; });
    last = block_reduce<kThreads>(last, itmp, [](int32_t a, int32_t b) { return max(a, b); });
  }
  if (threadIdx.x == 0) {
    Chunk& c = chunks[r * gridDim.x + chunk];
    if (sums) c.sum = sum, c.scale_key = S.max_key, c.last = last;
    if (list) c.base = base, c.count = block_n;
  }
}

// Block t's kept weights exp(s - mx) summed (0 past the last block): its sum against its scale, rescaled.
__device__ __forceinline__ double chunk_sum(const Chunk* chunks, int nchunk, int t, double mx) {
  if (t >= nchunk || !(chunks[t].sum > 0.0)) return 0.0;
  return chunks[t].sum * exp(static_cast<double>(key_value(chunks[t].scale_key)) - mx);
}

// The pick block's shared memory: the candidates in id order (id, weight: -1 when not kept) and,
// for top_k / top_p, sorted by (s desc, id asc): (order_key(s) << 32) | (0xffffffff - position).
struct PickShared {
  double w[kCap];
  uint64_t ord[kCap];
  int32_t id[kCap];
  uint32_t dst[kMaxChunks];  // where each chunk's candidates go in id order
  uint32_t base[kMaxChunks];
};

__device__ __forceinline__ uint32_t ord_key(uint64_t o) { return static_cast<uint32_t>(o >> 32); }
__device__ __forceinline__ int ord_pos(uint64_t o) { return static_cast<int>(0xffffffffu - static_cast<uint32_t>(o)); }

// Bitonic sort of ord[0, n) in descending order (ord[n, next power of 2) padded with 0, below every
// candidate). A few thousand candidates: 78 barriers at most.
__device__ void sort_desc(uint64_t* ord, int n) {
  int P = 1;
  while (P < n) P <<= 1;
  for (int e = n + threadIdx.x; e < P; e += kPickThreads) ord[e] = 0;
  __syncthreads();
  for (int k = 2; k <= P; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < P / 2; i += kPickThreads) {
        const int lo = 2 * i - (i & (j - 1)), hi = lo + j;
        const uint64_t a = ord[lo], b = ord[hi];
        if ((a < b) == ((lo & k) == 0)) ord[lo] = b, ord[hi] = a;
      }
      __syncthreads();
    }
}

// One block per row.
__global__ void __launch_bounds__(kPickThreads) draw_pick_kernel(RowArgmax* out, const RowState* state,
                                                                  const Chunk* chunks, const Cand* cand,
                                                                  const float* logits, int64_t V, int64_t vocab,
                                                                  int nchunk, const int32_t* excluded,
                                                                  int num_excluded, const RowDraw* rows) {
  const int r = blockIdx.x;
  const RowDraw p = rows[r];
  if (!(p.temperature > 0.0f)) return;
  const RowState& S = state[r];
  extern __shared__ __align__(16) unsigned char smem[];
  PickShared& sh = *reinterpret_cast<PickShared*>(smem);
  __shared__ int32_t ex[kArgmaxMaxExcluded];
  __shared__ double dtmp[kPickThreads / 32];
  __shared__ int32_t itmp[kPickThreads / 32];
  __shared__ int32_t found, chosen;
  __shared__ double chosen_before;
  for (int j = threadIdx.x; j < num_excluded; j += kPickThreads) ex[j] = excluded[j];
  if (threadIdx.x == 0) found = INT_MAX, chosen = INT_MAX;
  __syncthreads();
  const auto finish = [&](int32_t id, int32_t nonfinite) {
    if (threadIdx.x != 0) return;
    if (id == -1) {  // no possible token: the lowest column not excluded
      id = 0;
      while (id + 1 < vocab && is_excluded(ex, num_excluded, id)) ++id;
    }
    out[r] = RowArgmax{id, nonfinite};
  };
  if (S.bad_inv != 0) return finish(0, static_cast<int32_t>(0xffffffffu - S.bad_inv));
  if (S.possible == 0) return finish(-1, -1);
  if (S.mode == kGeneral || S.cand_n > kCap) return finish(kDrawUndecided, -1);
  const double mx = key_value(S.max_key), cut = min_p_cut(p.min_p);
  const bool top_k = p.top_k > 0 && static_cast<uint32_t>(p.top_k) < S.possible;
  const auto sum = [&](double v) { return block_reduce<kPickThreads>(v, dtmp, [](double a, double b) { return a + b; }); };
  const int t = threadIdx.x;
  if (S.mode == kListHoldsKept || p.top_p < 1.0f) {
    // The candidates in id order: each chunk's run is in id order, the chunks in any.
    const int n = static_cast<int>(S.cand_n);
    const uint32_t count = t < nchunk ? chunks[r * nchunk + t].count : 0u;
    const uint32_t d = block_exclusive_scan<kPickThreads>(count, reinterpret_cast<uint32_t*>(itmp));
    if (t < nchunk) sh.dst[t] = d, sh.base[t] = chunks[r * nchunk + t].base;
    __syncthreads();
    for (int e = t; e < n; e += kPickThreads) {
      const Cand q = cand[r * kCap + e];
      const int ch = static_cast<int>(q.id / kCols);
      const uint32_t at = sh.dst[ch] + (e - sh.base[ch]);
      sh.id[at] = q.id;
      sh.ord[at] = (static_cast<uint64_t>(order_key(q.s)) << 32) | (0xffffffffu - at);
    }
    __syncthreads();
    const int lo = min(n, t * kPickRun), hi = min(n, lo + kPickRun);  // this thread's run, id order
    for (int e = lo; e < hi; ++e) {
      double w;
      sh.w[e] = kept_weight(key_value(ord_key(sh.ord[e])), mx, p.min_p, cut, w) ? w : -1.0;
    }
    if (top_k || p.top_p < 1.0f) sort_desc(sh.ord, n);  // from here on ord[j] is the j-th largest
    if (top_k) {  // every s >= the k-th largest over all possible tokens: all of them are candidates here
      const uint32_t floor_key = ord_key(sh.ord[p.top_k - 1]);
      for (int j = lo; j < hi; ++j)
        if (ord_key(sh.ord[j]) < floor_key) sh.w[ord_pos(sh.ord[j])] = -1.0;
      __syncthreads();
    }
    if (p.top_p < 1.0f) {
      // The fewest kept tokens in (s desc, id asc) order whose mass reaches top_p * total: a token is
      // kept while the mass before it is below the target (all of them when rounding keeps the target
      // out of reach, as the host).
      double mine = 0.0;
      for (int j = lo; j < hi; ++j) mine += max(sh.w[ord_pos(sh.ord[j])], 0.0);
      const double list_mass = sum(mine);
      const double total = S.mode == kNeedSums ? sum(chunk_sum(chunks + r * nchunk, nchunk, t, mx)) : list_mass;
      const double target = static_cast<double>(p.top_p) * total;
      if (list_mass < target && S.mode == kNeedSums) return finish(kDrawUndecided, -1);  // the cut lies below the list
      double before = block_exclusive_scan<kPickThreads>(mine, dtmp);
      for (int j = lo; j < hi; ++j) {
        double& w = sh.w[ord_pos(sh.ord[j])];
        if (w < 0.0) continue;
        if (before >= target) w = -1.0;
        else before += w;
      }
      __syncthreads();
    }
    double mine = 0.0;
    for (int e = lo; e < hi; ++e)
      if (sh.w[e] >= 0.0) mine += sh.w[e];
    {  // the inverse-CDF walk over the kept candidates in id order
      int32_t last = -1;
      for (int e = lo; e < hi; ++e)
        if (sh.w[e] >= 0.0) last = sh.id[e];
      const double kept = sum(mine);
      last = block_reduce<kPickThreads>(last, itmp, [](int32_t a, int32_t b) { return max(a, b); });
      const double before = block_exclusive_scan<kPickThreads>(mine, dtmp);
      const double target = p.u * kept;
      if (before <= target && target < before + mine) {
        double c = before;
        for (int e = lo; e < hi; ++e) {
          if (sh.w[e] < 0.0) continue;
          c += sh.w[e];
          if (target < c) {
            atomicMin(&found, sh.id[e]);
            break;
          }
        }
      }
      __syncthreads();
      return finish(found != INT_MAX ? found : last, -1);  // past the end by rounding: the last kept
    }
  }
  // The whole row is kept (min_p aside): the walk over the chunks' sums, then one chunk's columns.
  const double cs = chunk_sum(chunks + r * nchunk, nchunk, t, mx);
  const int32_t cl = t < nchunk ? chunks[r * nchunk + t].last : -1;
  const double total = sum(cs);
  const int32_t last = block_reduce<kPickThreads>(cl, itmp, [](int32_t a, int32_t b) { return max(a, b); });
  const double before = block_exclusive_scan<kPickThreads>(cs, dtmp);
  const double target = p.u * total;
  if (t < nchunk && cs > 0.0 && before <= target && target < before + cs) atomicMin(&chosen, t);
  __syncthreads();
  if (chosen == INT_MAX) return finish(last, -1);
  if (t == chosen) chosen_before = before;
  __syncthreads();
  const float* row = logits + r * V;
  constexpr int kEach = static_cast<int>(kCols / kPickThreads);
  const int64_t lo = chosen * kCols + kEach * t;
  double w[kEach], mine = 0.0;
  for (int j = 0; j < kEach; ++j) {
    const int64_t i = lo + j;
    const float v = i < vocab ? row[i] : -INFINITY;
    w[j] = -1.0;
    if (v > -INFINITY && !is_excluded(ex, num_excluded, i) && kept_weight(v / p.temperature, mx, p.min_p, cut, w[j]))
      mine += w[j];
  }
  const double at = chosen_before + block_exclusive_scan<kPickThreads>(mine, dtmp);
  if (at <= target && target < at + mine) {
    double c = at;
    for (int j = 0; j < kEach; ++j) {
      if (w[j] < 0.0) continue;
      c += w[j];
      if (target < c) {
        atomicMin(&found, static_cast<int32_t>(lo + j));
        break;
      }
    }
  }
  __syncthreads();
  // Rounding between the chunk's sum and this walk left the target at its end: its last kept column.
  finish(found != INT_MAX ? found : chunks[r * nchunk + chosen].last, -1);
}

}  // namespace

std::vector<RowArgmax> CudaBackend::draw(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded,
                                         const std::vector<RowDraw>& rows) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  CHECK(vocab >= 1 && vocab <= V && vocab < INT_MAX && excluded.size() <= kArgmaxMaxExcluded &&
        static_cast<int64_t>(rows.size()) == R && R <= 65535);
  std::vector<RowArgmax> out(static_cast<size_t>(R));
  if (R == 0) return out;
  const float* x = logits.ptr<const float>();
  const int nex = static_cast<int>(excluded.size());
  const int64_t nchunk = (vocab + kCols - 1) / kCols;
  Scratch res(this, out.size() * sizeof(RowArgmax));
  // No excluded ids (the common step): no upload, the kernels read none.
  Scratch ex = excluded.empty() ? Scratch() : upload_scratch(excluded.data(), excluded.size() * sizeof(int32_t));
  Scratch params = upload_scratch(rows.data(), rows.size() * sizeof(RowDraw));
  if (nchunk <= kMaxChunks) {
    static const bool smem_set = [] {
      CUDA_CHECK(cudaFuncSetAttribute(draw_pick_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(sizeof(PickShared))));
      return true;
    }();
    (void)smem_set;
    Scratch state(this, static_cast<size_t>(R) * sizeof(RowState));
    Scratch chunks(this, static_cast<size_t>(R * nchunk) * sizeof(Chunk));
    Scratch cand(this, static_cast<size_t>(R) * kCap * sizeof(Cand));
    CUDA_CHECK(cudaMemsetAsync(state.ptr, 0, static_cast<size_t>(R) * sizeof(RowState), stream_));
    const dim3 grid(static_cast<unsigned>(nchunk), static_cast<unsigned>(R));
    draw_scan_kernel<<<grid, kThreads, 0, stream_>>>(state.as<RowState>(), chunks.as<Chunk>(), x, V, vocab,
                                                      ex.as<const int32_t>(), nex, params.as<const RowDraw>());
    CUDA_CHECK_LAUNCH();
    draw_weigh_kernel<<<grid, kThreads, 0, stream_>>>(state.as<RowState>(), chunks.as<Chunk>(), cand.as<Cand>(), x, V,
                                                       vocab, ex.as<const int32_t>(), nex, params.as<const RowDraw>());
    CUDA_CHECK_LAUNCH();
    draw_pick_kernel<<<static_cast<unsigned>(R), kPickThreads, sizeof(PickShared), stream_>>>(
        res.as<RowArgmax>(), state.as<const RowState>(), chunks.as<const Chunk>(), cand.as<const Cand>(), x, V, vocab,
        static_cast<int>(nchunk), ex.as<const int32_t>(), nex, params.as<const RowDraw>());
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(out.data(), res.ptr, out.size() * sizeof(RowArgmax), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    for (auto& o : out) o.id = kDrawUndecided;  // a vocabulary beyond the chunks: every row the general way
    CUDA_CHECK(cudaMemcpyAsync(res.ptr, out.data(), out.size() * sizeof(RowArgmax), cudaMemcpyHostToDevice, stream_));
  }
  bool undecided = false;
  for (size_t r = 0; r < out.size(); ++r) undecided |= rows[r].temperature > 0.0f && out[r].id == kDrawUndecided;
  if (undecided) {
    launch_draw_rows(res.as<RowArgmax>(), x, R, V, vocab, ex.as<const int32_t>(), nex, params.as<const RowDraw>(),
                     stream_);
    CUDA_CHECK(cudaMemcpyAsync(out.data(), res.ptr, out.size() * sizeof(RowArgmax), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  for (size_t r = 0; r < out.size(); ++r)
    if (!(rows[r].temperature > 0.0f)) out[r] = RowArgmax{};
  return out;
}

}  // namespace sparkserve
