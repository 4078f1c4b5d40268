// Backend::draw's general path (draw.cu sends here the rows its candidate list cannot decide: a
// flat row whose top_p mass lies beyond the list, top_k above it, a vocabulary beyond its chunks).
//
// One block per row, each thread owning a contiguous run of columns, so that every pass visits the
// row in id order (thread by thread, then within a thread) as the host's inverse-CDF walk does. The
// host sorts for top_k (a heap) and top_p (1/16-nat buckets, then a sort of the crossing bucket);
// here both are MSB-first radix selects over an order-preserving 32-bit key of s = logit /
// temperature: top_k finds the k-th largest s (every s >= it kept, ties included), top_p the s
// where the mass of the larger ones reaches top_p * total, then keeps the fewest tokens of that s,
// lowest ids first, that reach it: the host's (w desc, id asc) prefix. Weights exp(s - max) and
// all sums are doubles, as on the host; only summation order and exp's last bit differ. Several
// passes over the row on one SM: ~4 ms per row, which is why draw.cu decides most rows first.
#include <cfloat>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/draw_common.cuh"

namespace sparkserve {
namespace {

constexpr int kDrawThreads = 1024;
constexpr int kDrawWarps = kDrawThreads / 32;

__global__ void __launch_bounds__(kDrawThreads) draw_row_kernel(RowArgmax* out, const float* logits, int64_t V,
                                                             int64_t vocab, const int32_t* excluded, int num_excluded,
                                                             const RowDraw* rows) {
  const RowDraw p = rows[blockIdx.x];
  if (!(p.temperature > 0.0f) || out[blockIdx.x].id != kDrawUndecided) return;
  const float* row = logits + blockIdx.x * V;
  __shared__ int32_t ex[kArgmaxMaxExcluded];
  __shared__ double dtmp[kDrawWarps];
  __shared__ float ftmp[kDrawWarps];
  __shared__ long long itmp[kDrawWarps];
  __shared__ uint32_t hist[256];
  __shared__ double mass[256];
  __shared__ uint32_t chosen_digit;
  __shared__ int crossed;
  for (int j = threadIdx.x; j < num_excluded; j += blockDim.x) ex[j] = excluded[j];
  __syncthreads();

  const int64_t seg = (vocab + kDrawThreads - 1) / kDrawThreads;
  const int64_t lo = min(vocab, threadIdx.x * seg), hi = min(vocab, lo + seg);
  const auto is_excluded = [&](int64_t i) {
    bool e = false;
    for (int j = 0; j < num_excluded; ++j) e = e || ex[j] == static_cast<int32_t>(i);
    return e;
  };
  // A possible token: finite (the row holds no NaN / +Inf past the first pass) and not excluded.
  const auto possible = [&](int64_t i, float v) { return v > -INFINITY && !is_excluded(i); };

  // Pass 1: first NaN / +Inf, max s, number of possible tokens.
  int bad = INT_MAX;
  float mx_f = -INFINITY;
  long long finite = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const float v = row[i];
    if (isnan(v) || v == INFINITY) {
      bad = min(bad, static_cast<int>(i));
      continue;
    }
    if (possible(i, v)) {
      mx_f = fmaxf(mx_f, v / p.temperature);
      ++finite;
    }
  }
  bad = block_reduce<kDrawThreads>(bad, reinterpret_cast<int*>(itmp), [](int a, int b) { return min(a, b); });
  mx_f = block_reduce<kDrawThreads>(mx_f, ftmp, [](float a, float b) { return fmaxf(a, b); });
  finite = block_reduce<kDrawThreads>(finite, itmp, [](long long a, long long b) { return a + b; });
  if (bad != INT_MAX || finite == 0) {
    if (threadIdx.x == 0) {
      RowArgmax r;
      r.nonfinite = bad != INT_MAX ? bad : -1;
      r.id = 0;
      if (bad == INT_MAX)  // no possible token: the lowest column not excluded
        while (r.id + 1 < vocab && is_excluded(r.id)) ++r.id;
      out[blockIdx.x] = r;
    }
    return;
  }
  const double mx = mx_f;

  // min_p: w = exp(s - max) >= min_p; far below the cut, no exp (as the host). top_k: s >= the
  // k-th largest (floor_key, set below; 0 keeps all).
  uint32_t floor_key = 0;
  const double min_p_cut = p.min_p > 0.0f ? log(static_cast<double>(p.min_p)) - 1e-6 : 0.0;
  const auto weight = [&](int64_t i, double& w) {  // the token's weight, false when not kept
    const float v = row[i];
    if (!possible(i, v)) return false;
    const float s = v / p.temperature;
    if (order_key(s) < floor_key) return false;
    const double d = static_cast<double>(s) - mx;
    if (p.min_p > 0.0f && (d < min_p_cut || exp(d) < static_cast<double>(p.min_p))) return false;
    w = exp(d);
    return true;
  };

  // MSB-first radix select, 8 bits per round: by count over the possible tokens (top_k: the key
  // whose count of keys at or above it reaches `want`), or by mass over the kept ones (top_p: where
  // their weights reach `want`). Keys outside the prefix selected so far do not count. `above`
  // (the count or mass strictly above the result) is valid on thread 0 only.
  const auto select = [&](bool by_mass, double want, double& above) -> uint32_t {
    uint32_t prefix = 0, mask = 0;
    above = 0.0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int d = threadIdx.x; d < 256; d += blockDim.x) {
        hist[d] = 0;
        mass[d] = 0.0;
      }
      __syncthreads();
      for (int64_t i = lo; i < hi; ++i) {
        const float v = row[i];
        double w = 0.0;
        if (by_mass ? !weight(i, w) : !possible(i, v)) continue;
        const uint32_t k = order_key(v / p.temperature);
        if ((k & mask) != prefix) continue;
        const uint32_t d = (k >> shift) & 255u;
        if (by_mass) atomicAdd(&mass[d], w);
        else atomicAdd(&hist[d], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int d = 255;
        for (; d >= 0; --d) {
          const double here = by_mass ? mass[d] : static_cast<double>(hist[d]);
          if (above + here >= want) break;
          above += here;
        }
        crossed = d >= 0;
        chosen_digit = d >= 0 ? static_cast<uint32_t>(d) : 0u;
      }
      __syncthreads();
      if (!crossed) return 0;  // rounding kept `want` out of reach: select nothing
      prefix |= chosen_digit << shift;
      mask |= 255u << shift;
      __syncthreads();  // every thread has read chosen_digit before the next round resets the histograms
    }
    return prefix;
  };

  if (p.top_k > 0 && p.top_k < finite) {
    double unused;
    floor_key = select(false, static_cast<double>(p.top_k), unused);
  }
  double total = 0.0;
  for (int64_t i = lo; i < hi; ++i) {
    double w;
    if (weight(i, w)) total += w;
  }
  total = block_reduce<kDrawThreads>(total, dtmp, [](double a, double b) { return a + b; });

  // top_p: keys above `cut` all, and the first `ties` tokens (id order) whose key equals it.
  uint32_t cut = 0;
  long long ties = LLONG_MAX, tie_base = 0;
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * total;
    double above = 0.0;
    const uint32_t k = select(true, target, above);
    if (crossed) {
      cut = k;
      const double wk = exp(static_cast<double>(key_value(k)) - mx);
      long long m = 0;
      if (threadIdx.x == 0) {
        double c = above;
        while (c < target) {
          c += wk;
          ++m;
        }
        itmp[0] = m;
      }
      __syncthreads();
      ties = itmp[0];
      __syncthreads();
      long long mine = 0;
      for (int64_t i = lo; i < hi; ++i) {
        double w;
        if (weight(i, w) && order_key(row[i] / p.temperature) == cut) ++mine;
      }
      tie_base = block_exclusive_scan<kDrawThreads>(mine, itmp);
    }
  }
  // The kept set's weights in id order: this thread's run, then the draw.
  const auto kept = [&](int64_t i, long long& tie_rank, double& w) {
    if (!weight(i, w)) return false;
    if (cut == 0) return true;
    const uint32_t k = order_key(row[i] / p.temperature);
    if (k > cut) return true;
    if (k < cut) return false;
    return tie_rank++ < ties;
  };
  double mine = 0.0;
  int last = -1;
  {
    long long r = tie_base;
    for (int64_t i = lo; i < hi; ++i) {
      double w;
      if (kept(i, r, w)) {
        mine += w;
        last = static_cast<int>(i);
      }
    }
  }
  const double kept_total = block_reduce<kDrawThreads>(mine, dtmp, [](double a, double b) { return a + b; });
  last = block_reduce<kDrawThreads>(last, reinterpret_cast<int*>(itmp), [](int a, int b) { return max(a, b); });
  const double before = block_exclusive_scan<kDrawThreads>(mine, dtmp);
  const double target = p.u * kept_total;
  __shared__ int found;
  if (threadIdx.x == 0) found = INT_MAX;
  __syncthreads();
  if (before <= target && target < before + mine) {
    long long r = tie_base;
    double cum = before;
    for (int64_t i = lo; i < hi; ++i) {
      double w;
      if (!kept(i, r, w)) continue;
      cum += w;
      if (target < cum) {
        atomicMin(&found, static_cast<int>(i));
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    RowArgmax r;
    r.id = found != INT_MAX ? found : last;  // rounding left the target past the end: the last kept
    r.nonfinite = -1;
    out[blockIdx.x] = r;
  }
}

}  // namespace

void launch_draw_rows(RowArgmax* out, const float* logits, int64_t R, int64_t V, int64_t vocab,
                      const int32_t* excluded, int num_excluded, const RowDraw* rows, cudaStream_t stream) {
  draw_row_kernel<<<static_cast<unsigned>(R), kDrawThreads, 0, stream>>>(out, logits, V, vocab, excluded, num_excluded,
                                                                        rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
