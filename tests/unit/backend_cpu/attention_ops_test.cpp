// Gated-attention ops vs double formulas: query/gate split, partial rotate-half RoPE, and paged
// attention (shuffled block tables, GQA, prefill + decode spans in one batch) vs naive contiguous
// attention in double.
#include <algorithm>
#include <numeric>
#include <tuple>

#include "core/fp8_quant.h"
#include "op_test_util.h"

namespace sparkserve::test {
namespace {

CpuBackend& backend() {
  static CpuBackend b(2);
  return b;
}

TEST(CpuOps, SplitQueryGateIsPerHead) {
  const int64_t T = 3, nh = 4, hd = 5;
  HostTensor qg = random_f32({T, nh, 2 * hd}), q(DType::kF32, {T, nh, hd}), g(DType::kF32, {T, nh, hd});
  backend().split_query_gate(q, g, qg);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < hd; ++i) {
        ASSERT_EQ(q.f()[(t * nh + h) * hd + i], qg.f()[(t * nh + h) * 2 * hd + i]);
        ASSERT_EQ(g.f()[(t * nh + h) * hd + i], qg.f()[(t * nh + h) * 2 * hd + hd + i]);
      }
}

TEST(CpuOps, RopeRotatesFirstRotaryDimsPairingIWithIPlusHalf) {
  for (auto [rd, hd, theta] : {std::tuple<int64_t, int64_t, double>{8, 32, 1e7}, {16, 32, 1e6}, {64, 64, 1e4}}) {
    const int64_t T = 6, heads = 3;
    HostTensor x = random_f32({T, heads, hd}), pos(DType::kI32, {T});
    int32_t p[T] = {0, 1, 7, 63, 64, 120};
    std::copy(p, p + T, pos.i());
    std::vector<float> orig(x.f(), x.f() + x.n());
    backend().rope(x, pos, rd, theta);
    std::vector<double> want(orig.begin(), orig.end());
    const int64_t half = rd / 2;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          double ang = p[t] * std::pow(theta, -2.0 * i / rd);
          const float* o = &orig[static_cast<size_t>((t * heads + h) * hd)];
          want[static_cast<size_t>((t * heads + h) * hd + i)] = o[i] * std::cos(ang) - o[i + half] * std::sin(ang);
          want[static_cast<size_t>((t * heads + h) * hd + i + half)] = o[i + half] * std::cos(ang) + o[i] * std::sin(ang);
        }
    // The op computes the angle in fp32 as HF does (pos * fp32 inv_freq): at |angle| <= 120 rad its
    // rounding is <= 120 * 2^-24 * 2 ~ 1.5e-5 rad, so |Δ| <= 2e-5 * |x| (|x| < ~5 here) + fp32 mults.
    expect_close(x.f(), want, 0, 1e-4, "rope");
    // Dims past rotary_dim pass through untouched.
    for (int64_t r = 0; r < T * heads; ++r)
      for (int64_t i = rd; i < hd; ++i) ASSERT_EQ(x.f()[r * hd + i], orig[static_cast<size_t>(r * hd + i)]);
  }
}

struct SeqCase {
  int64_t start, n;
};

// The value a pool of `dtype` holds for row x[hd] (KvPool in backend/ops.h), from the core
// conversions: bf16 round to nearest even; fp8 e4m3 of x / s with s = max(amax / 448, 1/(448*512)).
std::vector<double> stored_row(DType dtype, const float* x, int64_t hd) {
  std::vector<double> out(static_cast<size_t>(hd));
  float amax = 0;
  for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
  for (int64_t i = 0; i < hd; ++i) {
    if (dtype == DType::kF32) out[static_cast<size_t>(i)] = x[i];
    if (dtype == DType::kBF16) out[static_cast<size_t>(i)] = round_to_bf16(x[i]);
    if (dtype == DType::kF8E4M3) out[static_cast<size_t>(i)] = double(fp8_e4m3_to_f32(f32_to_fp8_e4m3(x[i] / s))) * s;
  }
  return out;
}

// Pools of `dtype` (with their fp8 scales) owned by the test.
struct TestPool {
  HostTensor k, v, ks, vs;
  KvPool pool;
  TestPool(DType dtype, int64_t blocks, int64_t block_size, int64_t kvh, int64_t hd)
      : k(dtype, {blocks, block_size, kvh, hd}), v(dtype, {blocks, block_size, kvh, hd}),
        ks(DType::kF32, {blocks, block_size, kvh}), vs(DType::kF32, {blocks, block_size, kvh}) {
    pool = {k, v, dtype == DType::kF8E4M3 ? ks.t : Tensor(), dtype == DType::kF8E4M3 ? vs.t : Tensor()};
  }
};

void check_paged_attention(DType dtype, int64_t nh, int64_t kvh, int64_t hd, int64_t block_size,
                           std::vector<SeqCase> seqs) {
  // Full per-sequence k/v history (positions [0, start + n)) and the new queries.
  int64_t T = 0, total_blocks = 0, old = 0;
  for (auto& s : seqs) {
    T += s.n;
    old += s.start;
    total_blocks += (s.start + s.n + block_size - 1) / block_size;
  }
  TestPool P(dtype, total_blocks + 3, block_size, kvh, hd);
  // Blocks handed out in a shuffled order so that logical order != physical order.
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks + 3));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  std::vector<std::vector<int32_t>> tables;
  std::vector<HostTensor> hist_k, hist_v;
  BatchLayout batch, history;
  batch.total_rows = T;
  history.total_rows = old;
  HostTensor q = random_f32({T, nh, hd}), k_new(DType::kF32, {T, kvh, hd}), v_new(DType::kF32, {T, kvh, hd});
  HostTensor k_old(DType::kF32, {old, kvh, hd}), v_old(DType::kF32, {old, kvh, hd});
  size_t next = 0;
  int64_t row = 0, old_row = 0;
  for (auto& s : seqs) {
    const int64_t len = s.start + s.n, nb = (len + block_size - 1) / block_size;
    tables.emplace_back(ids.begin() + static_cast<long>(next), ids.begin() + static_cast<long>(next + nb));
    next += static_cast<size_t>(nb);
    hist_k.push_back(random_f32({len, kvh, hd}));
    hist_v.push_back(random_f32({len, kvh, hd}, 2.0f));
    // Old positions are written by an earlier batch (as earlier steps would have written them).
    std::copy_n(hist_k.back().f(), s.start * kvh * hd, k_old.f() + old_row * kvh * hd);
    std::copy_n(hist_v.back().f(), s.start * kvh * hd, v_old.f() + old_row * kvh * hd);
    std::copy_n(hist_k.back().f() + s.start * kvh * hd, s.n * kvh * hd, k_new.f() + row * kvh * hd);
    std::copy_n(hist_v.back().f() + s.start * kvh * hd, s.n * kvh * hd, v_new.f() + row * kvh * hd);
    row += s.n;
    old_row += s.start;
  }
  row = old_row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SeqSpan sp;
    sp.row_begin = row;
    sp.num_tokens = seqs[i].n;
    sp.start_pos = seqs[i].start;
    sp.block_table = tables[i].data();
    sp.num_blocks = static_cast<int64_t>(tables[i].size());
    batch.seqs.push_back(sp);
    row += seqs[i].n;
    if (seqs[i].start == 0) continue;
    SeqSpan h = sp;
    h.row_begin = old_row;
    h.num_tokens = seqs[i].start;
    h.start_pos = 0;
    history.seqs.push_back(h);
    old_row += seqs[i].start;
  }
  if (old > 0) backend().kv_cache_write(P.pool, k_old, v_old, history);
  backend().kv_cache_write(P.pool, k_new, v_new, batch);
  AttentionDims d{nh, kvh, hd, block_size, static_cast<float>(1.0 / std::sqrt(double(hd)))};
  HostTensor out(DType::kF32, {T, nh, hd});
  backend().attention(out, q, P.pool, batch, d);

  // Naive contiguous attention in double over the values the pool must hold.
  std::vector<double> want;
  row = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const int64_t len = seqs[si].start + seqs[si].n;
    std::vector<std::vector<double>> ks, vs;  // [pos * kvh + g][hd]
    for (int64_t r = 0; r < len * kvh; ++r) {
      ks.push_back(stored_row(dtype, hist_k[si].f() + r * hd, hd));
      vs.push_back(stored_row(dtype, hist_v[si].f() + r * hd, hd));
    }
    for (int64_t i = 0; i < seqs[si].n; ++i, ++row) {
      const int64_t n_keys = seqs[si].start + i + 1;
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / (nh / kvh);
        std::vector<double> sc(static_cast<size_t>(n_keys));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n_keys; ++j) {
          double s = 0;
          for (int64_t c = 0; c < hd; ++c) s += double(q.f()[(row * nh + h) * hd + c]) * ks[static_cast<size_t>(j * kvh + g)][c];
          sc[static_cast<size_t>(j)] = s / std::sqrt(double(hd));
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t c = 0; c < hd; ++c) {
          double o = 0;
          for (int64_t j = 0; j < n_keys; ++j) o += sc[static_cast<size_t>(j)] / sum * vs[static_cast<size_t>(j * kvh + g)][c];
          want.push_back(o);
        }
      }
    }
  }
  // Softmax-weighted averages of O(1) values: fp32 error ~ len * 2^-24 relative; 4e-5 absolute
  // covers len <= 200 with margin (values up to ~8).
  expect_close(out.f(), want, 1e-5, 4e-5, "paged attention");
}

TEST(CpuOps, PagedAttentionEqualsNaiveAttention) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(dtype_name(dt));
    check_paged_attention(dt, 4, 2, 32, 16, {{0, 37}});                     // one prefill, GQA 2
    check_paged_attention(dt, 4, 1, 16, 4, {{10, 1}, {0, 9}, {33, 1}});     // decode + prefill mix, GQA 4
    check_paged_attention(dt, 6, 6, 8, 5, {{20, 13}, {3, 2}});               // chunk continuing a prefix, MHA
    check_paged_attention(dt, 8, 2, 24, 16, {{150, 1}});                     // long decode
  }
}

// kv_cache_write stores exactly the rounded values: bf16 bits of round-to-nearest-even, fp8 codes
// and per-(position, head) scales of the dynamic per-row rule; a zero row gets the floor scale.
TEST(CpuOps, KvCacheWriteRoundsToThePoolDtype) {
  const int64_t bs = 4, kvh = 2, hd = 24, T = 6;
  std::vector<int32_t> table = {2, 0};
  BatchLayout batch;
  SeqSpan sp;
  sp.num_tokens = T;
  sp.start_pos = 1;
  sp.block_table = table.data();
  sp.num_blocks = 2;
  batch.seqs.push_back(sp);
  batch.total_rows = T;
  HostTensor k = random_f32({T, kvh, hd}, 3.0f), v = random_f32({T, kvh, hd}, 0.01f);
  std::fill_n(k.f() + 2 * kvh * hd, hd, 0.0f);  // token 2, head 0: all zeros
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    TestPool P(dt, 3, bs, kvh, hd);
    backend().kv_cache_write(P.pool, k, v, batch);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t pos = 1 + t, r = (table[static_cast<size_t>(pos / bs)] * bs + pos % bs) * kvh + h;
        for (const auto& [src, pool, sc] : {std::tuple{&k, &P.k, &P.ks}, std::tuple{&v, &P.v, &P.vs}}) {
          const float* x = src->f() + (t * kvh + h) * hd;
          if (dt == DType::kBF16) {
            for (int64_t i = 0; i < hd; ++i) ASSERT_EQ(pool->h()[r * hd + i], f32_to_bf16(x[i]));
            continue;
          }
          const float s = fp8_token_scale(x, hd);
          ASSERT_EQ(sc->f()[r], s);
          std::vector<uint8_t> codes(static_cast<size_t>(hd));
          fp8_quantize_row(x, hd, s, codes.data());
          float amax = 0;
          for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(x[i]));
          for (int64_t i = 0; i < hd; ++i) {
            const uint8_t code = static_cast<const uint8_t*>(pool->t.data)[r * hd + i];
            ASSERT_EQ(code, codes[static_cast<size_t>(i)]);
            // e4m3 keeps 3 mantissa bits: |value - x| <= 2^-4 |x| in the normal range, and at most
            // half the subnormal step (2^-10 s) below it.
            const float back = fp8_e4m3_to_f32(code) * s;
            ASSERT_LE(std::fabs(back - x[i]), std::max(std::fabs(x[i]) / 16, s / 1024) * 1.0001f);
          }
          if (amax == 0) {
            ASSERT_EQ(s, 1.0f / (448.0f * 512.0f));
          }
        }
      }
  }
}

}  // namespace
}  // namespace sparkserve::test
