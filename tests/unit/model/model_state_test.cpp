// The forward pass and its per-sequence state: prefill + decode == recompute, chunked prefill in
// pieces == one shot, batched == alone, cached decode == transformers' decode logits, and clean
// errors that leave the state untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/npy.h"
#include "model/load.h"
#include "tiny_checkpoint.h"
#include "runtime/block_pool.h"
#include "runtime/direct_state.h"
#include "runtime/sampler.h"

namespace sparkserve::test {
namespace {

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen35Model> model;
};

Loaded load(const std::filesystem::path& dir, int threads = 2) {
  Loaded l;
  l.backend = make_cpu_backend(threads);
  auto m = load_qwen35(dir, *l.backend);
  if (!m.ok()) ADD_FAILURE() << m.message();
  if (m.ok()) l.model = std::move(*m);
  return l;
}

std::vector<int32_t> prompt_ids(const std::string& fixture, const std::string& name, std::vector<int32_t>* greedy = nullptr) {
  std::ifstream f(fixture_dir(fixture) / "reference.json");
  auto j = nlohmann::json::parse(f);
  for (auto& p : j["prompts"])
    if (p["name"] == name) {
      if (greedy) *greedy = p["greedy_ids"].get<std::vector<int32_t>>();
      return p["prompt_ids"].get<std::vector<int32_t>>();
    }
  ADD_FAILURE() << "no prompt " << name;
  return {};
}

StateLimits limits(int32_t seqs, int32_t blocks, int64_t block_size = 16) {
  StateLimits l;
  l.max_sequences = seqs;
  l.num_kv_blocks = blocks;
  l.block_size = block_size;
  return l;
}

// Teacher-forced logits of every token of `ids`, in one forward.
Logits all_logits(Qwen35Model& m, const std::vector<int32_t>& ids) {
  DirectState st(m.backend(), m.config(), limits(1, 64));
  auto seq = st.open_sequence();
  std::vector<SequenceInput> b(1);
  b[0].state = &*seq;
  b[0].tokens = ids;
  b[0].all_logits = true;
  auto l = st.forward(m, b);
  EXPECT_TRUE(l.ok()) << l.message();
  return *l;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i])));
  return m;
}
double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// Relative bound for two fp32 evaluations of the same function in different orders (chunked vs
// recurrent delta rule, different chunk boundaries): transformers' own spread between its cached
// and uncached paths on these fixtures is ~2e-6 relative (tests/fixtures/README.md); 2e-5 leaves
// 10x margin while a state bug (lost conv state, wrong position, stale KV) moves logits by O(1).
constexpr double kOrderTol = 2e-5;

class FixtureModel : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModel, PrefillThenDecodeEqualsRecompute) {
  Loaded l = load(fixture_dir(GetParam()));
  ASSERT_TRUE(l.model);
  std::vector<int32_t> ids = prompt_ids(GetParam(), "long");  // 150 tokens
  Logits ref = all_logits(*l.model, ids);
  const int64_t V = ref.vocab, P = 100;
  DirectState st(*l.backend, l.model->config(), limits(1, 16));
  auto seq = st.open_sequence();
  std::vector<SequenceInput> b(1);
  b[0].state = &*seq;
  b[0].tokens.assign(ids.begin(), ids.begin() + P);
  auto out = st.forward(*l.model, b);
  ASSERT_TRUE(out.ok());
  const double scale = max_abs(ref.data.data(), ref.rows * V);
  EXPECT_LE(max_diff(out->row(0), ref.row(P - 1), V) / scale, kOrderTol);
  for (int64_t t = P; t < static_cast<int64_t>(ids.size()); ++t) {
    b[0].tokens = {ids[static_cast<size_t>(t)]};
    out = st.forward(*l.model, b);
    ASSERT_TRUE(out.ok());
    ASSERT_LE(max_diff(out->row(0), ref.row(t), V) / scale, kOrderTol) << "decode position " << t;
  }
  EXPECT_EQ(seq->num_tokens, 150);
}

TEST_P(FixtureModel, CachedDecodeMatchesTransformersDecodeLogits) {
  Loaded l = load(fixture_dir(GetParam()));
  ASSERT_TRUE(l.model);
  for (const char* name : {"short", "medium", "long"}) {
    std::vector<int32_t> greedy;
    std::vector<int32_t> ids = prompt_ids(GetParam(), name, &greedy);
    auto ref = read_npy_f32(fixture_dir(GetParam()) / (std::string("logits_") + name + "_decode.npy"));
    ASSERT_TRUE(ref.ok()) << ref.message();
    const int64_t V = ref->shape[1];
    DirectState st(*l.backend, l.model->config(), limits(1, 16));
    auto seq = st.open_sequence();
    std::vector<SequenceInput> b(1);
    b[0].state = &*seq;
    b[0].tokens = ids;
    ASSERT_TRUE(st.forward(*l.model, b).ok());
    const double scale = max_abs(ref->data.data(), static_cast<int64_t>(ref->data.size()));
    double worst = 0;
    for (size_t s = 0; s < greedy.size(); ++s) {
      b[0].tokens = {greedy[s]};  // row s = logits after feeding greedy token s
      auto out = st.forward(*l.model, b);
      ASSERT_TRUE(out.ok());
      const double err = max_diff(out->row(0), ref->data.data() + s * static_cast<size_t>(V), V) / scale;
      // transformers' fp32 reference: ~1e-6 relative expected; the bound is 1e-3.
      ASSERT_LE(err, 1e-4) << name << " decode step " << s;
      worst = std::max(worst, err);
    }
    std::printf("%s/%s cached decode vs transformers: max|d|/max|ref| = %.3e\n", GetParam().c_str(), name, worst);
  }
}

TEST_P(FixtureModel, ChunkedPrefillInPiecesEqualsOneShot) {
  Loaded l = load(fixture_dir(GetParam()));
  ASSERT_TRUE(l.model);
  std::vector<int32_t> ids = prompt_ids(GetParam(), "long");
  Logits ref = all_logits(*l.model, ids);
  const int64_t V = ref.vocab;
  const double scale = max_abs(ref.data.data(), ref.rows * V);
  DirectState st(*l.backend, l.model->config(), limits(1, 16));
  auto seq = st.open_sequence();
  std::vector<SequenceInput> b(1);
  b[0].state = &*seq;
  b[0].all_logits = true;
  int64_t begin = 0;
  for (int64_t n : {37, 50, 63}) {  // pieces that do not line up with 64-token chunks or 16-token blocks
    b[0].tokens.assign(ids.begin() + begin, ids.begin() + begin + n);
    auto out = st.forward(*l.model, b);
    ASSERT_TRUE(out.ok());
    ASSERT_EQ(out->rows, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_LE(max_diff(out->row(i), ref.row(begin + i), V) / scale, kOrderTol) << "position " << begin + i;
    begin += n;
  }
}

TEST_P(FixtureModel, BatchedSequencesEqualEachAloneBitwise) {
  // Every op computes each row (and each sequence's state) independently of the other rows, in the
  // same order, so batching must not change a single bit.
  Loaded l = load(fixture_dir(GetParam()));
  ASSERT_TRUE(l.model);
  std::vector<int32_t> a = prompt_ids(GetParam(), "medium"), c = prompt_ids(GetParam(), "short");
  std::vector<int32_t> a_next = {5, 17, 900}, c_more = {1, 2, 3, 4, 5, 6, 7};

  // Alone: a prefill then 3 decode steps; c prefill then a 7-token chunk then one decode.
  auto run_alone = [&](const std::vector<std::vector<int32_t>>& steps) {
    DirectState st(*l.backend, l.model->config(), limits(1, 16));
    auto seq = st.open_sequence();
    std::vector<Logits> outs;
    for (auto& s : steps) {
      std::vector<SequenceInput> b(1);
      b[0].state = &*seq;
      b[0].tokens = s;
      auto o = st.forward(*l.model, b);
      EXPECT_TRUE(o.ok());
      outs.push_back(*o);
    }
    return outs;
  };
  auto A = run_alone({a, {a_next[0]}, {a_next[1]}, {a_next[2]}});
  auto C = run_alone({c, c_more, {42}});

  // Together: step 1 = both prefills; step 2 = a decode + c chunk; step 3 = both decode;
  // step 4 = a decode alone in a batch of one.
  DirectState st(*l.backend, l.model->config(), limits(2, 32));
  auto sa = st.open_sequence(), sc = st.open_sequence();
  ASSERT_TRUE(sa.ok() && sc.ok());
  auto batch2 = [&](std::vector<int32_t> ta, std::vector<int32_t> tc) {
    std::vector<SequenceInput> b(2);
    b[0].state = &*sa;
    b[0].tokens = std::move(ta);
    b[1].state = &*sc;
    b[1].tokens = std::move(tc);
    auto o = st.forward(*l.model, b);
    EXPECT_TRUE(o.ok());
    return *o;
  };
  const int64_t V = A[0].vocab;
  auto same = [&](const Logits& batched, int64_t row, const Logits& alone) {
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(batched.row(row)[i], alone.row(0)[i]) << "vocab " << i;
  };
  Logits s1 = batch2(a, c);
  same(s1, 0, A[0]);
  same(s1, 1, C[0]);
  Logits s2 = batch2({a_next[0]}, c_more);
  same(s2, 0, A[1]);
  same(s2, 1, C[1]);
  Logits s3 = batch2({a_next[1]}, {42});
  same(s3, 0, A[2]);
  same(s3, 1, C[2]);
  std::vector<SequenceInput> b(1);
  b[0].state = &*sa;
  b[0].tokens = {a_next[2]};
  auto s4 = st.forward(*l.model, b);
  ASSERT_TRUE(s4.ok());
  same(*s4, 0, A[3]);
}

TEST_P(FixtureModel, ArgmaxRowsMatchTheSamplersArgmaxOfTheFullRows) {
  // A batch where one sequence asks only for its greedy choice (over all columns, then over fewer)
  // and the other for its values: the choice equals the CPU sampler's argmax of the full row, and the
  // other row's values are the ones a full download gives.
  Loaded l = load(fixture_dir(GetParam()));
  ASSERT_TRUE(l.model);
  std::vector<int32_t> a = prompt_ids(GetParam(), "medium"), c = prompt_ids(GetParam(), "short");
  for (int64_t limit : {int64_t{1} << 40, int64_t{700}}) {
    std::vector<Logits> outs;
    for (bool argmax : {false, true}) {
      DirectState st(*l.backend, l.model->config(), limits(2, 32));
      auto sa = st.open_sequence(), sc = st.open_sequence();
      ASSERT_TRUE(sa.ok() && sc.ok());
      std::vector<SequenceInput> b(2);
      b[0].state = &*sa;
      b[0].tokens = a;
      b[0].argmax_vocab = argmax ? limit : 0;
      b[1].state = &*sc;
      b[1].tokens = c;
      auto o = st.forward(*l.model, b);
      ASSERT_TRUE(o.ok()) << o.message();
      outs.push_back(std::move(*o));
    }
    const Logits &full = outs[0], &mixed = outs[1];
    const int64_t V = full.vocab;
    ASSERT_TRUE(full.argmax.empty());
    ASSERT_EQ(mixed.rows, 2);
    ASSERT_EQ(mixed.argmax.size(), 2u);
    EXPECT_FALSE(mixed.has_values(0));
    EXPECT_TRUE(mixed.has_values(1));
    const int64_t n = std::min(limit, V);
    EXPECT_EQ(mixed.argmax[0].id, argmax_lowest(std::span<const float>(full.row(0), static_cast<size_t>(n))));
    EXPECT_EQ(mixed.argmax[0].nonfinite, -1);
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(mixed.row(1)[i], full.row(1)[i]) << "vocab " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureModel,
                         ::testing::Values("qwen35-moe-tiny", "qwen35-dense-tiny"));

TEST(DirectState, ErrorsLeaveStateUntouched) {
  Loaded l = load(fixture_dir("qwen35-dense-tiny-causallm"));
  ASSERT_TRUE(l.model);
  DirectState st(*l.backend, l.model->config(), limits(1, 2, 4));  // room for 8 tokens
  auto seq = st.open_sequence();
  ASSERT_TRUE(seq.ok());
  std::vector<SequenceInput> b(1);
  b[0].state = &*seq;
  b[0].tokens = {1, 2, 1000};
  auto r = st.forward(*l.model, b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("token id 1000 is out of range [0, 1000)"), std::string::npos) << r.message();
  EXPECT_EQ(seq->num_tokens, 0);
  EXPECT_TRUE(seq->block_table.empty());

  b[0].tokens = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(st.forward(*l.model, b).ok());
  b[0].tokens = {7, 8, 9};
  r = st.forward(*l.model, b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("KV cache full"), std::string::npos) << r.message();
  EXPECT_EQ(seq->num_tokens, 6);
  EXPECT_EQ(seq->block_table.size(), 2u);

  // One sequence twice in a batch.
  std::vector<SequenceInput> twice(2);
  twice[0].state = twice[1].state = &*seq;
  twice[0].tokens = twice[1].tokens = {1};
  r = st.forward(*l.model, twice);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("share one state"), std::string::npos) << r.message();
  EXPECT_EQ(seq->num_tokens, 6);

  // The second sequence finds no GDN slot.
  auto other = st.open_sequence();
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("no free GDN state slot"), std::string::npos);
  st.close_sequence(*seq);
  EXPECT_EQ(st.free_blocks(), 2);
  EXPECT_TRUE(st.open_sequence().ok());
}

TEST(KvBlockPool, HandsOutEachBlockOnceAndCountsHolders) {
  KvBlockPool a(3);
  std::vector<int32_t> got;
  while (auto b = a.allocate()) got.push_back(*b);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(a.num_available(), 0);
  a.retain(1);
  a.release(1);
  EXPECT_EQ(a.num_available(), 0);  // still held once
  a.release(1);
  EXPECT_EQ(a.allocate().value(), 1);
}

TEST(GdnSlots, ZeroAndCopyRows) {
  auto backend = make_cpu_backend(1);
  GdnDims d{1, 2, 4, 3, 4};
  GdnSlots slots(*backend, 2, /*slots=*/1, /*snapshots=*/2, d);
  ASSERT_EQ(slots.num_rows(), 3);
  for (int l = 0; l < 2; ++l) {
    const Tensor& r = slots.recurrent_pool(l);
    const Tensor& c = slots.conv_pool(l);
    for (int64_t i = 0; i < r.numel(); ++i) r.ptr<float>()[i] = static_cast<float>(i + 100 * l);
    for (int64_t i = 0; i < c.numel(); ++i) c.ptr<float>()[i] = static_cast<float>(-i - 100 * l);
  }
  std::vector<TensorCopy> copies;
  slots.add_row_copies(0, 2, copies);
  EXPECT_EQ(copies.size(), 4u);  // conv and recurrent rows of 2 layers
  backend->copy_batch(copies);
  slots.zero_row(0);
  for (int l = 0; l < 2; ++l) {
    const Tensor r = slots.recurrent_pool(l), c = slots.conv_pool(l);
    const int64_t rn = r.numel() / 3, cn = c.numel() / 3;
    EXPECT_EQ(max_abs(r.ptr<float>(), rn), 0.0);
    EXPECT_EQ(max_abs(c.ptr<float>(), cn), 0.0);
    for (int64_t i = 0; i < rn; ++i) ASSERT_EQ(r.ptr<float>()[2 * rn + i], static_cast<float>(i + 100 * l));
    for (int64_t i = 0; i < cn; ++i) ASSERT_EQ(c.ptr<float>()[2 * cn + i], static_cast<float>(-i - 100 * l));
    for (int64_t i = 0; i < rn; ++i) ASSERT_EQ(r.ptr<float>()[rn + i], static_cast<float>(rn + i + 100 * l));
  }
  // Per layer: recurrent Hv*dk*dv = 2*4*3 floats, conv conv_dim*(K-1) = (2*1*4 + 2*3)*3 floats.
  EXPECT_EQ(slots.row_bytes(), 2 * (2 * 4 * 3 + 14 * 3) * 4);
}

// A bf16 recurrent state (--gdn-state-dtype bfloat16): the recurrent pools are bf16, the conv pools
// stay f32, a row costs 2 bytes per recurrent value; zeroing and row copies move bf16 bits.
TEST(GdnSlots, Bf16RecurrentState) {
  auto backend = make_cpu_backend(1);
  GdnDims d{1, 2, 4, 3, 4};
  GdnSlots slots(*backend, 2, /*slots=*/1, /*snapshots=*/1, d, DType::kBF16);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(slots.recurrent_pool(l).dtype, DType::kBF16);
    EXPECT_EQ(slots.conv_pool(l).dtype, DType::kF32);
    const Tensor& r = slots.recurrent_pool(l);
    for (int64_t i = 0; i < r.numel(); ++i) r.ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i + 1));
  }
  EXPECT_EQ(slots.row_bytes(), 2 * (2 * 4 * 3 * 2 + 14 * 3 * 4));
  std::vector<TensorCopy> copies;
  slots.add_row_copies(0, 1, copies);
  backend->copy_batch(copies);
  slots.zero_row(0);
  for (int l = 0; l < 2; ++l) {
    const Tensor& r = slots.recurrent_pool(l);
    const int64_t rn = r.numel() / 2;
    for (int64_t i = 0; i < rn; ++i) {
      ASSERT_EQ(r.ptr<uint16_t>()[i], 0);
      ASSERT_EQ(bf16_to_f32(r.ptr<uint16_t>()[rn + i]), static_cast<float>(i + 1));
    }
  }
}

}  // namespace
}  // namespace sparkserve::test
