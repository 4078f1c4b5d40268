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

// (value desc, id asc): the order for sorted candidates and top logprobs.
template <class Values>
auto desc_then_id(const Values& v) {
  return [&v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
}

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
  const size_t vocab = logits.size();
  std::vector<int32_t> ids;
  ids.reserve(vocab);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab; ++i) {
    if (!(logits[i] > kNegInf)) continue;  // -inf and NaN
    ids.push_back(static_cast<int32_t>(i));
    mx = std::max(mx, static_cast<double>(logits[i] / temperature));
  }
  if (ids.empty()) return {};
  // Unnormalized probabilities exp(l/T - max): min_p and top_k need no normalization.
  std::vector<double> w(vocab, 0.0);
  for (int32_t id : ids) w[id] = std::exp(static_cast<double>(logits[id] / temperature) - mx);
  if (min_p > 0.0f) {  // p_max corresponds to w == 1
    std::erase_if(ids, [&](int32_t id) { return w[id] < static_cast<double>(min_p); });
  }
  if (top_k > 0 && static_cast<size_t>(top_k) < ids.size()) {
    std::vector<int32_t> tmp = ids;
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), desc_then_id(w));
    double kth = w[tmp[static_cast<size_t>(top_k - 1)]];
    std::erase_if(ids, [&](int32_t id) { return w[id] < kth; });
  }
  std::sort(ids.begin(), ids.end(), desc_then_id(w));
  double total = 0.0;
  for (int32_t id : ids) total += w[id];
  if (top_p < 1.0f) {
    double target = static_cast<double>(top_p) * total, cum = 0.0;
    size_t keep = 0;
    while (keep < ids.size() && cum < target) cum += w[ids[keep++]];
    ids.resize(std::max<size_t>(keep, 1));
    total = 0.0;
    for (int32_t id : ids) total += w[id];
  }
  std::vector<Candidate> out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.push_back({id, w[id] / total});
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
    std::vector<float> lp = log_softmax(logits);
    float chosen = lp[static_cast<size_t>(result.token)];
    result.logprob = chosen;
    result.rank = 1;
    for (float v : lp)
      if (v > chosen) ++result.rank;
    size_t k = std::min(static_cast<size_t>(params.num_logprobs), lp.size());
    std::vector<int32_t> order(lp.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      desc_then_id(lp));
    for (size_t i = 0; i < k; ++i) result.top.push_back({order[i], lp[static_cast<size_t>(order[i])]});
  }
  return result;
}

}  // namespace sparkserve
