#include "runtime/sampler.h"

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
                             std::span<const int32_t> prompt, std::span<const int32_t> output) {
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

std::vector<Candidate> truncated_distribution(std::span<const float> logits, float temperature,
                                              int32_t top_k, float top_p, float min_p) {
  struct Item {
    float s;  // logit / temperature
    int32_t id;
  };
  // Pass 1: the maximum scaled logit and how many tokens are possible at all.
  float mx_f = kNegInf;
  size_t finite = 0;
  for (float l : logits) {
    if (!(l > kNegInf)) continue;  // -inf and NaN
    mx_f = std::max(mx_f, l / temperature);
    ++finite;
  }
  if (finite == 0) return {};
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
  std::vector<Item> items;
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
  std::vector<double> w(items.size());
  double total = 0.0;
  for (size_t i = 0; i < items.size(); ++i) total += w[i] = std::exp(static_cast<double>(items[i].s) - mx);

  std::vector<size_t> kept;  // indices into items
  if (top_p < 1.0f) {
    // The minimal prefix in (w desc, id asc) order whose mass reaches top_p * total, found by
    // sorting a growing head of the order only (the tail of a 248k vocabulary is never sorted).
    std::vector<size_t> order(items.size());
    std::iota(order.begin(), order.end(), size_t{0});
    auto before = [&](size_t a, size_t b) {
      return w[a] > w[b] || (w[a] == w[b] && items[a].id < items[b].id);
    };
    const double target = static_cast<double>(top_p) * total;
    double cum = 0.0;
    size_t done = 0, keep = 0;
    bool reached = false;
    for (size_t m = std::min<size_t>(order.size(), 64); !reached; m = std::min(order.size(), m * 4)) {
      if (m < order.size())
        std::nth_element(order.begin() + static_cast<std::ptrdiff_t>(done),
                         order.begin() + static_cast<std::ptrdiff_t>(m), order.end(), before);
      std::sort(order.begin() + static_cast<std::ptrdiff_t>(done),
                order.begin() + static_cast<std::ptrdiff_t>(m), before);
      for (; done < m; ++done) {
        if (cum >= target) {
          reached = true;
          break;
        }
        cum += w[order[done]];
        keep = done + 1;
      }
      if (done == order.size()) reached = true;
    }
    kept.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(std::max<size_t>(keep, 1)));
    total = 0.0;
    for (size_t i : kept) total += w[i];
  } else {
    kept.resize(items.size());
    std::iota(kept.begin(), kept.end(), size_t{0});
  }
  std::vector<Candidate> out;
  out.reserve(kept.size());
  if (top_p < 1.0f) std::sort(kept.begin(), kept.end());  // back to id order (items are)
  for (size_t i : kept) out.push_back({items[i].id, w[i] / total});
  return out;
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int32_t> prompt, std::span<const int32_t> output) {
  CHECK_MSG(!logits.empty(), "empty logits row");
  SampleResult result;
  std::vector<float> work(logits.begin(), logits.end());
  apply_logits_processors(work, params, prompt, output);

  if (params.greedy()) {
    result.token = argmax_lowest(work);
  } else {
    std::vector<Candidate> cands =
        truncated_distribution(work, params.temperature, params.top_k, params.top_p, params.min_p);
    if (cands.empty()) {
      result.token = argmax_lowest(work);  // everything masked: nothing better to do
    } else {
      double u = uniform_for_step(params.seed, output.size());
      double cum = 0.0;
      result.token = cands.back().token;  // covers rounding when u is just below 1
      for (const Candidate& c : cands) {
        cum += c.prob;
        if (u < cum) {
          result.token = c.token;
          break;
        }
      }
    }
  }

  if (params.num_logprobs >= 0) {
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
    const float chosen_logit = logits[static_cast<size_t>(result.token)];
    result.logprob = logprob(result.token);
    result.rank = 1;
    for (float x : logits)
      if (x > chosen_logit) ++result.rank;  // log p is monotonic in the logit
    // The k best by (logit desc, id asc) with a size-k heap whose top is the worst kept.
    const size_t k = std::min(static_cast<size_t>(params.num_logprobs), logits.size());
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
  }
  return result;
}

}  // namespace sparkserve
