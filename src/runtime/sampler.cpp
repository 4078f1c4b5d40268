#include "runtime/sampler.h"

#include "backend/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace sparkserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool in_vocab(int32_t id, size_t vocab) { return id >= 0 && static_cast<size_t>(id) < vocab; }

}  // namespace

double uniform_for_step(uint64_t seed, uint64_t step) {
  uint64_t bits = splitmix64(splitmix64(seed) ^ step);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

std::vector<float> log_softmax(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits)
    if (x > mx) mx = x;
  std::vector<float> out(logits.size(), kNegInf);
  if (!std::isfinite(mx)) return out;  // no finite logit: every token is impossible
  double sum = 0.0;
  for (float x : logits)
    if (x > kNegInf) sum += std::exp(static_cast<double>(x) - mx);  // NaN fails the test
  double log_z = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > kNegInf) out[i] = static_cast<float>(static_cast<double>(logits[i]) - log_z);
  return out;
}

void apply_penalties(std::span<float> logits, float repetition_penalty, float frequency_penalty,
                     float presence_penalty, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  const size_t vocab = logits.size();
  if (repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(vocab, 0);
    for (int32_t id : prompt) {
      CHECK_MSG(in_vocab(id, vocab), "prompt token id outside the logits row");
      seen[static_cast<size_t>(id)] = 1;
    }
    for (int32_t id : output) {
      CHECK_MSG(in_vocab(id, vocab), "output token id outside the logits row");
      seen[static_cast<size_t>(id)] = 1;
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (!seen[i]) continue;
      logits[i] = logits[i] > 0.0f ? logits[i] / repetition_penalty : logits[i] * repetition_penalty;
    }
  }
  if (frequency_penalty != 0.0f || presence_penalty != 0.0f) {
    std::vector<int32_t> sorted(output.begin(), output.end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
      CHECK_MSG(in_vocab(sorted[i], vocab), "output token id outside the logits row");
      float& l = logits[static_cast<size_t>(sorted[i])];
      l -= frequency_penalty * static_cast<float>(j - i);
      l -= presence_penalty;
      i = j;
    }
  }
}

void apply_logits_processors(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt, std::span<const int32_t> output,
                             std::span<const uint8_t> allowed_mask) {
  const size_t vocab = logits.size();
  for (float& x : logits)
    if (std::isnan(x)) x = kNegInf;  // a NaN logit can never be chosen
  if (params.allowed_token_ids) {
    std::vector<uint8_t> allowed(vocab, 0);
    for (int32_t id : *params.allowed_token_ids)
      if (in_vocab(id, vocab)) allowed[static_cast<size_t>(id)] = 1;
    for (size_t i = 0; i < vocab; ++i)
      if (!allowed[i]) logits[i] = kNegInf;
  }
  if (!allowed_mask.empty()) {
    CHECK_MSG(allowed_mask.size() == vocab, "constraint mask size differs from the logits row");
    for (size_t i = 0; i < vocab; ++i)
      if (!allowed_mask[i]) logits[i] = kNegInf;
  }
  for (const auto& [id, bias] : params.logit_bias)
    if (in_vocab(id, vocab)) logits[static_cast<size_t>(id)] += bias;
  if (static_cast<int64_t>(output.size()) < params.min_tokens) {
    // As vLLM: all stop ids, EOS included even with ignore_eos, are masked until min_tokens.
    for (int32_t id : params.eos_token_ids)
      if (in_vocab(id, vocab)) logits[static_cast<size_t>(id)] = kNegInf;
    for (int32_t id : params.stop_token_ids)
      if (in_vocab(id, vocab)) logits[static_cast<size_t>(id)] = kNegInf;
  }
  apply_penalties(logits, params.repetition_penalty, params.frequency_penalty,
                  params.presence_penalty, prompt, output);
}

std::optional<std::vector<int32_t>> argmax_exclusions(const SamplingParams& p, bool constrained,
                                                      int64_t num_generated) {
  if (!p.greedy() || constrained || p.num_logprobs >= 0 || p.allowed_token_ids || !p.logit_bias.empty() ||
      p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    return std::nullopt;
  std::vector<int32_t> excluded;
  if (num_generated < p.min_tokens) {  // apply_logits_processors' mask, same ids
    excluded = p.eos_token_ids;
    excluded.insert(excluded.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    std::sort(excluded.begin(), excluded.end());
    excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
    if (excluded.size() > kArgmaxMaxExcluded) return std::nullopt;  // the full row then
  }
  return excluded;
}

int32_t argmax_lowest(std::span<const float> logits) {
  int32_t best = 0;
  float best_v = kNegInf;
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    float v = logits[i];
    if (std::isnan(v)) continue;
    if (!found || v > best_v) {
      best = static_cast<int32_t>(i);
      best_v = v;
      found = true;
    }
  }
  return best;
}

namespace {

struct Item {
  float s;  // logit / temperature
  int32_t id;
};

// The kept tokens in id order with their unnormalized weights exp(s - max s) and their sum.
struct Truncation {
  std::vector<Item> items;
  std::vector<double> w;
  double total = 0.0;
};

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
  std::vector<Item>& items = t.items;
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

}  // namespace

std::vector<Candidate> truncated_distribution(std::span<const float> logits, float temperature,
                                              int32_t top_k, float top_p, float min_p) {
  Truncation t = truncate(logits, temperature, top_k, top_p, min_p);
  std::vector<Candidate> out;
  out.reserve(t.items.size());
  for (size_t i = 0; i < t.items.size(); ++i) out.push_back({t.items[i].id, t.w[i] / t.total});
  return out;
}

SampleResult token_logprobs(std::span<const float> logits, int32_t token, int num_top) {
  SampleResult result;
  result.token = token;
  // log_softmax of the raw row, without materializing it: log p_i = l_i - log Z.
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits)
    if (x > mx) mx = x;
  double sum = 0.0;
  for (float x : logits)
    if (x > kNegInf) sum += std::exp(static_cast<double>(x) - mx);
  const double log_z = mx + std::log(sum);
  auto logprob = [&](int32_t id) {
    float l = logits[static_cast<size_t>(id)];
    return l > kNegInf ? static_cast<float>(static_cast<double>(l) - log_z) : kNegInf;
  };
  const float chosen_logit = logits[static_cast<size_t>(token)];
  result.logprob = logprob(token);
  result.rank = 1;
  for (float x : logits)
    if (x > chosen_logit) ++result.rank;  // log p is monotonic in the logit
  // The k best by (logit desc, id asc) with a size-k heap whose top is the worst kept.
  const size_t k = std::min(static_cast<size_t>(num_top), logits.size());
  auto better = [&](int32_t a, int32_t b) {
    float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    bool na = !(la > kNegInf), nb = !(lb > kNegInf);  // -inf / NaN rank last
    if (na != nb) return nb;
    return (!na && la > lb) || ((na || la == lb) && a < b);
  };
  std::vector<int32_t> heap;
  heap.reserve(k + 1);
  for (size_t i = 0; i < logits.size() && k > 0; ++i) {
    int32_t id = static_cast<int32_t>(i);
    if (heap.size() < k) {
      heap.push_back(id);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(id, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = id;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  for (int32_t id : heap) result.top.push_back({id, logprob(id)});
  return result;
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int32_t> prompt, std::span<const int32_t> output,
                          std::span<const uint8_t> allowed) {
  CHECK_MSG(!logits.empty(), "empty logits row");
  SampleResult result;
  // The model's raw row must be finite (or -inf, a masked token): a NaN or +Inf means broken
  // weights or an overflow, and any token picked from it would be garbage ("!!!!": NaN never
  // wins argmax, so id 0 does). Reported instead of sampled.
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      result.nonfinite_logit = static_cast<int32_t>(i);
      return result;
    }
  }
  std::vector<float> work(logits.begin(), logits.end());
  apply_logits_processors(work, params, prompt, output, allowed);

  if (params.greedy()) {
    result.token = argmax_lowest(work);
  } else {
    Truncation t = truncate(work, params.temperature, params.top_k, params.top_p, params.min_p);
    if (t.items.empty()) {
      result.token = argmax_lowest(work);  // everything masked: nothing better to do
    } else {
      const double target = uniform_for_step(params.seed, output.size()) * t.total;
      double cum = 0.0;
      result.token = t.items.back().id;  // covers rounding when u is just below 1
      for (size_t i = 0; i < t.items.size(); ++i) {
        cum += t.w[i];
        if (target < cum) {
          result.token = t.items[i].id;
          break;
        }
      }
    }
  }

  if (params.num_logprobs >= 0) {
    SampleResult lp = token_logprobs(logits, result.token, params.num_logprobs);
    result.logprob = lp.logprob;
    result.rank = lp.rank;
    result.top = std::move(lp.top);
  }
  return result;
}

}  // namespace sparkserve
