// The prefix cache on the real tiny MoE fixture (CPU backend): greedy outputs with the cache on are
// identical to the cache off for single requests, repeats, prompts shorter than a block and ending
// on a block boundary, multi-turn and branching conversations, under eviction and preemption, and
// in interleaved random sessions. "Identical" is exact: the resumed state is the very state a
// previous sequence computed, and the rest runs through the same CPU ops. (The cache does change
// how a prompt is cut into chunks and whether a token was folded in by the chunked or the
// recurrent GDN form, which differ in float rounding, ~1e-6 relative; greedy outputs could differ
// only at a near-tie of the top two logits. None occurs on these inputs; a failure here prints the
// first differing position.)
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/load.h"
#include "runtime/engine.h"

namespace sparkserve::test {
namespace {

const std::filesystem::path kTiny = std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests/fixtures/qwen35-moe-tiny";

struct Model {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Qwen35Model> model;
  Model() {
    auto m = load_qwen35(kTiny, *backend);
    EXPECT_TRUE(m.ok()) << m.message();
    if (m.ok()) model = std::move(*m);
  }
};

Model& tiny() {
  static Model m;
  return m;
}

// The model runner, counting its forwards: the tokens of each chunk, per forward.
struct CountingRunner final : ModelRunner {
  ModelRunner& inner;
  std::vector<std::vector<int64_t>> forwards;
  explicit CountingRunner(ModelRunner& r) : inner(r) {}
  CacheGeometry geometry() const override { return inner.geometry(); }
  Expected<StepOutput> execute(const StepPlan& plan) override {
    if (!plan.chunks.empty()) {
      forwards.emplace_back();
      for (const ScheduledChunk& c : plan.chunks) forwards.back().push_back(static_cast<int64_t>(c.tokens.size()));
    }
    return inner.execute(plan);
  }
};

struct Rig {
  ModelState state;
  Qwen35Runner runner;
  CountingRunner counting{runner};
  Engine engine;
  Rig(int32_t slots, int32_t blocks, int64_t block_size, int32_t snapshots, bool caching, int64_t budget = 256,
      DType gdn_dtype = DType::kF32)
      : state(*tiny().backend, tiny().model->config(),
              StateLimits{slots, blocks, block_size, snapshots, DType::kF32, false, gdn_dtype}),
        runner(*tiny().model, state),
        engine(counting, config(slots, budget, caching)) {}
  static EngineConfig config(int32_t slots, int64_t budget, bool caching) {
    EngineConfig ec;
    ec.max_num_seqs = slots;
    ec.max_num_batched_tokens = budget;
    ec.max_model_len = 4096;
    ec.vocab_size = 1000;
    ec.enable_prefix_caching = caching;
    ec.snapshot_interval = 64;
    return ec;
  }
  void run_all() {
    while (engine.step()) {}
  }
};

struct Out {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
};

std::shared_ptr<EngineRequest> request(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  auto r = std::make_shared<EngineRequest>();
  r->prompt = prompt;
  r->params.temperature = 0.0f;
  r->params.max_tokens = max_tokens;
  r->params.ignore_eos = true;
  return r;
}

Out drain(EngineRequest& r) {
  Out o;
  for (auto& e : r.out.pop_all(std::chrono::milliseconds(0))) {
    if (e.num_cached_tokens >= 0) o.cached = e.num_cached_tokens;
    if (!e.finished) o.tokens.push_back(e.token);
  }
  return o;
}

// Runs the prompts together (one batch of requests) and returns their outputs.
std::vector<Out> run(Rig& rig, const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens) {
  std::vector<std::shared_ptr<EngineRequest>> rs;
  for (const auto& p : prompts) {
    rs.push_back(request(p, max_tokens));
    rig.engine.submit(rs.back());
  }
  rig.run_all();
  std::vector<Out> outs;
  for (auto& r : rs) outs.push_back(drain(*r));
  return outs;
}

std::vector<int32_t> ids(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(g() % 1000));
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_same(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const std::string& what) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  EXPECT_TRUE(i == got.size() && i == want.size()) << what << ": first difference at output token " << i;
}

TEST(PrefixCacheModel, RepeatsShortPromptsAndBlockBoundaries) {
  Rig on(4, 128, 16, 32, true), off(4, 128, 16, 32, false);
  for (int len : {3, 16, 32, 45}) {
    const auto p = ids(len, static_cast<uint32_t>(len));
    const Out ref = run(off, {p}, 12)[0];
    const Out a = run(on, {p}, 12)[0], b = run(on, {p}, 12)[0];
    expect_same(a.tokens, ref.tokens, "first, len " + std::to_string(len));
    expect_same(b.tokens, ref.tokens, "repeat, len " + std::to_string(len));
    EXPECT_EQ(b.cached, len - 1);
  }
}

// With a bf16 GDN state (--gdn-state-dtype bfloat16) a snapshot is the rounded state of its position,
// and the first run (one rounding at the prompt's end) need not match the cache off; every repeat
// resumes from the same snapshot bytes through the same ops, so repeats match each other exactly.
TEST(PrefixCacheModel, Bf16StateSnapshotsResumeExactly) {
  Rig on(4, 128, 16, 32, true, 256, DType::kBF16);
  EXPECT_EQ(on.state.gdn().recurrent_pool(0).dtype, DType::kBF16);
  for (int len : {16, 45}) {
    const auto p = ids(len, static_cast<uint32_t>(len));
    const Out a = run(on, {p}, 12)[0], b = run(on, {p}, 12)[0], c = run(on, {p}, 12)[0];
    EXPECT_EQ(a.tokens.size(), 12u);
    expect_same(c.tokens, b.tokens, "second and third run, len " + std::to_string(len));
    EXPECT_EQ(b.cached, len - 1);
    EXPECT_EQ(c.cached, len - 1);
  }
}

TEST(PrefixCacheModel, MultiTurnAndBranches) {
  Rig on(4, 256, 16, 32, true), off(4, 256, 16, 32, false);
  std::vector<int32_t> conv = ids(40, 1);
  for (int turn = 0; turn < 4; ++turn) {
    const Out ref = run(off, {conv}, 10)[0];
    const Out got = run(on, {conv}, 10)[0];
    expect_same(got.tokens, ref.tokens, "turn " + std::to_string(turn));
    if (turn > 0) {
      EXPECT_EQ(got.cached, static_cast<int64_t>(conv.size()) - 6);
    }
    conv = cat(cat(conv, got.tokens), ids(5, 50 + static_cast<uint32_t>(turn)));
  }
  // Two continuations of the conversation, run together, and a third sharing only its start.
  const auto x = cat(conv, ids(7, 90)), y = cat(conv, ids(2, 91)), z = cat(std::vector<int32_t>(conv.begin(), conv.begin() + 30), ids(9, 92));
  const auto ref = run(off, {x, y, z}, 10);
  const auto got = run(on, {x, y, z}, 10);
  for (int i = 0; i < 3; ++i) expect_same(got[static_cast<size_t>(i)].tokens, ref[static_cast<size_t>(i)].tokens, "branch " + std::to_string(i));
  EXPECT_EQ(got[0].cached, static_cast<int64_t>(conv.size()) - 6);
}

// A chat session: each turn's prompt is the previous one up to where its generation prompt began
// (the hint), the re-rendered reply, a new message and a new generation prompt. Every turn runs its
// new tokens in ONE forward (the snapshots at its hint and last position are saves of that forward),
// the next turn resumes at the hint, and the outputs equal the cache off. (That a save holds bit for
// bit what a forward cut at its position leaves: tests/unit/model/state_saves_test.cpp.)
TEST(PrefixCacheModel, ChatTurnsRunInOneForwardAndResumeAtTheirHint) {
  Rig on(2, 128, 16, 32, true), off(2, 128, 16, 32, false);
  const std::vector<int32_t> gen_prompt = ids(9, 70);
  std::vector<int32_t> conv = ids(150, 71);
  int64_t hint = 0;
  for (uint32_t turn = 0; turn < 4; ++turn) {
    const auto prompt = cat(conv, gen_prompt);
    const int64_t len = static_cast<int64_t>(prompt.size());
    auto r = request(prompt, 8), ref = request(prompt, 8);
    r->snapshot_hints = ref->snapshot_hints = {len - 9};
    const size_t before = on.counting.forwards.size();
    on.engine.submit(r);
    on.run_all();
    off.engine.submit(ref);
    off.run_all();
    const Out got = drain(*r);
    expect_same(got.tokens, drain(*ref).tokens, "turn " + std::to_string(turn));
    EXPECT_EQ(got.cached, hint) << turn;
    ASSERT_LT(before, on.counting.forwards.size());
    EXPECT_EQ(on.counting.forwards[before], std::vector<int64_t>{len - hint}) << turn;  // one forward
    hint = len - 9;
    conv = cat(cat(cat(std::vector<int32_t>(prompt.begin(), prompt.begin() + hint), ids(3, 80 + turn)), got.tokens),
               ids(20, 90 + turn));  // re-rendered reply, then the next user message
  }
  EXPECT_EQ(on.engine.stats().blocks_held_by_sequences, 0);
}

TEST(PrefixCacheModel, EvictionAndPreemption) {
  // 24 blocks of 8 for 4 sequences growing to ~60 positions, 4 snapshots: preemption and eviction.
  Rig on(4, 24, 8, 4, true, 64), off(4, 256, 8, 4, false, 64);
  const auto sys = ids(20, 7);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 4; ++i) prompts.push_back(cat(sys, ids(5 + static_cast<int>(i), 100 + i)));
  for (int round = 0; round < 2; ++round) {
    const auto ref = run(off, prompts, 30);
    const auto got = run(on, prompts, 30);
    for (size_t i = 0; i < prompts.size(); ++i) {
      expect_same(got[i].tokens, ref[i].tokens, "round " + std::to_string(round) + " seq " + std::to_string(i));
      prompts[i] = cat(cat(prompts[i], got[i].tokens), ids(3, 200 + static_cast<uint32_t>(i)));
    }
  }
  EXPECT_GT(on.engine.stats().preemptions, 0u);
  EXPECT_EQ(on.engine.stats().blocks_held_by_sequences, 0);
  EXPECT_GT(on.engine.stats().prefix_cache.hits, 0u);
}

TEST(PrefixCacheModel, RandomSessions) {
  Rig on(6, 96, 8, 10, true, 96), off(6, 512, 8, 0, false, 96);
  std::mt19937 g(3);
  const std::vector<std::vector<int32_t>> systems = {ids(30, 1), ids(12, 2)};
  std::vector<std::vector<int32_t>> convs;
  for (uint32_t i = 0; i < 24; ++i) convs.push_back(cat(systems[i % 2], ids(static_cast<int>(g() % 6) + 1, 300 + i)));
  for (int turn = 0; turn < 3; ++turn) {
    // Six sessions at a time, their turns interleaved in one engine.
    for (size_t b = 0; b < convs.size(); b += 6) {
      std::vector<std::vector<int32_t>> batch(convs.begin() + static_cast<std::ptrdiff_t>(b), convs.begin() + static_cast<std::ptrdiff_t>(b + 6));
      const auto got = run(on, batch, 6);
      for (size_t i = 0; i < batch.size(); ++i) {
        const auto ref = run(off, {batch[i]}, 6)[0];
        expect_same(got[i].tokens, ref.tokens, "turn " + std::to_string(turn) + " session " + std::to_string(b + i));
        convs[b + i] = cat(cat(batch[i], got[i].tokens), ids(static_cast<int>(g() % 4) + 1, g()));
      }
    }
  }
  EXPECT_EQ(on.engine.stats().blocks_held_by_sequences, 0);
  EXPECT_EQ(on.engine.stats().free_slots, 6);
}

}  // namespace
}  // namespace sparkserve::test
