// Speculative decoding (MTP drafts, verify chunks) on the real tiny MoE fixture with its MTP layer
// (CPU backend): outputs with speculation are identical to outputs without it, token for token, for
// greedy and seeded sampling, in batches of mixed draft counts, with the prefix cache and under
// a tool-call constraint. "Identical" is exact on the CPU: a verify chunk runs the GDN layers in the
// decode form over a copy of the state, its attention rows and MoE rows are the same per-row
// arithmetic as single decode steps, and the accepted prefix is folded into the state by the very
// decode ops (a failure prints the first differing position).
//
// The fixture's MTP weights are random, so its own drafts are almost never right; an oracle runner
// replaces them by the true continuation with some deliberately wrong (and, under the constraint,
// forbidden) tokens, so that full acceptance, partial acceptance and first-draft rejection all occur.
#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <cmath>
#include <iterator>
#include <functional>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "loader/model_shapes.h"
#include "loader/synth_checkpoint.h"
#include "loader/synth_weights.h"
#include "model/load.h"
#include "runtime/direct_state.h"
#include "runtime/engine.h"
#include "runtime/sequence.h"
#include "text/tool_call_grammar.h"

namespace sparkserve::test {
namespace {

const std::filesystem::path kTiny = std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests/fixtures/qwen35-moe-tiny";
constexpr int64_t kVocab = 1000;

struct Model {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Qwen35Model> model;
};

// The fixture checkpoint with its MTP layer.
Model& tiny() {
  static Model m = [] {
    Model t;
    LoadOptions o;
    o.load_mtp = true;
    auto loaded = load_qwen35(kTiny, *t.backend, nullptr, o);
    EXPECT_TRUE(loaded.ok()) << loaded.message();
    if (loaded.ok()) t.model = std::move(*loaded);
    return t;
  }();
  return m;
}

// bench --synth's in-memory model ("tiny" shapes) with its MTP layer, NVFP4 experts and FP8 dense
// layers: quantized linears in the MTP layer too.
Model& synth() {
  static Model m = [] {
    Model t;
    auto like = model_like("tiny");
    EXPECT_TRUE(like.ok()) << like.message();
    auto built = build_synth_model(synth_plan(*like, SynthLayout::kNvfp4Fp8Dense), *t.backend, 7, /*with_mtp=*/true);
    EXPECT_TRUE(built.ok()) << built.message();
    if (built.ok()) t.model = std::make_unique<Qwen35Model>(*t.backend, built->config, std::move(built->weights));
    return t;
  }();
  return m;
}

// Drafts from the known continuation of each request (by prompt), every `wrong_every`-th draft
// position replaced by a wrong token (wrong_token(position, true token)).
class OracleRunner final : public ModelRunner {
 public:
  explicit OracleRunner(ModelRunner& inner) : inner_(inner) {}
  std::map<std::vector<int32_t>, std::vector<int32_t>> truth;  // prompt -> prompt + output
  int64_t wrong_every = 4;
  // When set: the drafts of a sequence (given its tokens and how many), instead of `truth`.
  std::function<std::vector<int32_t>(const Sequence&, size_t)> propose;
  std::function<int32_t(int64_t, int32_t)> wrong_token = [](int64_t, int32_t t) { return (t + 1) % kVocab; };

  CacheGeometry geometry() const override { return inner_.geometry(); }
  Expected<StepOutput> execute(const StepPlan& plan) override { return inner_.execute(plan); }
  bool can_speculate() const override { return true; }
  Expected<std::vector<std::vector<int32_t>>> speculate(const StepPlan& plan, const SpecFollowUp& follow) override {
    SS_ASSIGN_OR_RETURN(auto drafts, inner_.speculate(plan, follow));
    for (size_t i = 0; i < follow.drafts.size(); ++i) {
      const Sequence& s = *follow.drafts[i].seq;
      if (propose) {
        drafts[i] = propose(s, drafts[i].size());
        continue;
      }
      auto it = truth.find(s.req->prompt);
      if (it == truth.end()) continue;
      for (size_t j = 0; j < drafts[i].size(); ++j) {
        const auto p = static_cast<int64_t>(s.tokens.size() + j);
        const int32_t t = p < static_cast<int64_t>(it->second.size()) ? it->second[static_cast<size_t>(p)] : 0;
        drafts[i][j] = p % wrong_every == 0 ? wrong_token(p, t) : t;
      }
    }
    return drafts;
  }

 private:
  ModelRunner& inner_;
};

struct Rig {
  ModelState state;
  Qwen35Runner runner;
  OracleRunner oracle;
  Engine engine;
  Rig(int64_t spec, bool use_oracle, bool caching = false, int32_t blocks = 64, Model& m = tiny(), int threads = 1,
      DType gdn_dtype = DType::kF32)
      : state(*m.backend, m.model->config(), limits(spec, blocks, gdn_dtype)),
        runner(*m.model, state),
        oracle(runner),
        engine(use_oracle ? static_cast<ModelRunner&>(oracle) : runner, config(spec, caching, threads)) {}
  static StateLimits limits(int64_t spec, int32_t blocks, DType gdn_dtype) {
    StateLimits l{4, blocks, 16, 8};
    l.mtp = spec > 0;
    l.gdn_state_dtype = gdn_dtype;
    return l;
  }
  static EngineConfig config(int64_t spec, bool caching, int threads) {
    EngineConfig ec;
    ec.max_num_seqs = 4;
    ec.max_num_batched_tokens = 64;
    ec.max_model_len = 4096;
    ec.vocab_size = kVocab;
    ec.enable_prefix_caching = caching;
    ec.snapshot_interval = 32;
    ec.num_speculative_tokens = spec;
    ec.sampling_threads = threads;
    return ec;
  }
};

std::vector<int32_t> prompt_of(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((seed * 131 + i * 37 + i * i) % static_cast<int>(kVocab));
  return p;
}

struct Req {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 24;
  int64_t spec = -1;
  float temperature = 0.0f;
  uint64_t seed = 0;
  bool constrained = false;
};

std::shared_ptr<TokenConstraint> tool_constraint();

std::vector<std::vector<int32_t>> run(Rig& rig, const std::vector<Req>& reqs) {
  std::vector<std::shared_ptr<EngineRequest>> rs;
  for (const Req& q : reqs) {
    auto r = std::make_shared<EngineRequest>();
    r->prompt = q.prompt;
    r->params.temperature = q.temperature;
    r->params.seed = q.seed;
    r->params.max_tokens = q.max_tokens;
    r->params.ignore_eos = true;
    r->num_speculative_tokens = q.spec;
    if (q.constrained) r->constraint = tool_constraint();
    rig.engine.submit(r);
    rs.push_back(r);
  }
  while (rig.engine.step()) {}
  std::vector<std::vector<int32_t>> out;
  for (auto& r : rs) {
    std::vector<int32_t> toks;
    std::string error;
    for (auto& e : r->out.pop_all(std::chrono::milliseconds(0))) {
      if (!e.finished) toks.push_back(e.token);
      if (e.finish_reason == "error") error = e.error;
    }
    EXPECT_EQ(error, "");
    out.push_back(std::move(toks));
  }
  return out;
}

void expect_same(const std::vector<std::vector<int32_t>>& want, const std::vector<std::vector<int32_t>>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].size(), got[i].size()) << "request " << i;
    for (size_t p = 0; p < want[i].size(); ++p)
      ASSERT_EQ(want[i][p], got[i][p]) << "request " << i << " first differs at output position " << p;
  }
}

std::vector<Req> mixed_batch(int64_t max_spec) {
  std::vector<Req> reqs;
  const int lens[] = {5, 19, 33, 48};
  for (int i = 0; i < 4; ++i) {
    Req q;
    q.prompt = prompt_of(lens[i], i + 1);
    q.max_tokens = 20 + 3 * i;
    q.spec = max_spec < 0 ? -1 : i % (max_spec + 1);  // mixed k in one batch: 0, 1, 2, 3
    reqs.push_back(q);
  }
  return reqs;
}

void teach(OracleRunner& o, const std::vector<Req>& reqs, const std::vector<std::vector<int32_t>>& outs) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> all = reqs[i].prompt;
    all.insert(all.end(), outs[i].begin(), outs[i].end());
    o.truth[reqs[i].prompt] = all;
  }
}

TEST(Speculative, GreedyWithTheModelsOwnDraftsEqualsPlain) {
  const std::vector<Req> reqs = mixed_batch(-1);
  Rig plain(0, false);
  const auto want = run(plain, reqs);
  Rig spec(3, false);
  expect_same(want, run(spec, reqs));
  const EngineStats st = spec.engine.stats();
  EXPECT_GT(st.verify_chunks, 0u);
  EXPECT_GE(st.drafts_proposed, st.verify_chunks);
}

TEST(Speculative, GreedyWithOracleDraftsMixedKEqualsPlain) {
  const std::vector<Req> plain_reqs = mixed_batch(-1);
  Rig plain(0, false);
  const auto want = run(plain, plain_reqs);
  for (int64_t wrong_every : {3, 5, 1000}) {
    Rig spec(3, true);
    spec.oracle.wrong_every = wrong_every;
    const std::vector<Req> reqs = mixed_batch(3);
    teach(spec.oracle, reqs, want);
    expect_same(want, run(spec, reqs));
    const EngineStats st = spec.engine.stats();
    std::printf("wrong every %lld: %llu verify chunks, %llu/%llu drafts accepted\n",
                static_cast<long long>(wrong_every), static_cast<unsigned long long>(st.verify_chunks),
                static_cast<unsigned long long>(st.drafts_accepted),
                static_cast<unsigned long long>(st.drafts_proposed));
    EXPECT_GT(st.drafts_accepted, 0u);
    if (wrong_every < 1000) EXPECT_LT(st.drafts_accepted, st.drafts_proposed);
  }
}

// With a bf16 GDN state (--gdn-state-dtype bfloat16) a commit of k accepted tokens rounds the state
// once, where k single decode steps round it k times (backend/ops.h), so outputs need not equal the
// plain run's token for token; the speculative path must still run (drafts accepted and committed,
// every request its tokens, no error). Where the outputs first differ is printed.
TEST(Speculative, Bf16StateRunsWithAcceptedDrafts) {
  const std::vector<Req> plain_reqs = mixed_batch(-1);
  Rig plain(0, false, false, 64, tiny(), 1, DType::kBF16);
  const auto want = run(plain, plain_reqs);
  Rig spec(3, true, false, 64, tiny(), 1, DType::kBF16);
  spec.oracle.wrong_every = 5;
  const std::vector<Req> reqs = mixed_batch(3);
  teach(spec.oracle, reqs, want);
  const auto got = run(spec, reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].size(), want[i].size());
    size_t p = 0;
    while (p < got[i].size() && p < want[i].size() && got[i][p] == want[i][p]) ++p;
    std::printf("request %zu (k = %lld): the same as plain for %zu of %zu tokens\n", i,
                static_cast<long long>(reqs[i].spec), p, want[i].size());
  }
  const EngineStats st = spec.engine.stats();
  EXPECT_GT(st.drafts_accepted, 0u);
}

TEST(Speculative, SyntheticQuantizedModelEqualsPlain) {
  const std::vector<Req> reqs = mixed_batch(-1);
  Rig plain(0, false, false, 64, synth());
  const auto want = run(plain, reqs);
  Rig own(3, false, false, 64, synth());
  expect_same(want, run(own, reqs));
  Rig oracle(3, true, false, 64, synth());
  teach(oracle.oracle, reqs, want);
  expect_same(want, run(oracle, mixed_batch(3)));
  EXPECT_GT(oracle.engine.stats().drafts_accepted, 0u);
}

TEST(Speculative, WithThePrefixCacheEqualsPlain) {
  // The same prompts twice (the second round resumes from snapshots and shared blocks taken while
  // sequences were speculating), then prompts that extend earlier ones' outputs.
  std::vector<Req> reqs = mixed_batch(-1);
  Rig plain(0, false, /*caching=*/true);
  const auto want = run(plain, reqs);
  const auto want2 = run(plain, reqs);
  Rig spec(3, true, /*caching=*/true);
  teach(spec.oracle, reqs, want);
  expect_same(want, run(spec, reqs));
  expect_same(want2, run(spec, reqs));
  EXPECT_GT(spec.engine.stats().prefix_cache.hits, 0u);
  std::vector<Req> longer = reqs;
  for (size_t i = 0; i < longer.size(); ++i) longer[i].prompt.insert(longer[i].prompt.end(), want[i].begin(), want[i].end());
  Rig plain2(0, false, true);
  const auto want3 = run(plain2, longer);
  teach(spec.oracle, longer, want3);
  expect_same(want3, run(spec, longer));
}

TEST(Speculative, UnderBlockPressureEqualsPlain) {
  // Few KV blocks: drafts get fewer blocks than asked, sequences are preempted and resumed.
  const std::vector<Req> reqs = mixed_batch(-1);
  Rig plain(0, false, false, 64);
  const auto want = run(plain, reqs);
  Rig spec(3, true, false, 12);
  teach(spec.oracle, reqs, want);
  expect_same(want, run(spec, reqs));
}

TEST(Speculative, SeededSamplingEqualsPlain) {
  // Sampling at temperature 1: each row draws with the sampler's (seed, step) uniform, so the
  // output for a seed is the plain one token for token. Equal outputs for every seed are equal
  // output distributions; the accept counts show both outcomes of the rule occur.
  std::vector<Req> reqs;
  for (int i = 0; i < 4; ++i) {
    Req q;
    q.prompt = prompt_of(7 + 5 * i, 40 + i);
    q.temperature = 1.0f;
    q.seed = 1000 + static_cast<uint64_t>(i);
    reqs.push_back(q);
  }
  Rig plain(0, false);
  const auto want = run(plain, reqs);
  // Verify rows drawn in parallel (each against the output it would follow) on 4 threads.
  Rig spec(3, true, false, 64, tiny(), 4);
  spec.oracle.wrong_every = 1000;
  teach(spec.oracle, reqs, want);
  expect_same(want, run(spec, reqs));
  EXPECT_GT(spec.engine.stats().drafts_accepted, 0u);
  // The model's own (random) drafts: almost all rejected, same output.
  Rig own(2, false);
  expect_same(want, run(own, reqs));
}

TEST(Speculative, SampledOutputHasTheTargetDistribution) {
  // Distribution test of the sampling path. One prompt, 400 seeds at temperature 0.5, one draft: after
  // the first token t1 the oracle drafts d = argmax p(. | prompt, t1) (p from a separate forward), so
  // the draft is accepted often. The second token must be distributed as p(. | prompt, t1), whatever
  // happened to the draft: a chi-square goodness-of-fit over the rank of t2 under its own p (rank 0 =
  // the draft, i.e. acceptance; then rank ranges), expected counts summed over the seeds' p. 6 degrees
  // of freedom: chi2 > 22.46 happens with probability 0.001 when the output follows p; a wrong
  // acceptance probability or a wrong resampling after a rejection (say, the residual's argmax, or p
  // with d left in) moves mass between these categories by far more.
  const std::vector<int32_t> prompt = prompt_of(9, 77);
  const float temperature = 0.5f;
  Model& m = tiny();
  std::map<int32_t, std::vector<double>> probs;  // t1 -> p(. | prompt, t1) at the temperature
  auto target = [&](int32_t t1) -> const std::vector<double>& {
    auto it = probs.find(t1);
    if (it != probs.end()) return it->second;
    DirectState st(*m.backend, m.model->config(), StateLimits{1, 4, 16, 0});
    auto seq = st.open_sequence();
    EXPECT_TRUE(seq.ok());
    std::vector<SequenceInput> in(1);
    in[0].state = &*seq;
    in[0].tokens = prompt;
    in[0].tokens.push_back(t1);
    auto l = st.forward(*m.model, in);
    EXPECT_TRUE(l.ok()) << l.message();
    const float* row = l->row(0);
    const float top = *std::max_element(row, row + kVocab);
    std::vector<double> p(static_cast<size_t>(kVocab));
    double z = 0;
    for (int64_t v = 0; v < kVocab; ++v) z += p[static_cast<size_t>(v)] = std::exp((static_cast<double>(row[v]) - top) / temperature);
    for (double& x : p) x /= z;
    return probs[t1] = std::move(p);
  };
  auto draft_of = [&](int32_t t1) {
    const auto& p = target(t1);
    return static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
  };
  Rig spec(1, true);
  spec.oracle.propose = [&](const Sequence& s, size_t k) { return std::vector<int32_t>(k, draft_of(s.tokens.back())); };
  std::vector<Req> reqs;
  for (int i = 0; i < 400; ++i) {
    Req q;
    q.prompt = prompt;
    q.temperature = temperature;
    q.seed = 5000 + static_cast<uint64_t>(i);
    q.max_tokens = 3;  // one draft after the first token (drafts never reach past max_tokens)
    reqs.push_back(q);
  }
  const auto outs = run(spec, reqs);
  // Categories by the rank of the second token under its own p: rank 0 is the draft (p's argmax),
  // then ranks 1-2, 3-9, 10-29, 30-99, 100-299, 300 and above.
  const int64_t bounds[] = {1, 3, 10, 30, 100, 300, kVocab};
  const size_t K = std::size(bounds);
  std::vector<double> expected(K, 0.0), observed(K, 0.0);
  int accepted = 0;
  for (const auto& o : outs) {
    ASSERT_EQ(o.size(), 3u);
    const auto& p = target(o[0]);
    std::vector<int32_t> order(static_cast<size_t>(kVocab));
    for (int32_t v = 0; v < kVocab; ++v) order[static_cast<size_t>(v)] = v;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
    size_t cat = 0;
    for (int64_t r = 0; r < kVocab; ++r) {
      while (r >= bounds[cat]) ++cat;
      const int32_t v = order[static_cast<size_t>(r)];
      expected[cat] += p[static_cast<size_t>(v)];
      if (v == o[1]) observed[cat] += 1;
    }
    accepted += o[1] == draft_of(o[0]);
  }
  double chi2 = 0;
  for (size_t i = 0; i < K; ++i) {
    EXPECT_GE(expected[i], 5.0) << "category " << i << ": too little mass for the chi-square approximation";
    chi2 += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    std::printf("category %zu: observed %.0f expected %.1f\n", i, observed[i], expected[i]);
  }
  std::printf("chi2 = %.2f (6 dof), %d of 400 drafts accepted\n", chi2, accepted);
  EXPECT_LT(chi2, 22.46);
  EXPECT_EQ(spec.engine.stats().drafts_accepted, static_cast<uint64_t>(accepted));
  EXPECT_EQ(spec.engine.stats().drafts_proposed, 400u);
}

// A tool-call constraint over a synthetic byte vocabulary: token i spells one printable ASCII
// character (i % 95 + 32), token 999 a newline; every 7th token is special (never allowed).
std::shared_ptr<TokenConstraint> tool_constraint() {
  static const std::shared_ptr<const VocabTexts> vocab = [] {
    std::vector<std::string> bytes;
    std::vector<bool> special;
    for (int64_t i = 0; i < kVocab; ++i) {
      bytes.push_back(i == kVocab - 1 ? std::string("\n") : std::string(1, static_cast<char>(32 + i % 95)));
      special.push_back(i % 7 == 3);
    }
    return VocabTexts::build(static_cast<size_t>(kVocab), bytes, special);
  }();
  ToolCallGrammarOptions o;
  o.thinking = false;
  auto g = ToolCallGrammar::build(OrderedJson::parse(R"([{"type":"function","function":{"name":"get_weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])"), o);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::make_shared<ToolCallConstraint>(std::move(*g), vocab, std::vector<int32_t>{});
}

TEST(Speculative, ToolConstraintEqualsPlainAndRejectsForbiddenDrafts) {
  std::vector<Req> reqs = mixed_batch(-1);
  for (auto& q : reqs) {
    q.constrained = true;
    q.max_tokens = 40;
  }
  Rig plain(0, false);
  const auto want = run(plain, reqs);
  Rig spec(3, true);
  spec.oracle.wrong_every = 3;
  spec.oracle.wrong_token = [](int64_t, int32_t) { return static_cast<int32_t>(3); };  // special: forbidden
  teach(spec.oracle, reqs, want);
  expect_same(want, run(spec, reqs));
  const EngineStats st = spec.engine.stats();
  EXPECT_GT(st.drafts_accepted, 0u);
  EXPECT_LT(st.drafts_accepted, st.drafts_proposed);
}

}  // namespace
}  // namespace sparkserve::test
