// The bf16 recurrent state pool (backend/ops.h, "The recurrent state pool"): every GDN op that takes
// the pool computes, from a bf16 pool, exactly what it computes from the same values widened to f32,
// and stores each value it writes rounded to nearest even once (at a span's end and at each save),
// bit for bit; outputs are bit for bit those of the f32 op; rows no span touches are left as they
// were; gdn_verify writes nothing. Spans of 1 token (decode), 1..4 tokens (a speculative commit),
// 150 and 9 tokens (chunked prefill over three chunks), with saves inside and at the end of chunks.
#include <algorithm>
#include <cstring>

#include "op_test_util.h"

namespace sparkserve::test {
namespace {

CpuBackend& backend() {
  static CpuBackend b(2);
  return b;
}

const GdnDims kDims{2, 6, 16, 24, 4};  // the MoE fixture's GDN: 3 value heads per key head, dv != dk

BatchLayout layout_of(const std::vector<int64_t>& lens, const std::vector<int32_t>& slots) {
  BatchLayout b;
  for (size_t i = 0; i < lens.size(); ++i) {
    SeqSpan s;
    s.row_begin = b.total_rows;
    s.num_tokens = lens[i];
    s.gdn_slot = slots[i];
    b.seqs.push_back(s);
    b.total_rows += lens[i];
  }
  return b;
}

// A bf16 pool of random values and the same values as an f32 pool.
struct Pools {
  HostTensor bf16, f32;
};
Pools random_pools(int64_t rows) {
  const std::vector<int64_t> shape = {rows, kDims.num_v_heads, kDims.k_head_dim, kDims.v_head_dim};
  std::vector<double> values;
  Pools p{random_bf16(shape, values, 0.5f), HostTensor(DType::kF32, shape)};
  for (int64_t i = 0; i < p.f32.n(); ++i) p.f32.f()[i] = static_cast<float>(values[static_cast<size_t>(i)]);
  return p;
}

// The bf16 pool holds f32_to_bf16 of the f32 pool, every element.
void expect_rounded(const Pools& p, const char* what) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < p.f32.n(); ++i)
    if (p.bf16.h()[i] != f32_to_bf16(p.f32.f()[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0) << what << ": first mismatch at element " << first;
}

// Random gdn inputs for T rows: qkv, g <= 0, beta in (0, 1).
struct Inputs {
  HostTensor qkv, g, beta;
};
Inputs random_inputs(int64_t T) {
  Inputs in{random_f32({T, kDims.conv_dim()}), HostTensor(DType::kF32, {T, kDims.num_v_heads}),
            HostTensor(DType::kF32, {T, kDims.num_v_heads})};
  std::uniform_real_distribution<float> ug(-0.5f, -0.001f), ub(0.05f, 0.95f);
  for (int64_t i = 0; i < in.g.n(); ++i) {
    in.g.f()[i] = ug(rng());
    in.beta.f()[i] = ub(rng());
  }
  return in;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.n() == b.n() && std::memcmp(a.t.data, b.t.data, a.t.nbytes()) == 0;
}

enum class Op { kRecurrent, kChunked };

void check_op(Op op, const std::vector<int64_t>& lens, const std::vector<int32_t>& slots,
              const std::vector<std::vector<GdnStateSave>>& saves, int64_t rows, const char* what) {
  BatchLayout batch = layout_of(lens, slots);
  for (size_t i = 0; i < saves.size(); ++i) {
    batch.seqs[i].saves = saves[i].data();
    batch.seqs[i].num_saves = static_cast<int64_t>(saves[i].size());
  }
  const int64_t T = batch.total_rows;
  const Inputs in = random_inputs(T);
  Pools p = random_pools(rows);
  HostTensor o16(DType::kF32, {T, kDims.num_v_heads, kDims.v_head_dim}), o32(DType::kF32, o16.t.shape);
  if (op == Op::kRecurrent) {
    backend().gdn_recurrent(o16, in.qkv, in.g, in.beta, p.bf16, batch, kDims);
    backend().gdn_recurrent(o32, in.qkv, in.g, in.beta, p.f32, batch, kDims);
  } else {
    backend().gdn_chunked(o16, in.qkv, in.g, in.beta, p.bf16, batch, kDims);
    backend().gdn_chunked(o32, in.qkv, in.g, in.beta, p.f32, batch, kDims);
  }
  EXPECT_TRUE(same_bits(o16, o32)) << what << ": outputs";
  expect_rounded(p, what);
}

TEST(GdnStateBf16, RecurrentIsTheF32OpRoundedOnce) {
  // Decode: single-token spans on shuffled slots of a pool with rows no span touches, one with a save.
  check_op(Op::kRecurrent, {1, 1, 1}, {4, 0, 2}, {{}, {{1, 5}}, {}}, 7, "decode");
  // A commit of accepted prefixes (1..4 tokens), saves after the first and the last token.
  check_op(Op::kRecurrent, {4, 1, 3, 2}, {1, 3, 0, 2}, {{{1, 4}, {4, 5}}, {}, {{3, 6}}, {}}, 8, "commit");
}

TEST(GdnStateBf16, ChunkedIsTheF32OpRoundedOnce) {
  check_op(Op::kChunked, {150, 9}, {1, 0}, {{{1, 2}, {40, 3}, {64, 4}, {100, 5}, {150, 6}}, {{7, 7}}}, 9, "prefill");
  check_op(Op::kChunked, {64, 130}, {2, 0}, {{}, {}}, 3, "prefill, no saves");
}

// One rounding per call: a two-token span is the f32 span rounded once, which is not two single-token
// calls (each rounding its state) on these random inputs.
TEST(GdnStateBf16, ASpanRoundsOnceNotPerToken) {
  const Inputs in = random_inputs(2);
  Pools once = random_pools(1), twice = random_pools(1);
  std::copy_n(once.bf16.h(), once.bf16.n(), twice.bf16.h());
  HostTensor o(DType::kF32, {2, kDims.num_v_heads, kDims.v_head_dim});
  backend().gdn_recurrent(o, in.qkv, in.g, in.beta, once.bf16, layout_of({2}, {0}), kDims);
  for (int64_t t = 0; t < 2; ++t) {
    BatchLayout one = layout_of({1}, {0});
    one.seqs[0].row_begin = t;
    one.total_rows = 2;
    backend().gdn_recurrent(o, in.qkv, in.g, in.beta, twice.bf16, one, kDims);
  }
  int64_t differ = 0;
  for (int64_t i = 0; i < once.bf16.n(); ++i) differ += once.bf16.h()[i] != twice.bf16.h()[i];
  EXPECT_GT(differ, 0);
}

// gdn_verify reads a bf16 pool (widened) and writes nothing: its outputs are those of gdn_recurrent
// over the same spans (the commit of the whole span), bit for bit, and both pools stay as they were.
TEST(GdnStateBf16, VerifyReadsTheWidenedStateAndWritesNothing) {
  const int64_t C = kDims.conv_dim(), K = kDims.conv_kernel;
  const BatchLayout batch = layout_of({3, 1, 4}, {2, 0, 1});
  const int64_t T = batch.total_rows;
  const Inputs in = random_inputs(T);
  HostTensor mixed = random_f32({T, C}), w = random_f32({C, K}, 0.5f), conv = random_f32({3, C, K - 1});
  Pools p = random_pools(3);
  const std::vector<uint16_t> before(p.bf16.h(), p.bf16.h() + p.bf16.n());
  const std::vector<float> conv0(conv.f(), conv.f() + conv.n());
  HostTensor qkv(DType::kF32, {T, C}), out(DType::kF32, {T, kDims.num_v_heads, kDims.v_head_dim});
  backend().gdn_verify(out, qkv, mixed, w, in.g, in.beta, conv, p.bf16, batch, kDims);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), p.bf16.h()));
  EXPECT_TRUE(std::equal(conv0.begin(), conv0.end(), conv.f()));
  HostTensor out32(DType::kF32, out.t.shape);
  backend().gdn_recurrent(out32, qkv, in.g, in.beta, p.f32, batch, kDims);
  EXPECT_TRUE(same_bits(out, out32));
}

// The fused decode chain's CPU form (Backend::gdn_decode_step, the composition of the ops) from a
// bf16 pool: the f32 chain's output and conv state bit for bit, the recurrent state rounded once.
TEST(GdnStateBf16, DecodeStepIsTheF32ChainRoundedOnce) {
  const int64_t C = kDims.conv_dim(), K = kDims.conv_kernel, Hv = kDims.num_v_heads, dv = kDims.v_head_dim, H = 40;
  const BatchLayout batch = layout_of({1, 1}, {2, 0});
  const int64_t T = batch.total_rows;
  HostTensor h = random_f32({T, H}), mixed = random_f32({T, C}), z = random_f32({T, Hv * dv}),
             wa = random_f32({Hv, H}, 0.3f), wb = random_f32({Hv, H}, 0.3f), conv_w = random_f32({C, K}, 0.5f),
             A_log = random_f32({Hv}, 0.5f), dt = random_f32({Hv}, 0.5f), norm_w = random_f32({dv}, 0.3f);
  HostTensor conv16 = random_f32({3, C, K - 1}), conv32(DType::kF32, conv16.t.shape);
  std::copy_n(conv16.f(), conv16.n(), conv32.f());
  Pools p = random_pools(3);
  HostTensor o16(DType::kF32, {T, Hv * dv}), o32(DType::kF32, {T, Hv * dv});
  const Linear la = make_linear(wa, Hv, H), lb = make_linear(wb, Hv, H);
  backend().gdn_decode_step(o16, h, mixed, z, la, lb, conv_w, A_log, dt, norm_w, 1e-6f, conv16, p.bf16, batch, kDims);
  backend().gdn_decode_step(o32, h, mixed, z, la, lb, conv_w, A_log, dt, norm_w, 1e-6f, conv32, p.f32, batch, kDims);
  EXPECT_TRUE(same_bits(o16, o32));
  EXPECT_TRUE(same_bits(conv16, conv32));
  expect_rounded(p, "decode step");
}

}  // namespace
}  // namespace sparkserve::test
