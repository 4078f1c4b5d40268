// Sampler steps against direct formulas, distribution properties and reproducibility.
// Tolerances: values computed in double inside the sampler and compared with long-double
// references get 1e-12 (relative to O(1) probabilities); float outputs (logits, logprobs of
// magnitude < 30) get 1e-5, a few float ulps at that magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/truncated_draw.h"
#include "runtime/sampler.h"

namespace sparkserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 4.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<long double> softmax_ld(const std::vector<float>& logits, double temperature = 1.0) {
  long double mx = -INFINITY;
  for (float x : logits) mx = std::max<long double>(mx, x / temperature);
  std::vector<long double> p(logits.size());
  long double s = 0;
  for (size_t i = 0; i < logits.size(); ++i) s += p[i] = std::exp(logits[i] / temperature - mx);
  for (auto& x : p) x /= s;
  return p;
}

SamplingParams random_params(uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  return p;
}

TEST(UniformForStep, RangeDeterminismAndUniformity) {
  // 100 bins x 1000 expected per bin; chi-square with 99 dof has mean 99, sd 14; 180 is > 5 sd.
  // The draws are a fixed function of (seed, step), so this is deterministic, not flaky.
  std::vector<int> bins(100, 0);
  for (uint64_t step = 0; step < 100000; ++step) {
    double u = uniform_for_step(12345, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    bins[static_cast<size_t>(u * 100)]++;
  }
  double chi2 = 0;
  for (int c : bins) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  EXPECT_LT(chi2, 180.0);
  EXPECT_EQ(uniform_for_step(7, 3), uniform_for_step(7, 3));
  EXPECT_NE(uniform_for_step(7, 3), uniform_for_step(7, 4));
  EXPECT_NE(uniform_for_step(7, 3), uniform_for_step(8, 3));
}

TEST(LogSoftmax, MatchesDirectFormula) {
  auto logits = random_logits(1000, 1, 8.0f);
  logits[5] = -kInf;
  auto lp = log_softmax(logits);
  long double mx = *std::max_element(logits.begin(), logits.end()), s = 0;
  for (float x : logits) s += std::exp(static_cast<long double>(x) - mx);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (i == 5) {
      EXPECT_EQ(lp[i], -kInf);
      continue;
    }
    EXPECT_NEAR(lp[i], static_cast<double>(logits[i] - mx - std::log(s)), 1e-5) << i;
  }
}

TEST(Greedy, LowestIdOnExactTiesAndIgnoresSeed) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -kInf};
  EXPECT_EQ(argmax_lowest(logits), 1);
  SamplingParams p;
  p.temperature = 0.0f;
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    p.seed = seed;
    EXPECT_EQ(sample_token(logits, p, {}, {}).token, 1);
  }
  std::vector<float> with_nan = {std::nanf(""), 0.5f, 0.25f};
  EXPECT_EQ(argmax_lowest(with_nan), 1);
}

TEST(Penalties, RepetitionFrequencyPresenceMatchFormula) {
  auto logits = random_logits(50, 2);
  logits[3] = 2.0f;
  logits[4] = -2.0f;
  std::vector<int32_t> prompt = {3, 4, 10};
  std::vector<int32_t> output = {4, 7, 7, 7, 20};
  auto out = logits;
  apply_penalties(out, 1.3f, 0.5f, 0.25f, prompt, output);
  std::map<int, int> count;
  for (int t : output) count[t]++;
  std::set<int> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  for (int i = 0; i < 50; ++i) {
    float want = logits[i];
    if (seen.count(i)) want = want > 0 ? want / 1.3f : want * 1.3f;
    if (count.count(i)) want -= 0.5f * count[i] + 0.25f;
    EXPECT_NEAR(out[i], want, 1e-5) << i;
  }
  EXPECT_NEAR(out[3], 2.0f / 1.3f, 1e-6);           // prompt only: repetition, no frequency
  EXPECT_NEAR(out[7], logits[7] * (logits[7] > 0 ? 1 / 1.3f : 1.3f) - 1.75f, 1e-5);
}

TEST(Penalties, NeutralValuesChangeNothing) {
  auto logits = random_logits(30, 3);
  auto out = logits;
  std::vector<int32_t> hist = {1, 2, 2, 5};
  apply_penalties(out, 1.0f, 0.0f, 0.0f, hist, hist);
  EXPECT_EQ(out, logits);
}

TEST(Processors, LogitBiasAddsAndDecidesGreedy) {
  std::vector<float> logits = {5.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{2, 100.0f}, {0, -100.0f}};
  auto out = logits;
  apply_logits_processors(out, p, {}, {});
  EXPECT_FLOAT_EQ(out[0], -95.0f);
  EXPECT_FLOAT_EQ(out[2], 100.0f);
  EXPECT_FLOAT_EQ(out[1], 1.0f);
  EXPECT_EQ(sample_token(logits, p, {}, {}).token, 2);
  // -100 on the favourite: it is never drawn with random sampling either.
  SamplingParams r = random_params(5);
  r.logit_bias = {{0, -100.0f}};
  for (int step = 0; step < 200; ++step) {
    std::vector<int32_t> out_hist(static_cast<size_t>(step), 1);
    EXPECT_NE(sample_token(logits, r, {}, out_hist).token, 0);
  }
}

TEST(Processors, MinTokensMasksEosAndStopIdsUntilReached) {
  std::vector<float> logits = {0.0f, 0.0f, 10.0f, 9.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.eos_token_ids = {2};
  p.stop_token_ids = {3};
  p.min_tokens = 3;
  p.ignore_eos = true;  // EOS stays masked under min_tokens even with ignore_eos (vLLM)
  std::vector<int32_t> hist;
  EXPECT_EQ(sample_token(logits, p, {}, hist).token, 4);
  hist = {4, 4};
  EXPECT_EQ(sample_token(logits, p, {}, hist).token, 4);
  hist = {4, 4, 4};
  EXPECT_EQ(sample_token(logits, p, {}, hist).token, 2);
}

// What a backend decides where the logits are stands for sample_token exactly when nothing but
// min_tokens' mask changes the row: the same ids are left out, and the same token results; sampled
// rows carry their parameters and the step's uniform number.
TEST(Processors, DeviceChoiceIsWhatSampleTokenDoes) {
  std::vector<float> logits = {0.0f, 0.0f, 10.0f, 9.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.eos_token_ids = {2};
  p.stop_token_ids = {3, 2};
  p.min_tokens = 3;
  for (int64_t n : {0, 2, 3}) {
    std::optional<DeviceChoice> c = device_choice(p, /*constrained=*/false, n);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->draw.temperature, 0.0f);
    EXPECT_EQ(c->excluded, n < 3 ? std::vector<int32_t>({2, 3}) : std::vector<int32_t>{});
    std::vector<float> masked = logits;
    for (int32_t id : c->excluded) masked[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    std::vector<int32_t> hist(static_cast<size_t>(n), 4);
    EXPECT_EQ(argmax_lowest(masked), sample_token(logits, p, {}, hist).token) << n;
  }
  EXPECT_FALSE(device_choice(p, /*constrained=*/true, 0));
  SamplingParams biased = p;
  biased.logit_bias = {{0, 0.0f}};
  EXPECT_FALSE(device_choice(biased, false, 5));
  SamplingParams logprobs = p;
  logprobs.num_logprobs = 0;
  EXPECT_FALSE(device_choice(logprobs, false, 5));
  SamplingParams many = p;  // more stop ids than a backend takes: the full row
  for (int32_t i = 0; i < 100; ++i) many.stop_token_ids.push_back(100 + i);
  EXPECT_FALSE(device_choice(many, false, 0));
  EXPECT_TRUE(device_choice(many, false, 3));
  SamplingParams sampled = p;
  sampled.temperature = 0.7f;
  sampled.top_k = 3;
  sampled.top_p = 0.9f;
  sampled.min_p = 0.01f;
  sampled.seed = 99;
  for (int64_t n : {0, 4}) {
    std::optional<DeviceChoice> c = device_choice(sampled, false, n);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->draw.temperature, 0.7f);
    EXPECT_EQ(c->draw.top_k, 3);
    EXPECT_EQ(c->draw.top_p, 0.9f);
    EXPECT_EQ(c->draw.min_p, 0.01f);
    EXPECT_EQ(c->draw.u, uniform_for_step(99, static_cast<uint64_t>(n)));
    std::vector<float> masked = logits;
    for (int32_t id : c->excluded) masked[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    std::vector<int32_t> hist(static_cast<size_t>(n), 4);
    EXPECT_EQ(draw_truncated(masked, 0.7f, 3, 0.9f, 0.01f, c->draw.u), sample_token(logits, sampled, {}, hist).token);
  }
}

TEST(Processors, AllowedTokenIdsRestrictTheDraws) {
  auto logits = random_logits(100, 4);
  SamplingParams p = random_params(11);
  p.allowed_token_ids = std::vector<int32_t>{7, 42, 99};
  std::set<int32_t> drawn;
  for (int step = 0; step < 300; ++step) {
    std::vector<int32_t> hist(static_cast<size_t>(step), 7);
    drawn.insert(sample_token(logits, p, {}, hist).token);
  }
  for (int32_t t : drawn) EXPECT_TRUE(t == 7 || t == 42 || t == 99) << t;
}

TEST(Truncation, TemperatureOnlyIsTheScaledSoftmax) {
  auto logits = random_logits(64, 5);
  auto c = truncated_distribution(logits, 0.7f, 0, 1.0f, 0.0f);
  ASSERT_EQ(c.size(), 64u);
  // Reference divides in float first, as the sampler does, then takes the softmax exactly.
  std::vector<float> scaled(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scaled[i] = logits[i] / 0.7f;
  auto ref = softmax_ld(scaled);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_NEAR(c[i].prob, static_cast<double>(ref[static_cast<size_t>(c[i].token)]), 1e-12);
    if (i > 0) {
      EXPECT_LT(c[i - 1].token, c[i].token);  // id order
    }
  }
}

TEST(Truncation, TopKKeepsKLargestAndTies) {
  std::vector<float> logits = {0.1f, 3.0f, 2.0f, 2.0f, 1.0f, -1.0f};
  auto c = truncated_distribution(logits, 1.0f, 2, 1.0f, 0.0f);
  std::set<int32_t> kept;
  for (auto& x : c) kept.insert(x.token);
  EXPECT_EQ(kept, (std::set<int32_t>{1, 2, 3}));  // the 2nd largest value is tied: both kept
  c = truncated_distribution(logits, 1.0f, 1, 1.0f, 0.0f);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].token, 1);
  EXPECT_DOUBLE_EQ(c[0].prob, 1.0);
}

TEST(Truncation, TopPKeepsMinimalSetReachingP) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto tokens = [](const std::vector<Candidate>& c) {
    std::vector<int32_t> t;
    for (auto& x : c) t.push_back(x.token);
    return t;
  };
  EXPECT_EQ(tokens(truncated_distribution(logits, 1.0f, 0, 0.4f, 0.0f)), (std::vector<int32_t>{0}));
  EXPECT_EQ(tokens(truncated_distribution(logits, 1.0f, 0, 0.75f, 0.0f)), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(tokens(truncated_distribution(logits, 1.0f, 0, 0.9f, 0.0f)),
            (std::vector<int32_t>{0, 1, 2}));
  auto c = truncated_distribution(logits, 1.0f, 0, 0.75f, 0.0f);
  EXPECT_NEAR(c[0].prob, 0.5 / 0.8, 1e-6);  // renormalized (inputs are float-rounded logs)

  // Property over random rows: the kept set is the smallest prefix (by prob desc) whose mass
  // reaches p. Rows where a prefix mass is within 1e-9 of p are skipped (the boundary is then
  // decided by rounding, which both sides may do differently).
  int checked = 0;
  for (uint32_t seed = 0; seed < 200; ++seed) {
    auto l = random_logits(300, 100 + seed, 2.0f);
    float top_p = 0.05f + 0.9f * static_cast<float>(seed % 19) / 18.0f;
    auto ref = softmax_ld(l);
    std::vector<int32_t> order(l.size());
    for (size_t i = 0; i < l.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ref[a] > ref[b]; });
    long double cum = 0;
    size_t m = 0;
    bool ambiguous = false;
    while (m < order.size() && cum < top_p) {
      cum += ref[static_cast<size_t>(order[m++])];
      if (std::fabs(static_cast<double>(cum - top_p)) < 1e-9) ambiguous = true;
    }
    if (ambiguous) continue;
    auto got = truncated_distribution(l, 1.0f, 0, top_p, 0.0f);
    ASSERT_EQ(got.size(), m) << "seed " << seed;
    std::set<int32_t> want(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m)), have;
    for (const auto& cand : got) have.insert(cand.token);
    EXPECT_EQ(have, want) << "seed " << seed;
    ++checked;
  }
  EXPECT_GT(checked, 190);
}

TEST(Truncation, MinPKeepsTokensAboveFractionOfMax) {
  auto logits = random_logits(200, 6);
  auto ref = softmax_ld(logits);
  long double pmax = *std::max_element(ref.begin(), ref.end());
  auto c = truncated_distribution(logits, 1.0f, 0, 1.0f, 0.05f);
  std::set<int32_t> kept;
  for (auto& x : c) kept.insert(x.token);
  for (size_t i = 0; i < logits.size(); ++i) {
    long double ratio = ref[i] / pmax;
    if (std::fabs(static_cast<double>(ratio) - 0.05) < 1e-9) continue;
    EXPECT_EQ(kept.count(static_cast<int32_t>(i)) == 1, ratio >= 0.05L) << i;
  }
}

TEST(Truncation, AllMaskedGivesEmpty) {
  std::vector<float> logits = {-kInf, -kInf};
  EXPECT_TRUE(truncated_distribution(logits, 1.0f, 0, 1.0f, 0.0f).empty());
}

// Draw frequencies with fixed seeds: each count within 5 binomial standard deviations.
void expect_frequencies(const std::vector<float>& logits, const SamplingParams& base,
                        const std::vector<double>& want, int n) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    SamplingParams p = base;
    p.seed = static_cast<uint64_t>(i) * 7919u + 1;
    counts[static_cast<size_t>(sample_token(logits, p, {}, {}).token)]++;
  }
  for (size_t t = 0; t < want.size(); ++t) {
    double mean = n * want[t], sd = std::sqrt(n * want[t] * (1 - want[t]));
    EXPECT_NEAR(counts[t], mean, 5 * sd + 1e-9) << "token " << t;
  }
}

TEST(Sampling, FrequenciesFollowTheDistribution) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p = random_params(0);
  expect_frequencies(logits, p, {0.5, 0.3, 0.15, 0.05}, 20000);
  p.temperature = 0.5f;  // p_i^2 renormalized
  double z = 0.25 + 0.09 + 0.0225 + 0.0025;
  expect_frequencies(logits, p, {0.25 / z, 0.09 / z, 0.0225 / z, 0.0025 / z}, 20000);
  p.temperature = 1.0f;
  p.top_k = 2;
  expect_frequencies(logits, p, {0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0}, 20000);
}

TEST(Sampling, SameSeedSameOutputDifferentSeedDifferent) {
  auto logits = random_logits(500, 7, 1.0f);  // high entropy
  auto run = [&](uint64_t seed) {
    SamplingParams p = random_params(seed);
    p.top_p = 0.95f;
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) out.push_back(sample_token(logits, p, {}, out).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampling, InterleavingWithOtherRequestsChangesNothing) {
  auto la = random_logits(300, 8, 1.0f), lb = random_logits(300, 9, 1.0f);
  SamplingParams pa = random_params(1), pb = random_params(2);
  std::vector<int32_t> alone;
  for (int i = 0; i < 30; ++i) alone.push_back(sample_token(la, pa, {}, alone).token);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 30; ++i) {
    b.push_back(sample_token(lb, pb, {}, b).token);
    a.push_back(sample_token(la, pa, {}, a).token);
    b.push_back(sample_token(lb, pb, {}, b).token);
  }
  EXPECT_EQ(a, alone);
}

TEST(Logprobs, RawDistributionRankAndTop) {
  std::vector<float> logits = {1.0f, 2.0f, 2.0f, 0.5f, -3.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.num_logprobs = 3;
  p.logit_bias = {{4, 100.0f}};  // the chosen token is not the raw favourite
  auto r = sample_token(logits, p, {}, {});
  auto lp = log_softmax(logits);
  EXPECT_EQ(r.token, 4);
  ASSERT_TRUE(r.logprob);
  EXPECT_FLOAT_EQ(*r.logprob, lp[4]);  // raw: neither the bias nor temperature are applied
  EXPECT_EQ(r.rank, 5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 1);  // tie between 1 and 2: lower id first
  EXPECT_EQ(r.top[1].token, 2);
  EXPECT_EQ(r.top[2].token, 0);
  EXPECT_FLOAT_EQ(r.top[2].logprob, lp[0]);

  p.num_logprobs = 0;
  r = sample_token(logits, p, {}, {});
  EXPECT_TRUE(r.logprob.has_value());
  EXPECT_TRUE(r.top.empty());
  p.num_logprobs = -1;
  EXPECT_FALSE(sample_token(logits, p, {}, {}).logprob.has_value());
}

}  // namespace
}  // namespace sparkserve

namespace sparkserve {
namespace {

// truncated_distribution against a direct transcription of its definition (sort everything,
// intersect the top_k and min_p sets, take the top_p prefix), over random rows that include
// exact ties (quantized logits) and -inf entries, for random parameter combinations.
std::vector<Candidate> reference_truncation(const std::vector<float>& logits, float t, int32_t top_k,
                                            float top_p, float min_p) {
  std::vector<int32_t> ids;
  float mx = -kInf;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > -kInf) {
      ids.push_back(static_cast<int32_t>(i));
      mx = std::max(mx, logits[i] / t);
    }
  if (ids.empty()) return {};
  std::vector<float> s_sorted;
  for (int32_t i : ids) s_sorted.push_back(logits[static_cast<size_t>(i)] / t);
  std::sort(s_sorted.rbegin(), s_sorted.rend());
  float kth = (top_k > 0 && static_cast<size_t>(top_k) < ids.size()) ? s_sorted[static_cast<size_t>(top_k - 1)] : -kInf;
  std::vector<std::pair<double, int32_t>> kept;  // (w, id)
  for (int32_t i : ids) {
    float s = logits[static_cast<size_t>(i)] / t;
    double w = std::exp(static_cast<double>(s) - static_cast<double>(mx));
    if (s >= kth && w >= min_p) kept.push_back({w, i});
  }
  std::sort(kept.begin(), kept.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  double total = 0;
  for (auto& k : kept) total += k.first;
  size_t m = kept.size();
  if (top_p < 1.0f) {
    double cum = 0;
    m = 0;
    while (m < kept.size() && cum < top_p * total) cum += kept[m++].first;
    m = std::max<size_t>(m, 1);
  }
  kept.resize(m);
  total = 0;
  for (auto& k : kept) total += k.first;
  std::vector<Candidate> out;
  for (auto& k : kept) out.push_back({k.second, k.first / total});
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.token < b.token; });
  return out;
}

TEST(Truncation, MatchesDirectDefinitionOnRandomCases) {
  std::mt19937 rng(2024);
  for (int c = 0; c < 400; ++c) {
    size_t n = 1 + rng() % 700;
    auto logits = random_logits(n, 5000 + static_cast<uint32_t>(c), 3.0f);
    if (c % 2) {
      for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;  // many exact ties
    }
    for (size_t i = 0; i < n / 10; ++i) logits[rng() % n] = -kInf;
    float t = std::array<float, 4>{0.3f, 0.7f, 1.0f, 1.8f}[rng() % 4];
    int32_t top_k = std::array<int32_t, 5>{0, 1, 5, 20, 1000}[rng() % 5];
    float top_p = std::array<float, 4>{1.0f, 0.95f, 0.5f, 0.1f}[rng() % 4];
    float min_p = std::array<float, 3>{0.0f, 0.05f, 0.3f}[rng() % 3];
    auto got = truncated_distribution(logits, t, top_k, top_p, min_p);
    auto want = reference_truncation(logits, t, top_k, top_p, min_p);
    ASSERT_EQ(got.size(), want.size()) << "case " << c;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << "case " << c;
      EXPECT_NEAR(got[i].prob, want[i].prob, 1e-12) << "case " << c;
    }
  }
}

TEST(Logprobs, TopListMatchesFullSortWithMaskedEntries) {
  auto logits = random_logits(3000, 77, 2.0f);
  for (float& x : logits) x = std::round(x * 4.0f) / 4.0f;  // ties
  logits[10] = -kInf;
  SamplingParams p;
  p.temperature = 0.0f;
  p.num_logprobs = 20;
  auto r = sample_token(logits, p, {}, {});
  auto lp = log_softmax(logits);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  ASSERT_EQ(r.top.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(r.top[i].token, order[i]);
    EXPECT_NEAR(r.top[i].logprob, lp[static_cast<size_t>(order[i])], 1e-5);
  }
  EXPECT_EQ(r.token, order[0]);
  EXPECT_EQ(r.rank, 1);
}

}  // namespace
}  // namespace sparkserve
