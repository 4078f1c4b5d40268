// Gated-attention ops vs double formulas: query/gate split, partial rotate-half RoPE, and paged
// attention (shuffled block tables, GQA, prefill + decode spans in one batch) vs naive contiguous
// attention in double.
#include <algorithm>
#include <numeric>

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

void check_paged_attention(int64_t nh, int64_t kvh, int64_t hd, int64_t block_size, std::vector<SeqCase> seqs) {
  // Full per-sequence k/v history (positions [0, start + n)) and the new queries.
  int64_t T = 0, total_blocks = 0;
  for (auto& s : seqs) {
    T += s.n;
    total_blocks += (s.start + s.n + block_size - 1) / block_size;
  }
  HostTensor k_pool(DType::kF32, {total_blocks + 3, block_size, kvh, hd}), v_pool(DType::kF32, {total_blocks + 3, block_size, kvh, hd});
  // Blocks handed out in a shuffled order so that logical order != physical order.
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks + 3));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  std::vector<std::vector<int32_t>> tables;
  std::vector<HostTensor> hist_k, hist_v;
  BatchLayout batch;
  batch.total_rows = T;
  HostTensor q = random_f32({T, nh, hd}), k_new(DType::kF32, {T, kvh, hd}), v_new(DType::kF32, {T, kvh, hd});
  size_t next = 0;
  int64_t row = 0;
  for (auto& s : seqs) {
    const int64_t len = s.start + s.n, nb = (len + block_size - 1) / block_size;
    tables.emplace_back(ids.begin() + static_cast<long>(next), ids.begin() + static_cast<long>(next + nb));
    next += static_cast<size_t>(nb);
    hist_k.push_back(random_f32({len, kvh, hd}));
    hist_v.push_back(random_f32({len, kvh, hd}));
    // Old positions go straight into the pool (as earlier steps would have written them).
    for (int64_t p = 0; p < s.start; ++p) {
      int32_t b = tables.back()[static_cast<size_t>(p / block_size)];
      std::copy_n(hist_k.back().f() + p * kvh * hd, kvh * hd, k_pool.f() + (b * block_size + p % block_size) * kvh * hd);
      std::copy_n(hist_v.back().f() + p * kvh * hd, kvh * hd, v_pool.f() + (b * block_size + p % block_size) * kvh * hd);
    }
    std::copy_n(hist_k.back().f() + s.start * kvh * hd, s.n * kvh * hd, k_new.f() + row * kvh * hd);
    std::copy_n(hist_v.back().f() + s.start * kvh * hd, s.n * kvh * hd, v_new.f() + row * kvh * hd);
    row += s.n;
  }
  row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SeqSpan sp;
    sp.row_begin = row;
    sp.num_tokens = seqs[i].n;
    sp.start_pos = seqs[i].start;
    sp.block_table = tables[i].data();
    sp.num_blocks = static_cast<int64_t>(tables[i].size());
    batch.seqs.push_back(sp);
    row += seqs[i].n;
  }
  backend().kv_cache_write(k_pool, v_pool, k_new, v_new, batch);
  AttentionDims d{nh, kvh, hd, block_size, static_cast<float>(1.0 / std::sqrt(double(hd)))};
  HostTensor out(DType::kF32, {T, nh, hd});
  backend().attention(out, q, k_pool, v_pool, batch, d);

  // Naive contiguous attention in double.
  std::vector<double> want;
  row = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    for (int64_t i = 0; i < seqs[si].n; ++i, ++row) {
      const int64_t len = seqs[si].start + i + 1;
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / (nh / kvh);
        std::vector<double> sc(static_cast<size_t>(len));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < len; ++j) {
          double s = 0;
          for (int64_t c = 0; c < hd; ++c) s += double(q.f()[(row * nh + h) * hd + c]) * hist_k[si].f()[(j * kvh + g) * hd + c];
          sc[static_cast<size_t>(j)] = s / std::sqrt(double(hd));
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t c = 0; c < hd; ++c) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += sc[static_cast<size_t>(j)] / sum * hist_v[si].f()[(j * kvh + g) * hd + c];
          want.push_back(o);
        }
      }
    }
  }
  // Softmax-weighted averages of O(1) values: fp32 error ~ len * 2^-24 relative; 2e-5 absolute
  // covers len <= 200 with margin.
  expect_close(out.f(), want, 1e-5, 2e-5, "paged attention");
}

TEST(CpuOps, PagedAttentionEqualsNaiveAttention) {
  check_paged_attention(4, 2, 32, 16, {{0, 37}});                     // one prefill, GQA 2
  check_paged_attention(4, 1, 16, 4, {{10, 1}, {0, 9}, {33, 1}});     // decode + prefill mix, GQA 4
  check_paged_attention(6, 6, 8, 5, {{20, 13}, {3, 2}});               // chunk continuing a prefix, MHA
  check_paged_attention(8, 2, 24, 16, {{150, 1}});                     // long decode
}

}  // namespace
}  // namespace sparkserve::test
