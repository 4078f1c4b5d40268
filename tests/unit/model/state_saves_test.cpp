// GDN state saves inside a forward (ForwardSeq::saves, the prefix cache's snapshots): a forward that
// saves its state at positions inside its spans leaves bit for bit the logits and live state of the
// same forward without saves, and in every snapshot row bit for bit the state that a forward of the
// span's tokens up to the save leaves. Bitwise, because the GDN ops fold a save's tokens through the
// same CPU operations as a span ending there (the chunked form's last chunk ends at the save; its
// zero padding rows add exact zeros), and every CPU op computes each row independently of the batch
// (model_state_test: batched == alone, bitwise). One exception: a forward of a single token runs the
// recurrent form (a chunk of one token would too in a cut run), a save after the first token of a
// longer span the chunked form: the same function in other fp32 rounding, bound 1e-5 of the state's
// largest entry (float32 sums over dk = 16 products, each rounded once, differ by a few ulp). Also:
// malformed saves are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/load.h"
#include "runtime/model_state.h"
#include "tiny_checkpoint.h"

namespace sparkserve::test {
namespace {

struct Tiny {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Qwen35Model> model;
  Tiny() {
    auto m = load_qwen35(fixture_dir("qwen35-moe-tiny"), *backend);
    EXPECT_TRUE(m.ok()) << m.message();
    if (m.ok()) model = std::move(*m);
  }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

constexpr int32_t kSlots = 3, kSnapshots = 12, kBlocksPerSeq = 16;

// State storage for kSlots sequences of up to 16 blocks of 16 positions; sequence i owns blocks
// [16 i, 16 i + 16) and GDN slot i, all zeroed.
struct Pools {
  ModelState state{*tiny().backend, tiny().model->config(), StateLimits{kSlots, kSlots * kBlocksPerSeq, 16, kSnapshots}};
  std::vector<std::vector<int32_t>> tables;
  Pools() {
    for (int32_t s = 0; s < kSlots; ++s) {
      tables.emplace_back();
      for (int32_t b = 0; b < kBlocksPerSeq; ++b) tables.back().push_back(s * kBlocksPerSeq + b);
    }
    for (int32_t r = 0; r < kSlots + kSnapshots; ++r) state.gdn().zero_row(r);
  }
  // Row r of every GDN layer's conv and recurrent pools, as bits.
  std::vector<uint32_t> row_bits(int32_t r) {
    std::vector<uint32_t> bits;
    for (int l = 0; l < state.gdn().num_layers(); ++l)
      for (const Tensor* t : {&state.gdn().conv_pool(l), &state.gdn().recurrent_pool(l)}) {
        const Tensor row = t->rows(r, 1);
        const size_t at = bits.size();
        bits.resize(at + static_cast<size_t>(row.numel()));
        std::memcpy(bits.data() + at, row.data, row.nbytes());
      }
    return bits;
  }
};

std::vector<int32_t> ids(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(g() % 1000));
  return v;
}

ForwardSeq seq(const Pools& p, int32_t slot, std::span<const int32_t> tokens, int64_t start, int64_t logits) {
  ForwardSeq f;
  f.gdn_slot = slot;
  f.block_table = p.tables[static_cast<size_t>(slot)];
  f.start_pos = start;
  f.tokens = tokens;
  f.num_logits = logits;
  return f;
}

std::vector<uint32_t> logit_bits(const Logits& l) {
  std::vector<uint32_t> bits(l.data.size());
  std::memcpy(bits.data(), l.data.data(), l.data.size() * 4);
  return bits;
}

// The first n tokens of a prompt, alone in slot 0 of fresh pools, in one forward without saves; its
// last token's logits.
Logits run_plain(Pools& p, const std::vector<int32_t>& prompt, int64_t n) {
  auto out = tiny().model->forward(std::vector<ForwardSeq>{seq(p, 0, std::span(prompt).first(n), 0, 1)},
                                   p.state.pools());
  EXPECT_TRUE(out.ok()) << out.message();
  return out.ok() ? *out : Logits{};
}

// The logits and live slot of `got` are those of the prompt's forward without saves; every save's row
// is the live state a forward of the prompt's tokens up to the save leaves.
void expect_saved(Pools& got, int32_t slot, const Logits& got_logits, int64_t logits_row,
                  const std::vector<int32_t>& prompt, const std::vector<GdnStateSave>& saves, const std::string& what) {
  Pools plain;
  const Logits want = run_plain(plain, prompt, static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(got.row_bits(slot) == plain.row_bits(0)) << what << ": the live state";
  std::vector<uint32_t> row(static_cast<size_t>(want.vocab));
  std::memcpy(row.data(), got_logits.row(logits_row), row.size() * 4);
  EXPECT_TRUE(row == logit_bits(want)) << what << ": the logits";
  for (const GdnStateSave& s : saves) {
    Pools cut;
    run_plain(cut, prompt, s.tokens);
    const std::vector<uint32_t> a = got.row_bits(s.row), b = cut.row_bits(0);
    if (s.tokens > 1) {
      EXPECT_TRUE(a == b) << what << ": the save after " << s.tokens << " tokens";
      continue;
    }
    float worst = 0.0f, largest = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
      float x, y;
      std::memcpy(&x, &a[i], 4);
      std::memcpy(&y, &b[i], 4);
      worst = std::max(worst, std::fabs(x - y));
      largest = std::max(largest, std::fabs(y));
    }
    EXPECT_LE(worst, 1e-5f * largest) << what << ": the save after 1 token";
  }
}

TEST(StateSaves, OneForwardSavesWhatAForwardEndingThereLeaves) {
  ASSERT_TRUE(tiny().model);
  const auto prompt = ids(150, 1);
  // A chat turn: an interval point on a chunk boundary, the generation prompt's start (hint) and the
  // next token inside one chunk, the prompt's last position.
  const std::vector<GdnStateSave> saves = {{64, kSlots + 0}, {120, kSlots + 1}, {121, kSlots + 2}, {149, kSlots + 3}};
  Pools p;
  ForwardSeq f = seq(p, 0, prompt, 0, 1);
  f.saves = saves;
  auto out = tiny().model->forward(std::vector<ForwardSeq>{f}, p.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_saved(p, 0, *out, 0, prompt, saves, "one sequence");
  // A save at the span's very end equals the live state after the forward.
  Pools q;
  ForwardSeq e = seq(q, 0, prompt, 0, 1);
  const std::vector<GdnStateSave> at_end = {{7, kSlots + 0}, {150, kSlots + 1}};
  e.saves = at_end;
  out = tiny().model->forward(std::vector<ForwardSeq>{e}, q.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_saved(q, 0, *out, 0, prompt, at_end, "save at the end");
  EXPECT_TRUE(q.row_bits(kSlots + 1) == q.row_bits(0));
}

TEST(StateSaves, BatchOfSequencesWithDifferentSaveCounts) {
  ASSERT_TRUE(tiny().model);
  // A long prompt with four saves (the last at its end), one without, one saved after its first
  // token; a decode-sized span (one token, saved: the recurrent form) too.
  const auto a = ids(150, 2), b = ids(40, 3), c = ids(30, 4), d = ids(1, 6);
  const std::vector<GdnStateSave> sa = {{50, kSlots + 0}, {64, kSlots + 1}, {149, kSlots + 2}, {150, kSlots + 3}};
  const std::vector<GdnStateSave> sc = {{1, kSlots + 4}, {29, kSlots + 5}}, sd = {{1, kSlots + 6}};
  Pools p;
  ForwardSeq fa = seq(p, 0, a, 0, 1), fb = seq(p, 1, b, 0, 1), fc = seq(p, 2, c, 0, 1);
  fa.saves = sa;
  fc.saves = sc;
  auto out = tiny().model->forward(std::vector<ForwardSeq>{fa, fb, fc}, p.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_saved(p, 0, *out, 0, a, sa, "sequence a");
  expect_saved(p, 1, *out, 1, b, {}, "sequence b");
  expect_saved(p, 2, *out, 2, c, sc, "sequence c");
  Pools q;
  ForwardSeq fd = seq(q, 1, d, 0, 1), fe = seq(q, 0, a, 0, 1);
  fd.saves = sd;
  out = tiny().model->forward(std::vector<ForwardSeq>{fe, fd}, q.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_saved(q, 1, *out, 1, d, sd, "one saved token beside a prompt");
  EXPECT_TRUE(q.row_bits(kSlots + 6) == q.row_bits(1));
}

TEST(StateSaves, MalformedSavesAreRefusedBeforeAnyStateChanges) {
  ASSERT_TRUE(tiny().model);
  const auto t = ids(10, 5);
  Pools p;
  const std::vector<uint32_t> before = p.row_bits(0);
  auto fails = [&](std::vector<ForwardSeq> batch, const std::string& want) {
    auto out = tiny().model->forward(batch, p.state.pools());
    ASSERT_FALSE(out.ok()) << want;
    EXPECT_NE(out.message().find(want), std::string::npos) << out.message();
    EXPECT_TRUE(p.row_bits(0) == before) << want;
  };
  std::deque<std::vector<GdnStateSave>> keep;  // what the spans view
  auto with = [&](std::vector<GdnStateSave> s, int32_t slot = 0) {
    keep.push_back(std::move(s));
    ForwardSeq f = seq(p, slot, t, 0, 1);
    f.saves = keep.back();
    return f;
  };
  fails({with({{0, kSlots}})}, "after 0 of 10 tokens");
  fails({with({{11, kSlots}})}, "after 11 of 10 tokens");
  fails({with({{5, kSlots}, {3, kSlots + 1}})}, "saves must ascend");
  fails({with({{5, 1}})}, "into row 1, not a row in [3, 15)");
  fails({with({{5, kSlots + kSnapshots}})}, "not a row in [3, 15)");
  fails({with({{3, kSlots}, {5, kSlots}})}, "saves twice into row 3");
  fails({with({{3, kSlots}}, 0), with({{5, kSlots}}, 1)}, "save into one row");
  ForwardSeq spec = with({{1, kSlots}});
  spec.speculative = true;
  spec.num_logits = 10;
  SpecCapture capture;
  auto out = tiny().model->forward(std::vector<ForwardSeq>{spec}, p.state.pools(), &capture);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("is speculative and saves its state"), std::string::npos) << out.message();
}

}  // namespace
}  // namespace sparkserve::test
