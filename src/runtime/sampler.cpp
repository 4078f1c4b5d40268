#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/truncated_draw.h"

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

std::optional<DeviceChoice> device_choice(const SamplingParams& p, bool constrained, int64_t num_generated) {
  if (constrained || p.num_logprobs >= 0 || p.allowed_token_ids || !p.logit_bias.empty() ||
      p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    return std::nullopt;
  DeviceChoice c;
  if (num_generated < p.min_tokens) {  // apply_logits_processors' mask, same ids
    c.excluded = p.eos_token_ids;
    c.excluded.insert(c.excluded.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    std::sort(c.excluded.begin(), c.excluded.end());
    c.excluded.erase(std::unique(c.excluded.begin(), c.excluded.end()), c.excluded.end());
    if (c.excluded.size() > kArgmaxMaxExcluded) return std::nullopt;  // the full row then
  }
  if (!p.greedy()) {
    c.draw.temperature = p.temperature;
    c.draw.top_k = p.top_k;
    c.draw.top_p = p.top_p;
    c.draw.min_p = p.min_p;
    c.draw.u = uniform_for_step(p.seed, static_cast<uint64_t>(num_generated));
  }
  return c;
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
    const int32_t drawn = draw_truncated(work, params.temperature, params.top_k, params.top_p, params.min_p,
                                         uniform_for_step(params.seed, output.size()));
    // Everything masked: nothing better to do than the argmax.
    result.token = drawn >= 0 ? drawn : argmax_lowest(work);
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
