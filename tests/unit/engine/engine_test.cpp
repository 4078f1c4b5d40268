// The engine's scheduler, driven step by step: token budget and chunked prefill, decodes first,
// the sequence cap, preemption when KV blocks run out (outputs unchanged, nothing lost),
// cancellation freeing everything at once, refusal of a request larger than the pool, the
// threaded loop, and greedy batch invariance through the engine on the tiny real model.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "loader/hf_config.h"
#include "model/load.h"
#include "runtime/engine.h"
#include "runtime/warm_up.h"
#include "fake_runner.h"

namespace sparkserve::test {
namespace {

const std::filesystem::path kTiny = std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests/fixtures/qwen35-moe-tiny";

struct Rig {
  FakeRunner runner;
  std::unique_ptr<Engine> engine;
  Rig(int32_t slots, int32_t blocks, int64_t block_size, int64_t budget, int32_t max_seqs = 64,
      int sampling_threads = 1)
      : runner(CacheGeometry{blocks, block_size, slots, 0}) {
    EngineConfig ec;
    ec.sampling_threads = sampling_threads;
    ec.max_num_seqs = max_seqs;
    ec.max_num_batched_tokens = budget;
    ec.max_model_len = 4096;
    ec.vocab_size = kFakeVocab;
    engine = std::make_unique<Engine>(runner, ec);
  }
  void run_all(int max_steps = 10000) {
    for (int i = 0; i < max_steps && engine->step(); ++i) {}
  }
  int32_t free_blocks() const { return engine->stats().free_blocks; }
  int32_t free_slots() const { return engine->stats().free_slots; }
};

std::shared_ptr<EngineRequest> greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  auto r = std::make_shared<EngineRequest>();
  r->prompt = std::move(prompt);
  r->params.temperature = 0.0f;
  r->params.max_tokens = max_tokens;
  return r;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  int finishes = 0;
};
Collected collect(EngineRequest& r) {
  Collected c;
  for (auto& e : r.out.pop_all(std::chrono::milliseconds(0))) {
    if (e.finished) {
      c.finish_reason = e.finish_reason;
      ++c.finishes;
    } else {
      c.tokens.push_back(e.token);
    }
  }
  return c;
}

std::vector<int32_t> expected_fake(int32_t last, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(last = static_cast<int32_t>((last + 1) % kFakeVocab));
  return out;
}

std::vector<int32_t> iota_prompt(int n, int32_t start = 0) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((start + i) % kFakeVocab));
  return p;
}

TEST(Engine, ChunkedPrefillStaysUnderTheTokenBudget) {
  Rig rig(4, 64, 4, /*budget=*/8);
  auto r = greedy_request(iota_prompt(20), 3);
  rig.engine->submit(r);
  rig.run_all();
  // 20 prompt tokens in chunks of 8, 8, 4 (the last one samples), then 2 decodes.
  std::vector<std::vector<int64_t>> want = {{8}, {8}, {4}, {1}, {1}};
  EXPECT_EQ(rig.runner.batches, want);
  Collected c = collect(*r);
  EXPECT_EQ(c.tokens, expected_fake(19, 3));
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.finishes, 1);
}

TEST(Engine, DecodesComeFirstThenPrefillChunks) {
  Rig rig(4, 64, 4, /*budget=*/6);
  auto a = greedy_request(iota_prompt(3), 6);
  rig.engine->submit(a);
  rig.engine->step();  // a's prefill (3 tokens)
  auto b = greedy_request(iota_prompt(12, 7), 2);
  rig.engine->submit(b);
  rig.run_all();
  // Every step after the first: a's decode (1) first, then b's chunk in the 5 tokens left.
  ASSERT_GE(rig.runner.batches.size(), 4u);
  EXPECT_EQ(rig.runner.batches[1], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(rig.runner.batches[2], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(rig.runner.batches[3], (std::vector<int64_t>{1, 2}));
  for (const auto& b2 : rig.runner.batches) {
    int64_t sum = 0;
    for (auto n : b2) sum += n;
    EXPECT_LE(sum, 6);
  }
  EXPECT_EQ(collect(*a).tokens, expected_fake(2, 6));
  EXPECT_EQ(collect(*b).tokens, expected_fake(18 % kFakeVocab, 2));
}

TEST(Engine, SequenceCapAndSlotsLimitAdmission) {
  Rig rig(/*slots=*/2, 64, 4, 64, /*max_seqs=*/2);
  std::vector<std::shared_ptr<EngineRequest>> rs;
  for (int i = 0; i < 5; ++i) {
    rs.push_back(greedy_request(iota_prompt(4, i), 4));
    rig.engine->submit(rs.back());
  }
  rig.run_all();
  for (const auto& b : rig.runner.batches) EXPECT_LE(b.size(), 2u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(collect(*rs[i]).tokens, expected_fake((i + 3) % kFakeVocab, 4)) << i;
  EXPECT_EQ(rig.free_slots(), 2);
  EXPECT_EQ(rig.free_blocks(), 64);
}

TEST(Engine, PreemptsTheNewestWhenBlocksRunOutAndRecomputes) {
  // 6 blocks of 4 tokens; two requests of 8 + 12 tokens need 5 blocks each: one must yield.
  Rig rig(4, /*blocks=*/6, /*block_size=*/4, 64);
  auto a = greedy_request(iota_prompt(8), 12);
  auto b = greedy_request(iota_prompt(8, 20), 12);
  rig.engine->submit(a);
  rig.engine->submit(b);
  rig.run_all();
  EXPECT_GT(rig.engine->stats().preemptions, 0u);
  Collected ca = collect(*a), cb = collect(*b);
  EXPECT_EQ(ca.tokens, expected_fake(7, 12));
  EXPECT_EQ(cb.tokens, expected_fake(27, 12));
  EXPECT_EQ(ca.finishes, 1);
  EXPECT_EQ(cb.finishes, 1);
  EXPECT_EQ(rig.free_blocks(), 6);
  EXPECT_EQ(rig.free_slots(), 4);
}

// Allows even ids only and records what the engine reports as taken.
class EvenOnly : public TokenConstraint {
 public:
  std::vector<int32_t> accepted;
  int masks = 0;
  void allowed_tokens(std::span<uint8_t> allowed) override {
    ++masks;
    for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = i % 2 == 0;
  }
  void accept(int32_t token) override { accepted.push_back(token); }
};

TEST(Engine, RowsDrawnOnSeveralThreadsGiveTheSameTokens) {
  // Sampled requests (each with its seed), greedy ones and one under a constraint share steps; the
  // tokens must not depend on how many threads drew the rows.
  auto run = [](int threads) {
    Rig rig(16, 256, 4, 64, 64, threads);
    std::vector<std::shared_ptr<EngineRequest>> reqs;
    for (int i = 0; i < 12; ++i) {
      auto r = greedy_request(iota_prompt(5 + i, i), 24);
      if (i % 3 != 0) {
        r->params.temperature = 1.0f + 0.25f * static_cast<float>(i % 4);
        r->params.top_p = i % 2 ? 0.9f : 1.0f;
        r->params.seed = 1000 + static_cast<uint64_t>(i);
      }
      if (i == 4) r->constraint = std::make_shared<EvenOnly>();
      reqs.push_back(r);
      rig.engine->submit(r);
    }
    rig.run_all();
    std::vector<std::vector<int32_t>> out;
    for (auto& r : reqs) {
      Collected c = collect(*r);
      EXPECT_EQ(c.finishes, 1);
      out.push_back(c.tokens);
    }
    return out;
  };
  const auto one = run(1), four = run(4);
  EXPECT_EQ(one, four);
  for (int32_t id : one[4]) EXPECT_EQ(id % 2, 0);  // the constrained one stayed constrained
  // The sampled rows really sampled (the fake model's next token is likely, not certain).
  int off_path = 0;
  for (size_t i = 0; i < one.size(); ++i)
    if (i % 3 != 0) off_path += one[i] != expected_fake(static_cast<int32_t>((i + 4 + i) % kFakeVocab), 24);
  EXPECT_GT(off_path, 0);
}

TEST(Engine, ConstraintMasksEverySampledTokenAcrossPreemption) {
  // Same squeeze as above (one request must be preempted and recomputed); the constrained one
  // only gets even ids: the fake model's favourite when it is even, else the lowest allowed (0).
  Rig rig(4, /*blocks=*/6, /*block_size=*/4, 64);
  auto a = greedy_request(iota_prompt(8), 12);
  auto b = greedy_request(iota_prompt(8, 20), 12);
  auto constraint = std::make_shared<EvenOnly>();
  b->constraint = constraint;
  rig.engine->submit(a);
  rig.engine->submit(b);
  rig.run_all();
  EXPECT_GT(rig.engine->stats().preemptions, 0u);
  std::vector<int32_t> want;
  for (int32_t last = 27; want.size() < 12;) {
    const int32_t fav = (last + 1) % kFakeVocab;
    want.push_back(last = fav % 2 == 0 ? fav : 0);
  }
  Collected ca = collect(*a), cb = collect(*b);
  EXPECT_EQ(ca.tokens, expected_fake(7, 12));  // the neighbour is untouched
  EXPECT_EQ(cb.tokens, want);
  EXPECT_EQ(constraint->accepted, want);  // told once per token, none again after recompute
  EXPECT_EQ(constraint->masks, 12);
}

TEST(Engine, CancellationFreesEverythingAtTheNextStep) {
  Rig rig(4, 32, 4, 64);
  auto a = greedy_request(iota_prompt(10), 100);
  auto b = greedy_request(iota_prompt(10), 3);
  rig.engine->submit(a);
  rig.engine->submit(b);
  rig.engine->step();
  rig.engine->step();
  EXPECT_LT(rig.free_blocks(), 32);
  a->cancelled.store(true);
  rig.run_all();
  Collected ca = collect(*a);
  EXPECT_EQ(ca.finish_reason, "abort");
  EXPECT_EQ(ca.finishes, 1);
  EXPECT_EQ(collect(*b).tokens, expected_fake(9, 3));
  EXPECT_EQ(rig.free_blocks(), 32);
  EXPECT_EQ(rig.free_slots(), 4);
  EXPECT_EQ(rig.engine->stats().running, 0);
}

TEST(Engine, CancelledWhileWaitingNeverRuns) {
  Rig rig(1, 32, 4, 64, 1);
  auto a = greedy_request(iota_prompt(4), 5);
  auto b = greedy_request(iota_prompt(4), 5);
  rig.engine->submit(a);
  rig.engine->submit(b);
  rig.engine->step();
  b->cancelled.store(true);
  rig.run_all();
  EXPECT_EQ(collect(*b).finish_reason, "abort");
  EXPECT_EQ(collect(*a).tokens.size(), 5u);
}

TEST(Engine, RequestLargerThanThePoolIsRefusedNotStuck) {
  Rig rig(2, /*blocks=*/2, /*block_size=*/4, 64);
  auto r = greedy_request(iota_prompt(12), 4);
  rig.engine->submit(r);
  rig.run_all(100);
  Collected c = collect(*r);
  EXPECT_EQ(c.finish_reason, "error");
  EXPECT_FALSE(rig.engine->step());
}

TEST(Engine, StopTokenEndsWithStop) {
  Rig rig(2, 32, 4, 64);
  auto s = greedy_request({5}, 10);
  s->params.stop_token_ids = {8};
  auto n = greedy_request({5}, 3);
  rig.engine->submit(s);
  rig.engine->submit(n);
  rig.run_all();
  Collected cs = collect(*s), cn = collect(*n);
  EXPECT_EQ(cs.tokens, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(cs.finish_reason, "stop");
  EXPECT_EQ(cn.tokens, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(cn.finish_reason, "length");
}

TEST(Engine, ThreadedLoopServesConcurrentSubmissionsAndShutdownAborts) {
  Rig rig(8, 256, 4, 32, 8);
  rig.engine->start();
  std::vector<std::shared_ptr<EngineRequest>> rs;
  for (int i = 0; i < 16; ++i) {
    rs.push_back(greedy_request(iota_prompt(5, i), 6));
    rig.engine->submit(rs.back());
  }
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> toks;
    bool done = false;
    for (int w = 0; w < 200 && !done; ++w)
      for (auto& e : rs[i]->out.pop_all(std::chrono::milliseconds(50))) {
        if (e.finished) done = true;
        else toks.push_back(e.token);
      }
    EXPECT_TRUE(done);
    EXPECT_EQ(toks, expected_fake((i + 4) % kFakeVocab, 6)) << i;
  }
  rig.runner.delay = std::chrono::milliseconds(1);  // the late request runs ~1000 steps at most
  auto late = greedy_request(iota_prompt(5), 1000000);
  rig.engine->submit(late);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  rig.engine->shutdown();
  bool aborted = false;
  for (auto& e : late->out.pop_all(std::chrono::milliseconds(1000)))
    if (e.finished) aborted = e.finish_reason == "abort";
  EXPECT_TRUE(aborted);
}

// The real tiny model: a greedy request gives the same tokens alone and batched with others
// whose prompts differ (the CPU model is batch-invariant; the engine must keep it so).
TEST(Engine, TinyModelGreedyBatchInvariance) {
  auto backend = make_cpu_backend(2);
  auto model = load_qwen35(kTiny, *backend);
  ASSERT_TRUE(model.ok()) << model.message();
  auto run = [&](const std::vector<std::vector<int32_t>>& prompts, int64_t budget) {
    StateLimits lim{8, 64, 16};
    ModelState state(*backend, (*model)->config(), lim);
    Qwen35Runner runner(**model, state);
    EngineConfig ec;
    ec.max_num_batched_tokens = budget;
    ec.vocab_size = (*model)->config().vocab_size;
    Engine engine(runner, ec);
    std::vector<std::shared_ptr<EngineRequest>> rs;
    for (const auto& p : prompts) {
      rs.push_back(greedy_request(p, 8));
      rs.back()->params.ignore_eos = true;
      engine.submit(rs.back());
    }
    while (engine.step()) {}
    std::vector<std::vector<int32_t>> outs;
    for (auto& r : rs) outs.push_back(collect(*r).tokens);
    return outs;
  };
  const std::vector<int32_t> p0 = {1, 17, 300, 42, 999, 5, 5, 77};
  auto alone = run({p0}, 2048)[0];
  ASSERT_EQ(alone.size(), 8u);
  auto batched = run({{3, 4, 5}, p0, {900, 901, 902, 903, 904, 905, 906, 907, 908, 909, 910}}, 2048);
  EXPECT_EQ(batched[1], alone);
}

// While min_tokens is pending the stop ids are masked; a greedy row's argmax then runs where the
// logits are with those ids left out (argmax_exclusions). The tokens must equal the sampler's own
// masked choice on the full row, which a no-op logit bias forces.
TEST(Engine, TinyModelMinTokensArgmaxPathEqualsTheFullRowPath) {
  auto backend = make_cpu_backend(2);
  auto model = load_qwen35(kTiny, *backend);
  ASSERT_TRUE(model.ok()) << model.message();
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 999, 5, 5, 77};
  auto run = [&](std::vector<int32_t> stop_ids, bool full_row) {
    StateLimits lim{4, 64, 16};
    ModelState state(*backend, (*model)->config(), lim);
    Qwen35Runner runner(**model, state);
    EngineConfig ec;
    ec.vocab_size = (*model)->config().vocab_size;
    Engine engine(runner, ec);
    auto r = greedy_request(prompt, 6);
    r->params.ignore_eos = true;
    r->params.min_tokens = 6;
    r->params.stop_token_ids = std::move(stop_ids);
    if (full_row) r->params.logit_bias = {{0, 0.0f}};
    engine.submit(r);
    while (engine.step()) {}
    return collect(*r).tokens;
  };
  const auto free_run = run({}, false);
  ASSERT_EQ(free_run.size(), 6u);
  const std::vector<int32_t> stops = {free_run[0], free_run[3]};
  const auto masked = run(stops, false);
  ASSERT_EQ(masked.size(), 6u);
  EXPECT_NE(masked[0], free_run[0]);
  for (int32_t t : masked) EXPECT_TRUE(t != stops[0] && t != stops[1]);
  EXPECT_EQ(masked, run(stops, true));
}

// A sampled row (temperature, top_k, top_p, min_p and a seed) is drawn where the logits are
// (Backend::draw, device_choice) from the step's uniform number: the same tokens as the host
// sampler's draw from the whole row, which a no-op logit bias forces, with and without min_tokens.
TEST(Engine, TinyModelSampledRowsDrawnByTheBackendEqualTheHostDraws) {
  auto backend = make_cpu_backend(2);
  auto model = load_qwen35(kTiny, *backend);
  ASSERT_TRUE(model.ok()) << model.message();
  auto run = [&](bool full_row, float top_p, int64_t min_tokens) {
    StateLimits lim{4, 64, 16};
    ModelState state(*backend, (*model)->config(), lim);
    Qwen35Runner runner(**model, state);
    EngineConfig ec;
    ec.vocab_size = (*model)->config().vocab_size;
    Engine engine(runner, ec);
    std::vector<std::shared_ptr<EngineRequest>> rs;
    for (uint64_t seed : {11u, 12u, 13u}) {
      auto r = greedy_request({1, 17, 300, 42, 999, 5, 5, 77}, 12);
      r->params.temperature = 1.3f;
      r->params.top_k = 40;
      r->params.top_p = top_p;
      r->params.min_p = 0.001f;
      r->params.seed = seed;
      r->params.ignore_eos = true;
      r->params.min_tokens = min_tokens;
      r->params.stop_token_ids = {7};
      if (full_row) r->params.logit_bias = {{0, 0.0f}};
      engine.submit(r);
      rs.push_back(r);
    }
    while (engine.step()) {}
    std::vector<std::vector<int32_t>> outs;
    for (auto& r : rs) outs.push_back(collect(*r).tokens);
    return outs;
  };
  for (float top_p : {1.0f, 0.9f})
    for (int64_t min_tokens : {0, 5}) {
      const auto device = run(false, top_p, min_tokens);
      EXPECT_EQ(device, run(true, top_p, min_tokens)) << top_p << " " << min_tokens;
      EXPECT_NE(device[0], device[1]);  // the seeds matter: these are draws, not an argmax
    }
}

// Warm-up runs prompts of 1, 2, 4, ... tokens up to the step budget on a private engine, leaving
// garbage in the runner's KV and state pools: an engine made afterwards must produce the same
// greedy tokens as one on a fresh runner (nothing of the warm-up may leak into real requests).
TEST(Engine, WarmUpLeavesNoTraceInLaterRequests) {
  auto backend = make_cpu_backend(2);
  auto model = load_qwen35(kTiny, *backend);
  ASSERT_TRUE(model.ok()) << model.message();
  auto run = [&](bool warm) {
    StateLimits lim{4, 64, 16};
    ModelState state(*backend, (*model)->config(), lim);
    Qwen35Runner runner(**model, state);
    EngineConfig ec;
    ec.max_num_batched_tokens = 64;
    ec.max_model_len = 1024;
    ec.vocab_size = (*model)->config().vocab_size;
    if (warm) {
      const WarmUpResult w = warm_up(runner, ec);
      EXPECT_EQ(w.prompts, 7);  // 1, 2, 4, ..., 64
    }
    Engine engine(runner, ec);
    auto r = greedy_request({1, 17, 300, 42, 999, 5, 5, 77, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, 8);
    r->params.ignore_eos = true;
    engine.submit(r);
    while (engine.step()) {}
    return collect(*r).tokens;
  };
  const auto cold = run(false);
  ASSERT_EQ(cold.size(), 8u);
  EXPECT_EQ(run(true), cold);
}

}  // namespace
}  // namespace sparkserve::test
