// GDN state saves inside a forward (ForwardSeq::saves, the prefix cache's snapshots): one forward
// that saves its state at positions inside its spans leaves, in every snapshot row, bit for bit the
// state that a forward cut at those positions followed by a row copy leaves, and the same logits and
// live state. Bitwise, because the cut run and the saving run fold the same tokens through the same
// CPU ops in the same pieces (a part of several tokens takes the chunked GDN form, a single token the
// recurrent form, as a chunk of that size does), and every CPU op computes each row independently of
// the batch (model_state_test: batched == alone, bitwise). Also: malformed saves are refused.
#include <gtest/gtest.h>

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

// One sequence's prompt, alone in slot 0, run as the forwards a scheduler cutting at the saves would
// issue, each save a row copy after its forward; the last token's logits.
Logits run_cut(Pools& p, const std::vector<int32_t>& prompt, const std::vector<GdnStateSave>& saves) {
  Qwen35Model& m = *tiny().model;
  const auto len = static_cast<int64_t>(prompt.size());
  int64_t at = 0;
  for (const GdnStateSave& s : saves) {
    if (s.tokens > at) {
      auto out = m.forward(std::vector<ForwardSeq>{seq(p, 0, std::span(prompt).subspan(at, s.tokens - at), at,
                                                       s.tokens == len ? 1 : 0)},
                           p.state.pools());
      EXPECT_TRUE(out.ok()) << out.message();
      if (s.tokens == len) {
        p.state.gdn().copy_row(0, s.row);
        return *out;
      }
    }
    p.state.gdn().copy_row(0, s.row);
    at = s.tokens;
  }
  auto out = m.forward(std::vector<ForwardSeq>{seq(p, 0, std::span(prompt).subspan(at), at, 1)}, p.state.pools());
  EXPECT_TRUE(out.ok()) << out.message();
  return *out;
}

// Every save's row, the live slot and the logits of `got` (slot `slot`) equal those of a cut run.
void expect_as_cut(Pools& got, int32_t slot, const Logits& got_logits, int64_t logits_row,
                   const std::vector<int32_t>& prompt, const std::vector<GdnStateSave>& saves, const std::string& what) {
  Pools cut;
  const Logits want = run_cut(cut, prompt, saves);
  for (const GdnStateSave& s : saves)
    EXPECT_TRUE(got.row_bits(s.row) == cut.row_bits(s.row)) << what << ": the save after " << s.tokens << " tokens";
  EXPECT_TRUE(got.row_bits(slot) == cut.row_bits(0)) << what << ": the live state";
  std::vector<uint32_t> row(static_cast<size_t>(want.vocab));
  std::memcpy(row.data(), got_logits.row(logits_row), row.size() * 4);
  EXPECT_TRUE(row == logit_bits(want)) << what << ": the logits";
}

TEST(StateSaves, OneForwardSavesWhatACutRunSaves) {
  ASSERT_TRUE(tiny().model);
  const auto prompt = ids(150, 1);
  // A chat turn: an interval point, the generation prompt's start (hint), the prompt's last position;
  // 120 and 121 leave a 1-token part (the recurrent form) between them.
  const std::vector<GdnStateSave> saves = {{64, kSlots + 0}, {120, kSlots + 1}, {121, kSlots + 2}, {149, kSlots + 3}};
  Pools p;
  ForwardSeq f = seq(p, 0, prompt, 0, 1);
  f.saves = saves;
  auto out = tiny().model->forward(std::vector<ForwardSeq>{f}, p.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_as_cut(p, 0, *out, 0, prompt, saves, "one sequence");
  // A save at the span's very end equals the live state after the forward.
  Pools q;
  ForwardSeq e = seq(q, 0, prompt, 0, 1);
  const std::vector<GdnStateSave> at_end = {{7, kSlots + 0}, {150, kSlots + 1}};
  e.saves = at_end;
  out = tiny().model->forward(std::vector<ForwardSeq>{e}, q.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_as_cut(q, 0, *out, 0, prompt, at_end, "save at the end");
  EXPECT_TRUE(q.row_bits(kSlots + 1) == q.row_bits(0));
}

TEST(StateSaves, BatchOfSequencesWithDifferentSaveCounts) {
  ASSERT_TRUE(tiny().model);
  // A long prompt with four saves (the last at its end), one without, one whose first part is a
  // single token; a decode-sized span (one token, saved) too. Rounds: 4, with spans dropping out.
  const auto a = ids(150, 2), b = ids(40, 3), c = ids(30, 4);
  const std::vector<GdnStateSave> sa = {{50, kSlots + 0}, {64, kSlots + 1}, {149, kSlots + 2}, {150, kSlots + 3}};
  const std::vector<GdnStateSave> sc = {{1, kSlots + 4}, {29, kSlots + 5}};
  Pools p;
  ForwardSeq fa = seq(p, 0, a, 0, 1), fb = seq(p, 1, b, 0, 1), fc = seq(p, 2, c, 0, 1);
  fa.saves = sa;
  fc.saves = sc;
  auto out = tiny().model->forward(std::vector<ForwardSeq>{fa, fb, fc}, p.state.pools());
  ASSERT_TRUE(out.ok()) << out.message();
  expect_as_cut(p, 0, *out, 0, a, sa, "sequence a");
  expect_as_cut(p, 1, *out, 1, b, {}, "sequence b");
  expect_as_cut(p, 2, *out, 2, c, sc, "sequence c");
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
