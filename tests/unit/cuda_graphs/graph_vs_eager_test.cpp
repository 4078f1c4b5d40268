// Recorded decode steps (CUDA graphs, Qwen35Model::forward) against running the same ops one by
// one, on the fixture models: the logits must be BITWISE equal (bound 0, not a tolerance: a replay
// runs the same kernels with the same arguments on the same data, so any difference is a bug such
// as a stale input, a wrong fixed layout or a buffer shared between replays). Covers batch sizes
// 1, 3 and 8, re-recording when sequences outgrow the recorded block tables, sequences finishing,
// being preempted and re-admitted between steps, a new DirectState, the engine with preemption,
// speculative verify steps and their GDN commits, and the opt-out (set_graphs_enabled(false), bench --no-graphs). Skipped where the build or machine has no CUDA device;
// the CPU-backend checks run everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "backend/backend_factory.h"
#include "model/load.h"
#include "runtime/engine.h"
#include "runtime/direct_state.h"
#include "runtime/sequence.h"

namespace sparkserve::test {
namespace {

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

// A CUDA backend, or null with the reason in *why.
std::unique_ptr<Backend> cuda_backend(std::string* why) {
  auto b = make_backend("cuda", 1);
  if (!b.ok()) {
    *why = b.message();
    return nullptr;
  }
  return std::move(*b);
}

// The same model loaded twice: `eager` runs op by op, `graph` replays recorded decode steps.
struct Pair {
  std::unique_ptr<Qwen35Model> eager, graph;
};
Pair load_pair(Backend& be, const std::string& name) {
  Pair p;
  auto e = load_qwen35(fixture(name), be);
  auto g = load_qwen35(fixture(name), be);
  EXPECT_TRUE(e.ok() && g.ok()) << name;
  if (!e.ok() || !g.ok()) return p;
  p.eager = std::move(*e);
  p.graph = std::move(*g);
  p.eager->set_graphs_enabled(false);
  p.graph->set_graphs_enabled(true);
  return p;
}

bool bitwise_equal(const Logits& a, const Logits& b) {
  return a.rows == b.rows && a.vocab == b.vocab && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

int32_t argmax_row(const Logits& l, int64_t r) {
  const float* row = l.row(r);
  return static_cast<int32_t>(std::max_element(row, row + l.vocab) - row);
}

// Sequences mirrored in two states, one per model; every step runs the same batch through both.
class Mirror {
 public:
  Mirror(Pair& p, const StateLimits& lim)
      : p_(p), se_(p.eager->backend(), p.eager->config(), lim), sg_(p.graph->backend(), p.graph->config(), lim) {}

  // Opens a sequence in both states; returns its index.
  int open() {
    auto a = se_.open_sequence();
    auto b = sg_.open_sequence();
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->gdn_slot, b->gdn_slot);
    seqs_.push_back({*a, *b, {}, true});
    return static_cast<int>(seqs_.size()) - 1;
  }
  void close(int i) {
    se_.close_sequence(seqs_[i].e);
    sg_.close_sequence(seqs_[i].g);
    seqs_[i].open = false;
  }
  // One forward of (sequence, new tokens) pairs through both models; false (with a gtest failure)
  // when the two differ in any bit.
  bool step(const std::vector<std::pair<int, std::vector<int32_t>>>& work, Logits* out, const std::string& what) {
    std::vector<SequenceInput> be, bg;
    for (const auto& [i, toks] : work) {
      be.push_back({&seqs_[i].e, toks, false});
      bg.push_back({&seqs_[i].g, toks, false});
    }
    auto le = se_.forward(*p_.eager, be);
    auto lg = sg_.forward(*p_.graph, bg);
    EXPECT_TRUE(le.ok()) << what << ": " << le.message();
    EXPECT_TRUE(lg.ok()) << what << ": " << lg.message();
    if (!le.ok() || !lg.ok()) return false;
    const bool same = bitwise_equal(*le, *lg);
    EXPECT_TRUE(same) << what << ": recorded decode differs from op by op";
    for (const auto& [i, toks] : work) {
      EXPECT_EQ(seqs_[i].e.num_tokens, seqs_[i].g.num_tokens);
      EXPECT_EQ(seqs_[i].e.block_table.size(), seqs_[i].g.block_table.size());
    }
    *out = std::move(*le);
    return same;
  }
  int64_t num_tokens(int i) const { return seqs_[i].e.num_tokens; }

  // A speculative step through both models: work items with drafts (k > 0) are verify spans whose
  // first accepted[j] tokens are then committed (the GDN commit, recorded too after a recorded
  // verify); k == 0 items are plain decode spans. Logits and the captured hidden rows must be equal
  // in every bit; the committed states are compared by the later steps' logits.
  bool spec_step(const std::vector<std::pair<int, std::vector<int32_t>>>& work, const std::vector<int64_t>& accepted,
                 Logits* out, const std::string& what) {
    std::vector<SequenceInput> be, bg;
    for (const auto& [i, toks] : work) {
      be.push_back({&seqs_[i].e, toks, false});
      bg.push_back({&seqs_[i].g, toks, false});
      be.back().speculative = bg.back().speculative = toks.size() > 1;
    }
    SpecCapture ce, cg;
    auto le = se_.forward(*p_.eager, be, &ce);
    auto lg = sg_.forward(*p_.graph, bg, &cg);
    EXPECT_TRUE(le.ok()) << what << ": " << le.message();
    EXPECT_TRUE(lg.ok()) << what << ": " << lg.message();
    if (!le.ok() || !lg.ok()) return false;
    bool same = bitwise_equal(*le, *lg);
    EXPECT_TRUE(same) << what << ": recorded verify step differs from op by op (logits)";
    std::vector<float> he(static_cast<size_t>(ce.hidden.numel())), hg(static_cast<size_t>(cg.hidden.numel()));
    p_.eager->backend().download(he.data(), ce.hidden);
    p_.graph->backend().download(hg.data(), cg.hidden);
    const bool same_hidden = he.size() == hg.size() && std::memcmp(he.data(), hg.data(), he.size() * 4) == 0;
    EXPECT_TRUE(same_hidden) << what << ": recorded verify step differs from op by op (hidden rows)";
    std::vector<int64_t> acc;
    for (size_t j = 0; j < work.size(); ++j) acc.push_back(work[j].second.size() > 1 ? accepted[j] : 0);
    EXPECT_TRUE(p_.eager->commit_speculative(ce, acc, se_.state().pools()).ok()) << what;
    EXPECT_TRUE(p_.graph->commit_speculative(cg, acc, sg_.state().pools()).ok()) << what;
    for (size_t j = 0; j < work.size(); ++j) {
      if (work[j].second.size() == 1) continue;
      seqs_[work[j].first].e.num_tokens += accepted[j];
      seqs_[work[j].first].g.num_tokens += accepted[j];
    }
    *out = std::move(*le);
    return same && same_hidden;
  }

 private:
  struct Seq {
    SequenceState e, g;
    std::vector<int32_t> unused;
    bool open;
  };
  Pair& p_;
  DirectState se_, sg_;
  std::vector<Seq> seqs_;
};

std::vector<int32_t> random_ids(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

class GraphVsEager : public ::testing::TestWithParam<std::string> {};

// B sequences with prompts of different lengths, then 20 greedy decode steps: step 1 of each batch
// size runs op by op (first sight), steps 2-20 replay the recording made at step 2.
TEST_P(GraphVsEager, DecodeBitwiseEqualAtBatch1_3_8) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, GetParam());
  ASSERT_TRUE(p.eager && p.graph);
  const int vocab = static_cast<int>(p.eager->config().vocab_size);
  std::mt19937 rng(1234);
  int64_t want_recorded = 0, want_replayed = 0;
  for (int B : {1, 3, 8}) {
    Mirror m(p, StateLimits{8, 64, 16});
    std::vector<std::pair<int, std::vector<int32_t>>> work;
    for (int i = 0; i < B; ++i) work.push_back({m.open(), random_ids(rng, 5 + 3 * i, vocab)});
    Logits l;
    ASSERT_TRUE(m.step(work, &l, "prefill B=" + std::to_string(B)));
    for (int s = 0; s < 20; ++s) {
      for (int i = 0; i < B; ++i) work[i].second = {argmax_row(l, i)};
      ASSERT_TRUE(m.step(work, &l, "B=" + std::to_string(B) + " step " + std::to_string(s)));
    }
    want_recorded += 1;
    want_replayed += 19;
  }
  EXPECT_EQ(p.graph->graph_stats().recorded, want_recorded);
  EXPECT_EQ(p.graph->graph_stats().replayed, want_replayed);
  EXPECT_EQ(p.eager->graph_stats().replayed, 0);
  std::printf("%s: %lld recordings, %.2f ms recording in all\n", GetParam().c_str(),
              static_cast<long long>(p.graph->graph_stats().recorded), p.graph->graph_stats().record_ms);
}

// Speculative verify steps (B sequences x (k + 1) rows, alone and mixed with plain decode spans and
// other k) and their GDN commits, recorded vs op by op, with random accepted prefixes: every step's
// logits and hidden rows bitwise equal (the later steps check the committed states).
TEST_P(GraphVsEager, SpeculativeVerifyAndCommitBitwiseEqual) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, GetParam());
  ASSERT_TRUE(p.eager && p.graph);
  const int vocab = static_cast<int>(p.eager->config().vocab_size);
  std::mt19937 rng(4321);
  // Drafts per sequence (0: a plain decode span).
  for (const std::vector<int>& ks : std::vector<std::vector<int>>{{2}, {3, 3, 3}, {2, 0, 3, 1}}) {
    const std::string tag = "k=" + std::to_string(ks[0]) + " B=" + std::to_string(ks.size());
    Mirror m(p, StateLimits{8, 64, 16});
    std::vector<std::pair<int, std::vector<int32_t>>> work;
    for (size_t i = 0; i < ks.size(); ++i) work.push_back({m.open(), random_ids(rng, 6 + 4 * static_cast<int>(i), vocab)});
    Logits l;
    ASSERT_TRUE(m.step(work, &l, "prefill " + tag));
    std::vector<int32_t> next;
    for (size_t i = 0; i < ks.size(); ++i) next.push_back(argmax_row(l, static_cast<int64_t>(i)));
    for (int s = 0; s < 8; ++s) {
      std::vector<int64_t> accepted;
      for (size_t i = 0; i < ks.size(); ++i) {
        work[i].second = {next[i]};
        for (int32_t d : random_ids(rng, ks[i], vocab)) work[i].second.push_back(d);
        accepted.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(ks[i] + 1)));
      }
      ASSERT_TRUE(m.spec_step(work, accepted, &l, tag + " step " + std::to_string(s)));
      int64_t row = 0;
      for (size_t i = 0; i < ks.size(); ++i) {
        const int64_t n = static_cast<int64_t>(work[i].second.size());
        next[i] = argmax_row(l, row + (n > 1 ? accepted[i] - 1 : 0));
        row += n;
      }
    }
  }
  // Per configuration: its step shape and its commit recorded once, replayed from the third step on.
  EXPECT_EQ(p.graph->graph_stats().recorded, 6);
  EXPECT_EQ(p.graph->graph_stats().replayed, 3 * (7 + 6));
  EXPECT_EQ(p.eager->graph_stats().replayed, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GraphVsEager,
                         ::testing::Values("qwen35-moe-tiny", "qwen35-dense-tiny", "qwen35-quant-nvfp4",
                                           "qwen35-quant-nvfp4-fp8dense", "qwen35-quant-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Block size 1: the block tables grow every step, past the recorded room of 16, 32 and 64 blocks.
TEST(GraphVsEagerGrowth, RecordsAgainWhenBlockTablesOutgrowTheRecording) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, "qwen35-moe-tiny");
  ASSERT_TRUE(p.eager && p.graph);
  Mirror m(p, StateLimits{2, 256, 1});
  std::mt19937 rng(7);
  std::vector<std::pair<int, std::vector<int32_t>>> work = {{m.open(), random_ids(rng, 4, 1000)},
                                                            {m.open(), random_ids(rng, 9, 1000)}};
  Logits l;
  ASSERT_TRUE(m.step(work, &l, "prefill"));
  for (int s = 0; s < 70; ++s) {
    for (int i = 0; i < 2; ++i) work[i].second = {argmax_row(l, i)};
    ASSERT_TRUE(m.step(work, &l, "step " + std::to_string(s)));
  }
  // Longest sequence: 9 + 70 = 79 blocks. Recorded at step 2 (room 16), then at 17, 33 and 65
  // blocks (room 32, 64, 128).
  EXPECT_EQ(m.num_tokens(1), 79);
  EXPECT_EQ(p.graph->graph_stats().recorded, 4);
  EXPECT_EQ(p.graph->graph_stats().replayed, 69);
}

// Engine-like churn: sequences join (their prefill runs op by op in a mixed batch), finish, and
// are preempted and later recomputed from their whole history; the decode-only steps in between
// replay recordings of whatever batch size is left, with the spans in changing order.
TEST(GraphVsEagerChurn, FinishedPreemptedAndNewSequencesBetweenSteps) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, "qwen35-moe-tiny");
  ASSERT_TRUE(p.eager && p.graph);
  Mirror m(p, StateLimits{8, 256, 4});
  std::mt19937 rng(99);
  struct Live {
    int idx;
    std::vector<int32_t> history;  // every token fed so far
    int32_t next;                  // greedy token to feed next
  };
  std::vector<Live> live;
  std::vector<std::vector<int32_t>> preempted;  // histories waiting to be recomputed
  int decode_only_steps = 0;
  for (int step = 0; step < 120; ++step) {
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<std::pair<int, std::vector<int32_t>>> work;
    // Finish or preempt one sometimes.
    if (!live.empty() && u(rng) < 0.12) {
      const size_t k = rng() % live.size();
      if (u(rng) < 0.5) preempted.push_back(live[k].history);
      m.close(live[k].idx);
      live.erase(live.begin() + static_cast<long>(k));
    }
    // Admit: a recomputed preempted sequence or a fresh prompt, while slots last.
    if (live.size() < 7 && (live.empty() || u(rng) < 0.15)) {
      std::vector<int32_t> prompt;
      if (!preempted.empty() && u(rng) < 0.6) {
        prompt = preempted.back();
        preempted.pop_back();
      } else {
        prompt = random_ids(rng, 2 + static_cast<int>(rng() % 14), 1000);
      }
      live.push_back({m.open(), prompt, -1});
    }
    std::shuffle(live.begin(), live.end(), rng);
    for (auto& s : live) {
      const bool fresh = s.next < 0;
      work.push_back({s.idx, fresh ? s.history : std::vector<int32_t>{s.next}});
    }
    bool decode_only = true;
    for (auto& w : work) decode_only = decode_only && w.second.size() == 1;
    decode_only_steps += decode_only;
    Logits l;
    ASSERT_TRUE(m.step(work, &l, "churn step " + std::to_string(step)));
    for (size_t i = 0; i < live.size(); ++i) {
      if (live[i].next >= 0) live[i].history.push_back(live[i].next);
      live[i].next = argmax_row(l, static_cast<int64_t>(i));
    }
  }
  EXPECT_GT(decode_only_steps, 40);
  EXPECT_GT(p.graph->graph_stats().replayed, 20);
  EXPECT_GE(p.graph->graph_stats().recorded, 3);  // several batch sizes
}

// A new DirectState (other pools) must not replay recordings that write the old one's pools.
TEST(GraphVsEagerState, NewStatePoolsRecordAgain) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, "qwen35-moe-tiny");
  ASSERT_TRUE(p.eager && p.graph);
  std::mt19937 rng(5);
  // Keep the first states alive so the second ones cannot reuse their addresses.
  Mirror m1(p, StateLimits{2, 32, 16});
  Mirror m2(p, StateLimits{2, 32, 16});
  for (Mirror* m : {&m1, &m2, &m1}) {
    std::vector<std::pair<int, std::vector<int32_t>>> work = {{m->open(), random_ids(rng, 6, 1000)},
                                                              {m->open(), random_ids(rng, 3, 1000)}};
    Logits l;
    ASSERT_TRUE(m->step(work, &l, "prefill"));
    for (int s = 0; s < 5; ++s) {
      for (int i = 0; i < 2; ++i) work[i].second = {argmax_row(l, i)};
      ASSERT_TRUE(m->step(work, &l, "step " + std::to_string(s)));
    }
    for (auto& w : work) m->close(w.first);
  }
  EXPECT_EQ(p.graph->graph_stats().recorded, 3);
  EXPECT_EQ(p.graph->graph_stats().replayed, 12);
}

// The engine end to end, with a KV pool small enough to preempt: greedy outputs identical.
TEST(GraphVsEagerEngine, GreedyOutputsEqualWithPreemption) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  Pair p = load_pair(*be, "qwen35-moe-tiny");
  ASSERT_TRUE(p.eager && p.graph);
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_ids(rng, 5 + 4 * i, 1000));
  auto run = [&](Qwen35Model& model, uint64_t* preemptions) {
    ModelState state(*be, model.config(), StateLimits{6, 14, 8});
    Qwen35Runner runner(model, state);
    EngineConfig ec;
    ec.max_num_batched_tokens = 64;
    ec.vocab_size = model.config().vocab_size;
    Engine engine(runner, ec);
    std::vector<std::shared_ptr<EngineRequest>> rs;
    for (const auto& pr : prompts) {
      auto r = std::make_shared<EngineRequest>();
      r->prompt = pr;
      r->params.temperature = 0.0f;
      r->params.max_tokens = 24;
      r->params.ignore_eos = true;
      rs.push_back(r);
      engine.submit(r);
    }
    while (engine.step()) {}
    *preemptions = engine.stats().preemptions;
    std::vector<std::vector<int32_t>> outs;
    for (auto& r : rs) {
      std::vector<int32_t> toks;
      for (auto& e : r->out.pop_all(std::chrono::milliseconds(0)))
        if (!e.finished) toks.push_back(e.token);
      outs.push_back(toks);
    }
    return outs;
  };
  uint64_t pe = 0, pg = 0;
  auto eager = run(*p.eager, &pe);
  auto graph = run(*p.graph, &pg);
  EXPECT_GT(pe, 0u) << "the pool was meant to force preemption";
  EXPECT_EQ(pe, pg);
  EXPECT_EQ(eager, graph);
  for (auto& o : eager) EXPECT_EQ(o.size(), 24u);
  EXPECT_GT(p.graph->graph_stats().replayed, 10);
}

// Drafts from the known greedy continuation of each request, every third one wrong, so that full,
// partial and no acceptance all occur (the fixture's random MTP layer still runs and records its
// passes; only its proposals are replaced).
class OracleRunner final : public ModelRunner {
 public:
  OracleRunner(ModelRunner& inner, const std::map<std::vector<int32_t>, std::vector<int32_t>>& truth)
      : inner_(inner), truth_(truth) {}
  CacheGeometry geometry() const override { return inner_.geometry(); }
  Expected<StepOutput> execute(const StepPlan& plan) override { return inner_.execute(plan); }
  bool can_speculate() const override { return inner_.can_speculate(); }
  Expected<std::vector<std::vector<int32_t>>> speculate(const StepPlan& plan, const SpecFollowUp& follow) override {
    SS_ASSIGN_OR_RETURN(auto drafts, inner_.speculate(plan, follow));
    for (size_t i = 0; i < follow.drafts.size(); ++i) {
      const Sequence& s = *follow.drafts[i].seq;
      const std::vector<int32_t>& t = truth_.at(s.req->prompt);
      for (size_t j = 0; j < drafts[i].size(); ++j) {
        const size_t p = s.tokens.size() + j;
        const int32_t want = p < t.size() ? t[p] : 0;
        drafts[i][j] = p % 3 == 0 ? (want + 1) % 1000 : want;
      }
    }
    return drafts;
  }

 private:
  ModelRunner& inner_;
  const std::map<std::vector<int32_t>, std::vector<int32_t>>& truth_;
};

// The engine with speculative decoding (k = 2, oracle drafts) on a model that records its verify
// steps, GDN commits and MTP passes vs one running every op one by one: the same outputs, token for
// token (the recordings run the same kernels on the same data).
TEST(GraphVsEagerEngine, SpeculativeGreedyOutputsEqual) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  LoadOptions o;
  o.load_mtp = true;
  auto e = load_qwen35(fixture("qwen35-moe-tiny"), *be, nullptr, o);
  auto g = load_qwen35(fixture("qwen35-moe-tiny"), *be, nullptr, o);
  ASSERT_TRUE(e.ok() && g.ok());
  (*e)->set_graphs_enabled(false);
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_ids(rng, 6 + 5 * i, 1000));
  std::map<std::vector<int32_t>, std::vector<int32_t>> truth;
  auto run = [&](Qwen35Model& model, int64_t spec) {
    StateLimits lim{4, 64, 16};
    lim.mtp = spec > 0;
    ModelState state(*be, model.config(), lim);
    Qwen35Runner runner(model, state);
    OracleRunner oracle(runner, truth);
    EngineConfig ec;
    ec.max_num_batched_tokens = 64;
    ec.vocab_size = model.config().vocab_size;
    ec.num_speculative_tokens = spec;
    Engine engine(spec > 0 ? static_cast<ModelRunner&>(oracle) : runner, ec);
    std::vector<std::shared_ptr<EngineRequest>> rs;
    for (const auto& pr : prompts) {
      auto r = std::make_shared<EngineRequest>();
      r->prompt = pr;
      r->params.temperature = 0.0f;
      r->params.max_tokens = 20;
      r->params.ignore_eos = true;
      rs.push_back(r);
      engine.submit(r);
    }
    while (engine.step()) {}
    std::vector<std::vector<int32_t>> outs;
    for (auto& r : rs) {
      std::vector<int32_t> toks;
      for (auto& ev : r->out.pop_all(std::chrono::milliseconds(0)))
        if (!ev.finished) toks.push_back(ev.token);
      outs.push_back(toks);
    }
    return outs;
  };
  const auto plain = run(**e, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    truth[prompts[i]] = prompts[i];
    truth[prompts[i]].insert(truth[prompts[i]].end(), plain[i].begin(), plain[i].end());
  }
  const auto eager = run(**e, 2);
  const auto graph = run(**g, 2);
  EXPECT_EQ(eager, graph);
  for (auto& out : graph) EXPECT_EQ(out.size(), 20u);
  EXPECT_GT((*g)->graph_stats().replayed, 10);
  EXPECT_EQ((*e)->graph_stats().replayed, 0);
  // Not asserted (CUDA verify rows are other kernels than decode rows, equal within tensor-core
  // rounding): whether speculation changed any greedy token here.
  std::printf("speculative == plain greedy outputs: %s\n", eager == plain ? "yes" : "no");
}

// set_graphs_enabled(false) turns recording off; on the CPU backend nothing is ever recorded and
// results do not depend on the setting. Runs without a GPU.
TEST(GraphOptOut, SetterAndCpuBackend) {  // runs without a GPU
  auto cpu = make_backend("cpu", 1);
  ASSERT_TRUE(cpu.ok());
  auto off = load_qwen35(fixture("qwen35-moe-tiny"), **cpu);
  auto on = load_qwen35(fixture("qwen35-moe-tiny"), **cpu);
  ASSERT_TRUE(off.ok() && on.ok());
  (*off)->set_graphs_enabled(false);
  EXPECT_FALSE((*off)->graphs_enabled());
  EXPECT_TRUE((*on)->graphs_enabled());
  Pair p;
  p.eager = std::move(*off);
  p.graph = std::move(*on);
  Mirror m(p, StateLimits{2, 32, 16});
  std::mt19937 rng(11);
  std::vector<std::pair<int, std::vector<int32_t>>> work = {{m.open(), random_ids(rng, 4, 1000)}};
  Logits l;
  ASSERT_TRUE(m.step(work, &l, "prefill"));
  for (int s = 0; s < 4; ++s) {
    work[0].second = {argmax_row(l, 0)};
    ASSERT_TRUE(m.step(work, &l, "step"));
  }
  EXPECT_EQ(p.graph->graph_stats().recorded, 0);
  EXPECT_EQ(p.graph->graph_stats().replayed, 0);
}

TEST(GraphOptOut, SetterOnCuda) {
  std::string why;
  auto be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << why;
  auto cuda_off = load_qwen35(fixture("qwen35-moe-tiny"), *be);
  ASSERT_TRUE(cuda_off.ok());
  (*cuda_off)->set_graphs_enabled(false);
  EXPECT_FALSE((*cuda_off)->graphs_enabled());
  DirectState st(*be, (*cuda_off)->config(), StateLimits{1, 32, 16});
  auto seq = st.open_sequence();
  ASSERT_TRUE(seq.ok());
  for (int s = 0; s < 4; ++s) {
    std::vector<SequenceInput> b = {{&*seq, {static_cast<int32_t>(s + 1)}, false}};
    ASSERT_TRUE(st.forward(**cuda_off, b).ok());
  }
  EXPECT_EQ((*cuda_off)->graph_stats().replayed, 0);
}

// Backend::run_branches: a CUDA backend forks independent ops (routed vs shared expert, the
// projections of one input) onto side streams; after set_concurrent_branches(false) it runs them in
// order on one stream. Same kernels on the same data: the logits must be bitwise equal, for the
// prefill (op by op) and for recorded decode steps (the fork / join become graph edges), for every
// fixture layout; a race between branches (a shared buffer, a missing join) shows up as a difference
// or as stale values.
class BranchesConcurrentVsInOrder : public ::testing::TestWithParam<std::string> {};

TEST_P(BranchesConcurrentVsInOrder, LogitsBitwiseEqual) {
  std::string why;
  auto conc = cuda_backend(&why);
  if (!conc) GTEST_SKIP() << why;
  auto in_order = cuda_backend(&why);
  ASSERT_TRUE(in_order) << why;
  in_order->set_concurrent_branches(false);
  auto a = load_qwen35(fixture(GetParam()), *in_order);
  auto b = load_qwen35(fixture(GetParam()), *conc);
  ASSERT_TRUE(a.ok() && b.ok());
  Pair p;
  p.eager = std::move(*a);  // "eager" here: the in-order backend (graphs on in both)
  p.graph = std::move(*b);
  const int vocab = static_cast<int>(p.eager->config().vocab_size);
  std::mt19937 rng(99);
  for (int B : {1, 4}) {
    Mirror m(p, StateLimits{8, 64, 16});
    std::vector<std::pair<int, std::vector<int32_t>>> work;
    for (int i = 0; i < B; ++i) work.push_back({m.open(), random_ids(rng, 7 + 5 * i, vocab)});
    Logits l;
    ASSERT_TRUE(m.step(work, &l, "prefill B=" + std::to_string(B)));
    for (int s = 0; s < 12; ++s) {
      for (int i = 0; i < B; ++i) work[i].second = {argmax_row(l, i)};
      ASSERT_TRUE(m.step(work, &l, "B=" + std::to_string(B) + " step " + std::to_string(s)));
    }
  }
  EXPECT_GT(p.graph->graph_stats().replayed, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BranchesConcurrentVsInOrder,
                         ::testing::Values("qwen35-moe-tiny", "qwen35-quant-nvfp4", "qwen35-quant-nvfp4-fp8dense",
                                           "qwen35-quant-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace sparkserve::test
