#include "core/truncated_draw.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace sparkserve {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

Truncation truncate(std::span<const float> logits, float temperature, int32_t top_k, float top_p,
                    float min_p) {
  Truncation t;
  // Pass 1: the maximum scaled logit and how many tokens are possible at all.
  float mx_f = kNegInf;
  size_t finite = 0;
  for (float l : logits) {
    if (!(l > kNegInf)) continue;  // -inf and NaN
    mx_f = std::max(mx_f, l / temperature);
    ++finite;
  }
  if (finite == 0) return t;
  const double mx = mx_f;
  // top_k in logit space, as vLLM: keep every s >= the k-th largest s (ties kept). A size-k heap
  // (worst kept on top) finds that value in one pass. min_p and top_k commute (each keeps an
  // upper set of the same order), so both are applied in the collection pass below.
  float floor_s = kNegInf;
  if (top_k > 0 && static_cast<size_t>(top_k) < finite) {
    std::vector<float> heap;
    heap.reserve(static_cast<size_t>(top_k));
    auto worse_on_top = std::greater<float>();
    for (float l : logits) {
      if (!(l > kNegInf)) continue;
      float sc = l / temperature;
      if (heap.size() < static_cast<size_t>(top_k)) {
        heap.push_back(sc);
        std::push_heap(heap.begin(), heap.end(), worse_on_top);
      } else if (sc > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), worse_on_top);
        heap.back() = sc;
        std::push_heap(heap.begin(), heap.end(), worse_on_top);
      }
    }
    floor_s = heap.front();
  }
  // min_p: keep w = exp(s - max) = p / p_max >= min_p. Entries far below the cut are dropped
  // without the exp (exp(d) < min_p * e^-1e-6 there, far beyond exp's rounding error).
  const double min_p_cut = min_p > 0.0f ? std::log(static_cast<double>(min_p)) - 1e-6 : 0.0;
  std::vector<TruncatedItem>& items = t.items;
  items.reserve(top_k > 0 ? std::min(finite, static_cast<size_t>(top_k) + 16) : finite);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] > kNegInf)) continue;
    float sc = logits[i] / temperature;
    if (sc < floor_s) continue;
    if (min_p > 0.0f) {
      double d = static_cast<double>(sc) - mx;
      if (d < min_p_cut || std::exp(d) < static_cast<double>(min_p)) continue;
    }
    items.push_back({sc, static_cast<int32_t>(i)});
  }
  std::vector<double>& w = t.w;
  w.resize(items.size());
  double total = 0.0;
  for (size_t i = 0; i < items.size(); ++i) total += w[i] = std::exp(static_cast<double>(items[i].s) - mx);
  t.total = total;
  if (top_p >= 1.0f) return t;

  // top_p: the minimal prefix in (w desc, id asc) order whose mass reaches top_p * total. Tokens
  // are bucketed by (max - s) in 1/16 nat steps (one order-preserving pass); whole buckets above
  // the one where the mass crosses the target are kept, and only that bucket is sorted.
  constexpr size_t kPerNat = 16, kBuckets = kPerNat * 64 + 1;  // the last bucket: w < e^-64
  auto bucket = [&](size_t i) {
    double d = mx - static_cast<double>(items[i].s);
    return d >= 64.0 ? kBuckets - 1 : static_cast<size_t>(d * kPerNat);
  };
  std::vector<double> mass(kBuckets, 0.0);
  for (size_t i = 0; i < items.size(); ++i) mass[bucket(i)] += w[i];
  const double target = static_cast<double>(top_p) * total;
  double cum = 0.0;
  size_t cross = 0;
  while (cross < kBuckets && cum + mass[cross] < target) cum += mass[cross++];
  if (cross == kBuckets) return t;  // rounding kept the target out of reach: keep everything
  std::vector<uint8_t> keep(items.size(), 0);
  std::vector<size_t> head;
  for (size_t i = 0; i < items.size(); ++i) {
    size_t b = bucket(i);
    if (b < cross) keep[i] = 1;
    else if (b == cross) head.push_back(i);
  }
  std::sort(head.begin(), head.end(), [&](size_t a, size_t b) {
    return w[a] > w[b] || (w[a] == w[b] && items[a].id < items[b].id);
  });
  for (size_t i : head) {
    if (cum >= target) break;
    cum += w[i];
    keep[i] = 1;
  }
  size_t n = 0;
  t.total = 0.0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!keep[i]) continue;
    items[n] = items[i];
    w[n] = w[i];
    t.total += w[n++];
  }
  items.resize(n);
  w.resize(n);
  return t;
}


int32_t draw_truncated(std::span<const float> logits, float temperature, int32_t top_k, float top_p, float min_p,
                       double u) {
  const Truncation t = truncate(logits, temperature, top_k, top_p, min_p);
  if (t.items.empty()) return -1;
  const double target = u * t.total;
  double cum = 0.0;
  for (size_t i = 0; i < t.items.size(); ++i) {
    cum += t.w[i];
    if (target < cum) return t.items[i].id;
  }
  return t.items.back().id;  // covers rounding when u is just below 1
}

}  // namespace sparkserve
