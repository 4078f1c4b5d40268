// The prefix cache on the exact fake runner (fake_runner.h: every step checks that each sequence's
// state row holds exactly the tokens its KV blocks hold, so a wrong restore, a missing or shared-
// and-overwritten block fails the step): hits where the issue asks for them (identical prompts,
// prompts shorter than a block, prompts ending on a block boundary, multi-turn, branching), outputs
// equal to a run with the cache off, exact accounting after eviction, preemption and cancellation,
// hundreds of interleaved multi-turn sessions through a small cache, and no cached prefix for
// requests that want prompt logprobs. Plus SipHash-2-4 against
// its reference vectors and the block pool's LRU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <random>

#include "fake_runner.h"
#include "runtime/block_pool.h"
#include "runtime/engine.h"
#include "runtime/prefix_hash.h"

namespace sparkserve::test {
namespace {

TEST(PrefixHash, SipHash24ReferenceVectors) {
  // The SipHash paper's key 00..0f and messages 00..n-1 (reference implementation vectors).
  const uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
  std::vector<uint8_t> m(15);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(siphash24(k0, k1, std::span(m).first(0)), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ(siphash24(k0, k1, std::span(m).first(1)), 0x74f839c593dc67fdULL);
  EXPECT_EQ(siphash24(k0, k1, std::span(m).first(8)), 0x93f5f5799a932462ULL);
  EXPECT_EQ(siphash24(k0, k1, std::span(m).first(15)), 0xa129ca6149be45e5ULL);
}

TEST(PrefixHash, ChainsAndKeysDiffer) {
  PrefixHasher h(1), other(2);
  const std::vector<int32_t> a = {1, 2, 3}, b = {1, 2, 4};
  const PrefixHash root{};
  EXPECT_EQ(h.extend(root, a), h.extend(root, a));
  EXPECT_FALSE(h.extend(root, a) == h.extend(root, b));
  EXPECT_FALSE(h.extend(root, a) == other.extend(root, a));             // keys matter
  EXPECT_FALSE(h.extend(h.extend(root, a), b) == h.extend(h.extend(root, b), a));  // order matters
  EXPECT_FALSE(h.extend(root, std::span(a).first(2)) == h.extend(root, a));
}

// extend reads the ids as 64-bit words and runs both keys in one pass: it must equal SipHash-2-4 (checked
// above against the reference) of the message spelled out byte by byte, under each key pair.
TEST(PrefixHash, ExtendIsSipHashOfTheSpelledOutMessage) {
  std::mt19937_64 g(5);
  const std::array<uint64_t, 4> keys = {g(), g(), g(), g()};
  const PrefixHasher h(keys);
  for (int n = 0; n <= 40; ++n) {
    const PrefixHash prefix{g(), g()};
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = static_cast<int32_t>(g());  // negative ids too: the bytes of their two's complement
    std::vector<uint8_t> msg;
    for (uint64_t w : {prefix.lo, prefix.hi})
      for (int i = 0; i < 8; ++i) msg.push_back(static_cast<uint8_t>(w >> (8 * i)));
    for (int32_t t : tokens)
      for (int i = 0; i < 4; ++i) msg.push_back(static_cast<uint8_t>(static_cast<uint32_t>(t) >> (8 * i)));
    const PrefixHash got = h.extend(prefix, tokens);
    EXPECT_EQ(got.lo, siphash24(keys[0], keys[1], msg)) << n;
    EXPECT_EQ(got.hi, siphash24(keys[2], keys[3], msg)) << n;
  }
}

TEST(KvBlockPool, CachedBlocksAreReusedLastAndFoundByHash) {
  KvBlockPool p(3);
  PrefixHasher h(1);
  const PrefixHash x = h.extend({}, std::vector<int32_t>{7});
  const int32_t a = *p.allocate(), b = *p.allocate();
  p.register_hash(a, x);
  EXPECT_EQ(p.lookup(x), a);
  p.register_hash(b, x);  // a duplicate: the first stays the one found
  EXPECT_EQ(p.lookup(x), a);
  p.release(a);
  p.release(b);
  EXPECT_EQ(p.num_available(), 3);
  EXPECT_EQ(p.num_held_by_sequences(), 0);
  // Free blocks go first; the cached one is evicted only when nothing else is left.
  const int32_t c = *p.allocate(), d = *p.allocate();
  EXPECT_NE(c, a);
  EXPECT_NE(d, a);
  EXPECT_EQ(p.lookup(x), a);
  p.retain(a);  // shared again by a sequence: out of the LRU
  EXPECT_FALSE(p.allocate().has_value());
  p.release(a);
  EXPECT_EQ(*p.allocate(), a);  // evicted
  EXPECT_EQ(p.lookup(x), -1);
  // A cache hold does not count as a sequence hold.
  p.retain(a, /*cache=*/true);
  p.release(a);
  EXPECT_EQ(p.num_held_by_sequences(), 2);  // c and d
}

struct CacheRig {
  FakeRunner runner;
  std::unique_ptr<Engine> engine;
  CacheRig(int32_t slots, int32_t blocks, int64_t block_size, int32_t snapshots, bool caching, int64_t budget = 64,
           int64_t interval = 0)
      : runner(CacheGeometry{blocks, block_size, slots, snapshots}) {
    runner.prefix_dependent = true;
    EngineConfig ec;
    ec.max_num_seqs = slots;
    ec.max_num_batched_tokens = budget;
    ec.max_model_len = 1 << 20;
    ec.vocab_size = kFakeVocab;
    ec.enable_prefix_caching = caching;
    ec.snapshot_interval = interval;
    engine = std::make_unique<Engine>(runner, ec);
  }
  void run_all() {
    for (int i = 0; i < 100000 && engine->step(); ++i) {}
  }
  // The engine holds nothing but cache: no sequence, every slot free, no block held by a sequence.
  void expect_idle() {
    EngineStats s = engine->stats();
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
    EXPECT_EQ(s.free_slots, s.total_slots);
    EXPECT_EQ(s.blocks_held_by_sequences, 0);
  }
};

struct Out {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  int64_t cached = -1;
};

Out drain(EngineRequest& r) {
  Out o;
  for (auto& e : r.out.pop_all(std::chrono::milliseconds(0))) {
    if (e.num_cached_tokens >= 0) o.cached = e.num_cached_tokens;
    if (e.finished) o.finish_reason = e.finish_reason;
    else if (e.prompt.empty()) o.tokens.push_back(e.token);
  }
  return o;
}

std::shared_ptr<EngineRequest> request(std::vector<int32_t> prompt, int64_t max_tokens) {
  auto r = std::make_shared<EngineRequest>();
  r->prompt = std::move(prompt);
  r->params.temperature = 0.0f;
  r->params.max_tokens = max_tokens;
  r->params.ignore_eos = true;
  return r;
}

Out run_one(CacheRig& rig, std::vector<int32_t> prompt, int64_t max_tokens) {
  auto r = request(std::move(prompt), max_tokens);
  rig.engine->submit(r);
  rig.run_all();
  return drain(*r);
}

std::vector<int32_t> ids(int n, int32_t seed) {
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(g() % kFakeVocab));
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PrefixCache, IdenticalPromptsHitAllButTheLastToken) {
  for (int len : {5, 16, 17, 40, 64}) {  // shorter than a block, on a boundary, just past one, longer
    CacheRig on(4, 64, 16, 16, true), off(4, 64, 16, 16, false);
    const auto p = ids(len, len);
    Out ref = run_one(off, p, 6);
    Out first = run_one(on, p, 6);
    const int64_t tokens_after_first = on.runner.tokens_run;
    Out second = run_one(on, p, 6);
    EXPECT_EQ(first.tokens, ref.tokens) << len;
    EXPECT_EQ(second.tokens, ref.tokens) << len;
    EXPECT_EQ(first.cached, 0) << len;
    EXPECT_EQ(second.cached, len - 1) << len;
    // The second request ran its last prompt token and its 5 decodes, nothing else.
    EXPECT_EQ(on.runner.tokens_run - tokens_after_first, 1 + 5) << len;
    on.expect_idle();
    const PrefixCacheStats st = on.engine->stats().prefix_cache;
    EXPECT_EQ(st.queries, static_cast<uint64_t>(2 * len));
    EXPECT_EQ(st.hits, static_cast<uint64_t>(len - 1));
  }
}

TEST(PrefixCache, MultiTurnResumesAtTheEndOfTheLastTurn) {
  CacheRig on(4, 64, 16, 16, true), off(4, 64, 16, 16, false);
  std::vector<int32_t> conv = ids(37, 1);
  for (int turn = 0; turn < 5; ++turn) {
    Out ref = run_one(off, conv, 7);
    Out got = run_one(on, conv, 7);
    ASSERT_EQ(got.tokens, ref.tokens) << turn;
    // Everything up to the last generated token of the previous turn (which never ran through
    // the model) came from the cache: all but that token and the 3 new ones.
    if (turn > 0) {
      EXPECT_EQ(got.cached, static_cast<int64_t>(conv.size()) - 4) << turn;
    }
    conv = cat(cat(conv, got.tokens), ids(3, 100 + turn));  // the reply, then the next user message
  }
  on.expect_idle();
}

TEST(PrefixCache, BranchingConversationsShareTheirPrefix) {
  CacheRig on(4, 64, 16, 16, true), off(4, 64, 16, 16, false);
  const auto shared = ids(70, 7);
  Out a_ref = run_one(off, cat(shared, ids(30, 8)), 5);
  Out b_ref = run_one(off, cat(shared, ids(9, 9)), 5);
  Out a = run_one(on, cat(shared, ids(30, 8)), 5);
  Out b = run_one(on, cat(shared, ids(9, 9)), 5);
  EXPECT_EQ(a.tokens, a_ref.tokens);
  EXPECT_EQ(b.tokens, b_ref.tokens);
  // a (100 tokens) saved states at 96 and 99 only: b finds its first 4 blocks (64 tokens) cached
  // but no state to resume them with, so it recomputes and saves one at that branch point.
  EXPECT_EQ(b.cached, 0);
  Out c = run_one(on, cat(shared, ids(4, 10)), 5);
  EXPECT_EQ(c.cached, 64);
  // Two continuations of one conversation after its reply.
  const auto conv = cat(cat(shared, ids(30, 8)), a.tokens);
  Out x_ref = run_one(off, cat(conv, ids(3, 11)), 4), y_ref = run_one(off, cat(conv, ids(6, 12)), 4);
  Out x = run_one(on, cat(conv, ids(3, 11)), 4), y = run_one(on, cat(conv, ids(6, 12)), 4);
  EXPECT_EQ(x.tokens, x_ref.tokens);
  EXPECT_EQ(y.tokens, y_ref.tokens);
  EXPECT_EQ(x.cached, static_cast<int64_t>(conv.size()) - 1);
  EXPECT_EQ(y.cached, static_cast<int64_t>(conv.size()) - 1);
  on.expect_idle();
}

TEST(PrefixCache, LongPromptsGetSnapshotsEveryInterval) {
  CacheRig on(2, 256, 16, 32, true, /*budget=*/4096, /*interval=*/256);
  const auto p = ids(1000, 3);
  run_one(on, p, 2);
  // Another prompt sharing 700 tokens resumes at the last interval point before the divergence.
  Out o = run_one(on, cat(std::vector<int32_t>(p.begin(), p.begin() + 700), ids(50, 4)), 2);
  EXPECT_EQ(o.cached, 512);
}

// Snapshot points do not cut prefill chunks: a chat request's prompt (its hint where the generation
// prompt starts, its last position, interval points) runs in one forward that saves the state at
// each point, and later requests resume at each of them.
TEST(PrefixCache, SnapshotPointsAreSavedInsideOneForward) {
  CacheRig on(4, 64, 16, 16, true, /*budget=*/512, /*interval=*/128), off(4, 64, 16, 16, false, 512, 128);
  const auto p = ids(300, 21);
  auto r = request(p, 4);
  r->snapshot_hints = {290};
  on.engine->submit(r);
  on.run_all();
  EXPECT_EQ(drain(*r).tokens, run_one(off, p, 4).tokens);
  ASSERT_FALSE(on.runner.batches.empty());
  EXPECT_EQ(on.runner.batches.front(), std::vector<int64_t>{300});  // the whole prompt, one forward
  EXPECT_EQ(on.runner.saves_run, 4);                                  // at 128, 256, 290 and 299
  auto prefix = [&](int64_t n, int tail, int32_t seed) {
    return cat(std::vector<int32_t>(p.begin(), p.begin() + n), ids(tail, seed));
  };
  for (const auto& [prompt, cached] : std::vector<std::pair<std::vector<int32_t>, int64_t>>{
           {prefix(200, 30, 22), 128}, {prefix(270, 9, 23), 256}, {prefix(290, 20, 24), 290}, {p, 299}}) {
    Out got = run_one(on, prompt, 4);
    EXPECT_EQ(got.tokens, run_one(off, prompt, 4).tokens) << cached;
    EXPECT_EQ(got.cached, cached);
  }
  on.expect_idle();
}

// A later turn of a chat resumes at the previous turn's hint (where its generation prompt began) and
// finds the previous turn's blocks cached a few tokens further (the re-rendered reply starts as the
// generation prompt did). The end of that shared run is no snapshot point: it lies less than a block
// past the resume point, so its save would cost the forward a GDN round for nothing a branch needs.
TEST(PrefixCache, LaterTurnSavesNoStateJustPastItsResumePoint) {
  CacheRig on(4, 64, 16, 16, true, /*budget=*/512), off(4, 64, 16, 16, false, 512);
  const auto turn1 = ids(68, 41);  // hint at 61: the shared run reaches block boundary 64 (3 tokens on)
  auto r1 = request(turn1, 8);
  r1->snapshot_hints = {61};
  on.engine->submit(r1);
  on.run_all();
  EXPECT_EQ(drain(*r1).tokens, run_one(off, turn1, 8).tokens);
  const auto turn2 = cat(std::vector<int32_t>(turn1.begin(), turn1.begin() + 64), ids(47, 42));  // 111 tokens
  auto r2 = request(turn2, 8);
  r2->snapshot_hints = {104};
  const int64_t saves_before = on.runner.saves_run;
  on.engine->submit(r2);
  on.run_all();
  const Out got = drain(*r2);
  EXPECT_EQ(got.tokens, run_one(off, turn2, 8).tokens);
  EXPECT_EQ(got.cached, 61);
  EXPECT_EQ(on.runner.saves_run - saves_before, 2);  // at the hint (104) and the prompt's end (110)
  // A request branching at 64 resumes at 61 and recomputes 3 tokens.
  const auto branch = cat(std::vector<int32_t>(turn1.begin(), turn1.begin() + 64), ids(20, 43));
  const Out b = run_one(on, branch, 4);
  EXPECT_EQ(b.tokens, run_one(off, branch, 4).tokens);
  EXPECT_EQ(b.cached, 61);
  on.expect_idle();
}

// Several sequences in one forward, each with its own number of saves.
TEST(PrefixCache, SavesOfSeveralSequencesInOneForward) {
  CacheRig on(4, 64, 16, 16, true, /*budget=*/512, /*interval=*/128), off(4, 64, 16, 16, false, 512, 128);
  const std::vector<std::vector<int32_t>> prompts = {ids(300, 31), ids(20, 32), ids(5, 33)};
  std::vector<std::shared_ptr<EngineRequest>> rs;
  for (const auto& p : prompts) rs.push_back(request(p, 3));
  rs[0]->snapshot_hints = {290};
  for (auto& r : rs) on.engine->submit(r);
  on.run_all();
  ASSERT_FALSE(on.runner.batches.empty());
  EXPECT_EQ(on.runner.batches.front(), (std::vector<int64_t>{300, 20, 5}));
  // 128, 256, 290, 299 | 16 (the block boundary before the last position, no hint), 19 | 4.
  EXPECT_EQ(on.runner.saves_run, 4 + 2 + 1);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(drain(*rs[i]).tokens, run_one(off, prompts[i], 3).tokens) << i;
    Out again = run_one(on, prompts[i], 3);
    EXPECT_EQ(again.cached, static_cast<int64_t>(prompts[i].size()) - 1) << i;
    EXPECT_EQ(again.tokens, run_one(off, prompts[i], 3).tokens) << i;
  }
  on.expect_idle();
}

// Prompt logprobs (echo with logprobs) need every prompt position's logits row: such a request
// recomputes a prompt that is cached (and others still find it afterwards), in chunks of at most
// kPromptLogprobsChunk rows, and reports each position once, equal to the log-softmax of its row
// (the fake runner's one-hot row: 10 at (previous token + 1) % vocab, 0 elsewhere).
TEST(PrefixCache, PromptLogprobsNeverResumeFromTheCache) {
  CacheRig on(4, 64, 16, 16, true, /*budget=*/256);
  on.runner.prefix_dependent = false;
  const auto p = ids(150, 3);
  EXPECT_EQ(run_one(on, p, 3).cached, 0);
  const double log_z = std::log(std::exp(10.0) + (kFakeVocab - 1));
  for (bool prompt_only : {false, true}) {
    auto r = request(p, 1);
    r->prompt_logprobs = 2;
    r->prompt_only = prompt_only;
    const int64_t before = on.runner.tokens_run;
    const size_t steps_before = on.runner.batches.size();
    on.engine->submit(r);
    on.run_all();
    std::vector<int32_t> positions;
    Out o;
    for (auto& e : r->out.pop_all(std::chrono::milliseconds(0))) {
      if (e.num_cached_tokens >= 0) o.cached = e.num_cached_tokens;
      if (e.finished) o.finish_reason = e.finish_reason;
      else if (e.prompt.empty()) o.tokens.push_back(e.token);
      for (const PromptLogprob& pl : e.prompt) {
        positions.push_back(pl.position);
        const int32_t predicted = (p[static_cast<size_t>(pl.position) - 1] + 1) % kFakeVocab;
        const double want = (pl.lp.token == predicted ? 10.0 : 0.0) - log_z;
        EXPECT_EQ(pl.lp.token, p[static_cast<size_t>(pl.position)]);
        EXPECT_NEAR(*pl.lp.logprob, want, 1e-5);
        ASSERT_EQ(pl.lp.top.size(), 2u);
        EXPECT_EQ(pl.lp.top[0].token, predicted);
        EXPECT_NEAR(pl.lp.top[0].logprob, 10.0 - log_z, 1e-5);
        EXPECT_EQ(pl.lp.top[1].token, predicted == 0 ? 1 : 0);  // ties: the lowest id
      }
    }
    std::vector<int32_t> want_positions;
    for (int32_t i = 1; i < 150; ++i) want_positions.push_back(i);
    EXPECT_EQ(positions, want_positions) << prompt_only;
    EXPECT_EQ(on.runner.tokens_run - before, 150) << prompt_only;  // the whole prompt, nothing from the cache
    for (size_t s = steps_before; s < on.runner.batches.size(); ++s)
      for (int64_t n : on.runner.batches[s]) EXPECT_LE(n, kPromptLogprobsChunk);
    if (prompt_only) {
      EXPECT_TRUE(o.tokens.empty());
      EXPECT_EQ(o.finish_reason, "length");
    } else {
      EXPECT_EQ(o.tokens.size(), 1u);
      EXPECT_EQ(o.cached, 0);
    }
  }
  // A request without prompt logprobs still finds the prompt cached.
  EXPECT_EQ(run_one(on, p, 2).cached, 149);
  on.expect_idle();
}

TEST(PrefixCache, EvictionKeepsOutputsExactAndAccountingClean) {
  // 3 snapshots and 12 blocks of 4 for prompts of up to 30 tokens: entries are evicted all the time.
  CacheRig on(2, 12, 4, 3, true, 16), off(2, 12, 4, 3, false, 16);
  std::mt19937 g(5);
  std::vector<std::vector<int32_t>> prefixes = {ids(9, 1), ids(14, 2), ids(3, 3)};
  for (int i = 0; i < 60; ++i) {
    auto p = cat(prefixes[g() % 3], ids(static_cast<int>(g() % 12) + 1, 1000 + i));
    Out ref = run_one(off, p, 4), got = run_one(on, p, 4);
    ASSERT_EQ(got.tokens, ref.tokens) << i;
    on.expect_idle();
  }
  EXPECT_LE(on.engine->stats().prefix_cache.snapshots, 3);
}

TEST(PrefixCache, PreemptionAndCancellationKeepEverythingExact) {
  // 10 blocks of 4 for 3 sequences growing to 28 positions each: preemption on every run.
  for (bool caching : {false, true}) {
    CacheRig rig(3, 10, 4, 8, caching, 32);
    CacheRig ref(3, 64, 4, 8, false, 32);
    std::vector<std::shared_ptr<EngineRequest>> rs, refs;
    for (int i = 0; i < 3; ++i) {
      rs.push_back(request(ids(8 + i, 20 + i), 20));
      refs.push_back(request(ids(8 + i, 20 + i), 20));
      rig.engine->submit(rs.back());
      ref.engine->submit(refs.back());
    }
    auto cancelled = request(ids(6, 30), 1000);
    rig.engine->submit(cancelled);
    for (int s = 0; s < 12; ++s) rig.engine->step();
    cancelled->cancelled.store(true);
    rig.run_all();
    ref.run_all();
    EXPECT_GT(rig.engine->stats().preemptions, 0u) << caching;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(drain(*rs[i]).tokens, drain(*refs[i]).tokens) << caching << " " << i;
    EXPECT_EQ(drain(*cancelled).finish_reason, "abort");
    rig.expect_idle();
  }
}

// Hundreds of multi-turn sessions, interleaved (several in flight each step, sharing system
// prompts), through a cache far smaller than their working set; some turns are cancelled midway
// (a disconnect). Every completed turn's output equals the same conversation run with the cache
// off, and the engine ends idle.
TEST(PrefixCache, RandomInterleavedSessionsMatchNoCache) {
  CacheRig on(8, 96, 8, 12, true, 48);
  CacheRig off(8, 512, 8, 0, false, 48);
  std::mt19937 g(11);
  const std::vector<std::vector<int32_t>> systems = {ids(40, 1), ids(23, 2), ids(7, 3)};
  struct Session {
    std::vector<int32_t> conv;
    int turns_left;
    std::shared_ptr<EngineRequest> live;
    bool cancel = false;
    Out got;
  };
  std::vector<Session> sessions;
  for (int i = 0; i < 300; ++i)
    sessions.push_back({cat(systems[g() % 3], ids(static_cast<int>(g() % 9) + 1, 5000 + i)), static_cast<int>(g() % 4) + 1,
                        nullptr, false, Out{}});
  size_t next = 0, done = 0, compared = 0, cancelled = 0;
  std::vector<size_t> active;
  while (done < sessions.size()) {
    while (active.size() < 10 && next < sessions.size()) active.push_back(next++);
    for (size_t k : active) {
      Session& s = sessions[k];
      if (!s.live) {
        s.live = request(s.conv, static_cast<int64_t>(g() % 6) + 1);
        s.cancel = g() % 10 == 0;
        s.got = Out{};
        on.engine->submit(s.live);
      }
    }
    on.engine->step();
    for (size_t a = 0; a < active.size();) {
      Session& s = sessions[active[a]];
      if (s.cancel && g() % 3 == 0) s.live->cancelled.store(true);
      Out o = drain(*s.live);
      s.got.tokens.insert(s.got.tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.finish_reason.empty()) {
        ++a;
        continue;
      }
      if (o.finish_reason != "abort") {
        Out ref = run_one(off, s.conv, s.live->params.max_tokens);
        ASSERT_EQ(s.got.tokens, ref.tokens) << "session " << active[a];
        ++compared;
        s.conv = cat(cat(s.conv, s.got.tokens), ids(static_cast<int>(g() % 5) + 1, static_cast<int32_t>(g())));
      } else {
        ++cancelled;
      }
      s.live = nullptr;
      if (--s.turns_left == 0) {
        ++done;
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(a));
      } else {
        ++a;
      }
    }
  }
  on.run_all();
  on.expect_idle();
  const PrefixCacheStats st = on.engine->stats().prefix_cache;
  EXPECT_GT(compared, 500u);
  EXPECT_GT(cancelled, 10u);
  EXPECT_GT(st.hits, st.queries / 3) << "hits " << st.hits << " of " << st.queries;
}

}  // namespace
}  // namespace sparkserve::test
