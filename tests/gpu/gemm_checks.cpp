// gpu_ops checks of the tensor-core matmul paths (backend/cuda/fp8_gemm.cu, fp8_gemm_wgmma.cu,
// fp8_small_n.cu incl. its forced K splits, fp8_few_tokens.cu, bf16_gemm.cu, bf16_small_n.cu,
// bf16_few_tokens.cu) and of
// linear's dispatch around them, vs the CPU backend on fresh random inputs. Groups: gemm_fp8,
// gemm_bf16, gemm_router.
//
// Metric. Both backends compute sums of the same exact products in f32 (W8A8: q_x · q_w of two
// E4M3 codes; split-bf16: w · hi and w · lo), in different orders, so the difference of one output
// is bounded by the summation error, which scales with Σ_k |products|, not with the output (a sum
// that cancels can lose every digit and still be right). The check divides each |gpu - cpu| by
// s_t · ws[n] · ||q_x,t|| · ||q_w,n|| (bf16: ||w_n|| · ||x_t||), an upper bound of Σ_k |products|
// (Cauchy-Schwarz) that costs O((T + N) K) to compute, and takes the maximum ("norm-relative").
// The project's metric (max|d| / max|ref|) is printed beside it.
//
// Bounds. Recursive f32 summation of K terms in any order errs by at most γ_K Σ|terms| with
// γ_K ≈ K · 2^-24, so two f32 sums (CPU and GPU) differ by at most 2 K 2^-24 of the norm product:
// 3.7e-4 at K = 3072, 9.8e-4 at K = 8192 (the worst case; random data gives ~sqrt(K) times less).
// - W8A8 few-token, small-N, wgmma and cuBLASLt routes: exact f16 products (E4M3 values are exact in f16), f32 sums:
//   2 K 2^-24. They are also held to the GEMVs' own bound, 1e-5 of max|ref| (kFp32): the same
//   exact products summed in f32 in another order. (Hopper's FP8 tensor cores, measured and not
//   kept, were 1.3e-4..2.1e-4 of max|ref|: their partial sums keep ~14 significant bits.)
// - split-bf16: x = hi + lo to 2^-16 relative, plus the two f32 sums: 2^-16 + 2 K 2^-24.
// A wrong scale, a swapped operand or a missing half moves outputs by O(1) of the norm product.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/linear_probe.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

double fp32_sums_bound(int64_t K) { return 2.0 * static_cast<double>(K) * std::ldexp(1.0, -24); }

std::vector<uint8_t> bytes_of(Backend* b, const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.nbytes()));
  b->download(v.data(), t);
  return v;
}

// max_i |got_i - ref_i| / norm_i over a [T, N] output, norm_i = rn[t] * cn[n].
double norm_relative(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& rn,
                     const std::vector<double>& cn) {
  const size_t T = rn.size(), N = cn.size();
  if (got.size() != T * N || ref.size() != T * N) return INFINITY;
  double worst = 0;
  for (size_t t = 0; t < T; ++t)
    for (size_t n = 0; n < N; ++n) {
      const double d = std::fabs(static_cast<double>(got[t * N + n]) - ref[t * N + n]);
      if (!std::isfinite(d)) return INFINITY;
      const double nm = rn[t] * cn[n];
      if (nm == 0) {
        if (d != 0) return INFINITY;
        continue;
      }
      worst = std::max(worst, d / nm);
    }
  return worst;
}

// rn[t] = s_t · ||q_x,t|| and cn[n] = ws[n] · ||q_w,n|| of a W8A8 FP8 Linear. Static scales with P
// partitions: x is quantized once per partition's scale, and rn[t] is the largest of those (still
// an upper bound of Σ|products| for every row).
void fp8_norms(Harness& h, const QWeight& w, const std::vector<float>& x, int64_t T, int64_t K, int64_t N,
               int64_t P, bool dynamic, std::vector<double>& rn, std::vector<double>& cn) {
  const auto wq = bytes_of(h.cpu, w.w.cpu());
  const auto ws = h.cpu_f(w.ws);
  const auto is = h.cpu_f(w.is);
  rn.assign(static_cast<size_t>(T), 0.0);
  cn.assign(static_cast<size_t>(N), 0.0);
  std::vector<uint8_t> q(static_cast<size_t>(K));
  for (int64_t p = 0; p < (dynamic ? 1 : P); ++p)
    for (int64_t t = 0; t < T; ++t) {
      const float s = dynamic ? fp8_token_scale(x.data() + t * K, K) : is[static_cast<size_t>(p)];
      fp8_quantize_row(x.data() + t * K, K, s, q.data());
      double ss = 0;
      for (uint8_t c : q) ss += static_cast<double>(fp8_e4m3_to_f32(c)) * fp8_e4m3_to_f32(c);
      rn[static_cast<size_t>(t)] = std::max(rn[static_cast<size_t>(t)], s * std::sqrt(ss));
    }
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double v = fp8_e4m3_to_f32(wq[static_cast<size_t>(n * K + k)]);
      ss += v * v;
    }
    cn[static_cast<size_t>(n)] = ws[static_cast<size_t>(n)] * std::sqrt(ss);
  }
}

void test_fp8(Harness& h) {
  // 1. The activation codes (as the f16 values the tensor cores take) and scales, bit for bit, on
  // rows of very different magnitudes (a zero
  // row takes the minimum scale 1/(448·512); a tiny one quantizes mostly to subnormal codes).
  {
    const int64_t T = 37, K = 3056;  // no multiple of 64: the wgmma order pads the last chunk
    auto x = randn(T * K);
    const float mags[] = {1.0f, 0.0f, 1e-6f, 300.0f, 3e-3f};
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(t * K + k)] *= mags[t % 5];
    Pair xp = h.f32({T, K}, x);
    // Both k orders: x's (small-N, cuBLASLt) and the wgmma kernel's (rows padded to 64 with +0;
    // within a 64-chunk x's k = 16 t + 4 s + j at 16 s + 2 t + j % 2 + 8 (j / 2), linear_probe.h).
    for (const bool wgmma_order : {false, true}) {
      const int64_t ld = wgmma_order ? (K + 63) / 64 * 64 : K;
      auto pos = [&](int64_t k) {
        if (!wgmma_order) return k;
        const int64_t c = k / 64 * 64, p = k % 64, t = p / 16, st = p / 4 % 4, j = p % 4;
        return c + 16 * st + 2 * t + j % 2 + 8 * (j / 2);
      };
      Buffer values(h.gpu, DType::kF16, {T, ld}), scales(h.gpu, DType::kF32, {T});
      h.gpu->upload(values, std::vector<uint16_t>(static_cast<size_t>(T * ld), 0x7e00).data());  // f16 NaN
      if (!fp8_quantize_probe(*h.gpu, values, scales, xp.gpu(), wgmma_order)) {
        record("gemm_fp8", "quantize: not the CUDA backend", INFINITY, 0);
        return;
      }
      std::vector<uint16_t> gv(static_cast<size_t>(T * ld));
      h.gpu->download(gv.data(), values);
      const auto gs = h.get(h.gpu, scales);
      int64_t bad = 0;
      std::vector<uint8_t> q(static_cast<size_t>(K));
      for (int64_t t = 0; t < T; ++t) {
        const float s = fp8_token_scale(x.data() + t * K, K);
        fp8_quantize_row(x.data() + t * K, K, s, q.data());
        bad += gs[static_cast<size_t>(t)] != s;
        // The f16 value must be the code's value exactly (bitwise, -0 included); padding +0.
        std::vector<uint16_t> want(static_cast<size_t>(ld), 0);
        for (int64_t k = 0; k < K; ++k)
          want[static_cast<size_t>(pos(k))] = f32_to_f16(fp8_e4m3_to_f32(q[static_cast<size_t>(k)]));
        for (int64_t k = 0; k < ld; ++k) bad += gv[static_cast<size_t>(t * ld + k)] != want[static_cast<size_t>(k)];
      }
      record("gemm_fp8", std::string("quantized values+scales differing ") + (wgmma_order ? "(wgmma order) " : "") +
                             "TxK " + sz({T, K}),
             static_cast<double>(bad), kExact);
    }
  }
  // 2. The GEMM through each FP8 path vs the CPU. Prefill-like and batched-decode T (the small-N
  // kernel runs T > 64 in pieces of 64), rows and T that are no multiple of 16, K of the 122B (3072,
  // out_proj 8192, shared down 1024) and one no multiple of 64 (the small-N kernel declines it), two
  // partitions with static per-partition scales, per-tensor weight scales.
  struct Case {
    int64_t T, N, K, P;
    WeightFormat fmt;
    ActivationQuant act;
  };
  const auto dyn = ActivationQuant::kFp8TokenDynamic, stat = ActivationQuant::kFp8TensorStatic;
  std::vector<Case> cases = {
      {256, 2048, 3072, 1, WeightFormat::kFp8Channel, dyn}, {100, 1000, 3072, 2, WeightFormat::kFp8Channel, dyn},
      {64, 3072, 8192, 1, WeightFormat::kFp8Channel, dyn},  {203, 3072, 1024, 1, WeightFormat::kFp8Tensor, stat},
      {37, 520, 1024, 2, WeightFormat::kFp8Tensor, stat},   {65, 1000, 1040, 1, WeightFormat::kFp8Channel, dyn},
  };
  for (int64_t T : {1, 2, 3, 4, 8, 16, 32, 48, 64}) cases.push_back({T, 1536, 3072, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({16, 1000, 1040, 1, WeightFormat::kFp8Channel, dyn});  // small T, K % 64 != 0
  // The few-token kernel's clusters of K splits (fp8_few_tokens.cu): the 122B's qkv at a verify step's
  // T (96 row blocks), out_proj's K at 3 tokens (16 splits of 8 chunks), 3 chunks (one split), static
  // per-partition scales, a K of 16384 (a slice of 1024 at 16 splits), rows no multiple of 128.
  cases.push_back({2, 12288, 3072, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({3, 3072, 8192, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({4, 1000, 192, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({3, 520, 1024, 2, WeightFormat::kFp8Tensor, stat});
  cases.push_back({4, 200, 16384, 1, WeightFormat::kFp8Channel, dyn});
  // The small-N kernel's clusters of K splits (fp8_small_n.cu, T = 5..64 from codes): the 122B's qkv
  // at 5 tokens (96 row blocks), out_proj's K 8192 at 12 (16 splits), 3 chunks at 16 (one split, no
  // cluster reduction, rows no multiple of 128), static per-partition scales at 9, two dynamic-scale
  // partitions at 7 (one launch over both), the shared down at 33 (four token tiles, the last one
  // partial), a K of 16384 at 64 (eight token tiles, a 1,024-wide slice per split).
  cases.push_back({5, 12288, 3072, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({12, 3072, 8192, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({16, 1000, 192, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({9, 520, 1024, 2, WeightFormat::kFp8Tensor, stat});
  cases.push_back({7, 2048, 3072, 2, WeightFormat::kFp8Channel, dyn});
  cases.push_back({33, 3072, 1024, 1, WeightFormat::kFp8Channel, dyn});
  cases.push_back({64, 200, 16384, 1, WeightFormat::kFp8Channel, dyn});
  // The small-N kernel's plans on those cases: a cluster of 16 K splits for out_proj's K at 12
  // tokens (the reduction through distributed shared memory), one split at 3 chunks (direct stores).
  record("gemm_fp8", "small-n clusters K splits, 3072x8192 at T 12 (want 16, 8 where clusters > 8 are refused)",
         [&] {
           QWeight w = make_qweight(h, 1, 3072, 8192, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
           const int s = fp8_small_n_plan_splits(*h.gpu, 12, w.gpu_lin);
           return s == 16 || s == 8 ? 0.0 : 1.0 + s;
         }(),
         kExact);
  record("gemm_fp8", "small-n one split, 1000x192 at T 16", [&] {
    QWeight w = make_qweight(h, 1, 1000, 192, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
    return fp8_small_n_plan_splits(*h.gpu, 16, w.gpu_lin) == 1 ? 0.0 : 1.0;
  }(), kExact);
  struct Path {
    LinearPath path;
    const char* name;
  };
  const Path paths[] = {{LinearPath::kFp8FewTokens, "few-tokens"}, {LinearPath::kFp8SmallN, "small-n"},
                        {LinearPath::kFp8Gemm, "gemm-f16"},
                        {LinearPath::kFp8Wgmma, "wgmma"}, {LinearPath::kDispatch, "dispatch"}};
  const bool hopper = fp8_wgmma_expected(*h.gpu);
  for (const Case& c : cases) {
    QWeight w = make_qweight(h, 1, c.N, c.K, c.P, c.fmt, c.act, 4.0f);
    auto xv = randn(c.T * c.K);
    Pair x = h.f32({c.T, c.K}, xv), o = h.out({c.T, c.N});
    h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
    const auto ref = h.cpu_f(o);
    std::vector<double> rn, cn;
    fp8_norms(h, w, xv, c.T, c.K, c.N, c.P, c.act == dyn, rn, cn);
    const std::string shape = std::string(c.act == dyn ? "dyn " : "static ") + "TxNxKxP " + sz({c.T, c.N, c.K, c.P});
    for (const Path& p : paths) {
      h.gpu->upload(o.gpu(), std::vector<float>(static_cast<size_t>(c.T * c.N), NAN).data());
      if (!linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, p.path)) {
        // Allowed to decline: the small-N kernel at K % 64 != 0, cuBLASLt at rows that are no
        // multiple of 16 (the dispatch then runs the next path, checked by its own line), the wgmma
        // kernel off compute 9.0. Everything else, the model's shapes among them, must be taken.
        const bool small_n = p.path == LinearPath::kFp8SmallN, few = p.path == LinearPath::kFp8FewTokens;
        if ((small_n && c.K % 64 != 0) || (few && (c.K % 64 != 0 || c.T > 4)) ||
            (p.path == LinearPath::kFp8Gemm && c.N % 16 != 0) ||
            (p.path == LinearPath::kFp8Wgmma && !hopper)) {
          std::printf("      %-10s %s: declined\n", p.name, shape.c_str());
          continue;
        }
        record("gemm_fp8", std::string(p.name) + " not taken " + shape, 1.0, 0.0);
        continue;
      }
      const auto got = h.gpu_f(o);
      record("gemm_fp8", std::string(p.name) + " " + shape, norm_relative(got, ref, rn, cn), fp32_sums_bound(c.K));
      record("gemm_fp8", std::string(p.name) + " max-rel " + shape, rel_err(got, ref), kFp32);
    }
  }
  // 3. The wgmma kernel's every tile shape and K splits (1, 3 and 5 ways: the split-K partial sums
  // and their reduction) on the edges of its tiles: T one past a tile of tokens (65, 129, 257, 513)
  // or inside one (330: a served agent turn; 2, 5, 17, 33, 64: the small-T tile's batched decode),
  // weight rows no multiple of a tile (520, 1000, 384, 200), K no multiple of 64 (1040: a
  // zero-padded last stage), the 35B's K 512 / 2048 / 4096, two partitions with static
  // per-partition scales. Bounds as in 2.
  if (hopper) {
    const std::vector<Case> edges = {
        {330, 520, 2048, 1, WeightFormat::kFp8Channel, dyn}, {129, 1000, 1040, 2, WeightFormat::kFp8Channel, dyn},
        {65, 2048, 512, 1, WeightFormat::kFp8Channel, dyn},  {257, 384, 4096, 1, WeightFormat::kFp8Channel, dyn},
        {200, 768, 1024, 2, WeightFormat::kFp8Tensor, stat}, {513, 256, 3072, 1, WeightFormat::kFp8Channel, dyn},
        {2, 520, 2048, 1, WeightFormat::kFp8Channel, dyn},   {5, 1000, 1040, 2, WeightFormat::kFp8Channel, dyn},
        {17, 384, 4096, 1, WeightFormat::kFp8Channel, dyn},  {33, 200, 1024, 2, WeightFormat::kFp8Tensor, stat},
        {64, 2048, 512, 1, WeightFormat::kFp8Channel, dyn},
    };
    for (const Case& c : edges) {
      QWeight w = make_qweight(h, 1, c.N, c.K, c.P, c.fmt, c.act, 4.0f);
      auto xv = randn(c.T * c.K);
      Pair x = h.f32({c.T, c.K}, xv), o = h.out({c.T, c.N});
      h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
      const auto ref = h.cpu_f(o);
      std::vector<double> rn, cn;
      fp8_norms(h, w, xv, c.T, c.K, c.N, c.P, c.act == dyn, rn, cn);
      const std::string shape = std::string(c.act == dyn ? "dyn " : "static ") + "TxNxKxP " + sz({c.T, c.N, c.K, c.P});
      double worst_norm = 0, worst_rel = 0;
      int runs = 0;
      for (int tile = 0;; ++tile) {
        bool taken = false;
        for (int splits : {1, 3, 5}) {
          h.gpu->upload(o.gpu(), std::vector<float>(static_cast<size_t>(c.T * c.N), NAN).data());
          if (!fp8_wgmma_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, tile, splits)) break;
          taken = true;
          ++runs;
          const auto got = h.gpu_f(o);
          const double e = norm_relative(got, ref, rn, cn), r = rel_err(got, ref);
          if (!(e <= fp32_sums_bound(c.K)) || !(r <= kFp32))  // a failing variant gets its own line
            record("gemm_fp8", "wgmma tile " + std::to_string(tile) + " splits " + std::to_string(splits) + " " + shape,
                   std::max(e / fp32_sums_bound(c.K), r / kFp32), 1.0);
          worst_norm = std::max(worst_norm, e);
          worst_rel = std::max(worst_rel, r);
        }
        if (!taken) break;
      }
      record("gemm_fp8", "wgmma tiles run " + shape, runs >= 9 ? 0.0 : 1.0, kExact);  // 3 tiles x 3 splits
      record("gemm_fp8", "wgmma all tiles+splits " + shape, worst_norm, fp32_sums_bound(c.K));
      record("gemm_fp8", "wgmma all tiles+splits max-rel " + shape, worst_rel, kFp32);
    }
  }
  // 3b. The small-N kernel with its K split forced to 1 (direct stores), 3, 7 and 16 (the cluster
  // reduction through distributed shared memory, 16 the largest cluster; declined where an empty
  // split or clusters > 8 would be needed) on cases of section 2's kinds: a partial row block, a
  // partial token tile, static per-partition scales, 64 tokens. Bounds as in 2.
  {
    const std::vector<Case> forced = {
        {13, 1000, 3072, 1, WeightFormat::kFp8Channel, dyn}, {6, 520, 1024, 2, WeightFormat::kFp8Tensor, stat},
        {64, 384, 2048, 1, WeightFormat::kFp8Channel, dyn},  {29, 3072, 8192, 1, WeightFormat::kFp8Channel, dyn},
    };
    for (const Case& c : forced) {
      QWeight w = make_qweight(h, 1, c.N, c.K, c.P, c.fmt, c.act, 4.0f);
      auto xv = randn(c.T * c.K);
      Pair x = h.f32({c.T, c.K}, xv), o = h.out({c.T, c.N});
      h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
      const auto ref = h.cpu_f(o);
      std::vector<double> rn, cn;
      fp8_norms(h, w, xv, c.T, c.K, c.N, c.P, c.act == dyn, rn, cn);
      const std::string shape = std::string(c.act == dyn ? "dyn " : "static ") + "TxNxKxP " + sz({c.T, c.N, c.K, c.P});
      double worst_norm = 0, worst_rel = 0;
      int runs = 0;
      for (int splits : {1, 3, 7, 16}) {
        h.gpu->upload(o.gpu(), std::vector<float>(static_cast<size_t>(c.T * c.N), NAN).data());
        if (!fp8_small_n_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, splits)) {
          std::printf("      small-n splits %d %s: declined\n", splits, shape.c_str());
          continue;
        }
        ++runs;
        const auto got = h.gpu_f(o);
        worst_norm = std::max(worst_norm, norm_relative(got, ref, rn, cn));
        worst_rel = std::max(worst_rel, rel_err(got, ref));
      }
      record("gemm_fp8", "small-n forced splits run (two at least) " + shape, runs >= 2 ? 0.0 : 1.0, kExact);
      record("gemm_fp8", "small-n forced splits 1/3/7/16 " + shape, worst_norm, fp32_sums_bound(c.K));
      record("gemm_fp8", "small-n forced splits 1/3/7/16 max-rel " + shape, worst_rel, kFp32);
    }
  }
  // 4. Shapes the tensor cores do not take fall back to the GEMVs (K % 16 != 0 here): the
  // dispatch's answer is the GEMV's, bound kFp32 as in ops_vs_cpu's decode_linear cases.
  {
    const int64_t T = 40, N = 300, K = 1000;
    QWeight w = make_qweight(h, 1, N, K, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
    Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
    const bool taken = linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, LinearPath::kFp8Gemm) ||
                       linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, LinearPath::kFp8Wgmma) ||
                       linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, LinearPath::kFp8SmallN);
    record("gemm_fp8", "K % 16 != 0 declined by the tensor-core paths", taken ? 1.0 : 0.0, kExact);
    h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
    h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
    record("gemm_fp8", "K % 16 != 0 dispatch TxNxK " + sz({T, N, K}), h.err(o), kFp32);
  }
}

void test_bf16(Harness& h) {
  struct Case {
    int64_t T, N, K;
    const char* what;
  };
  // router, GDN in_proj_a, odd sizes, a tenth of lm_head at batched-decode T, and a long thin
  // problem whose [2T, N] product exceeds one chunk (two chunks of 33 + 7 tokens); for the small-N
  // kernel also a token tile of 2 rows, a partial n tile and a 35B in_proj_b at the later-turn T.
  // The router at decode / verify sizes (the few-token kernel's n8 token tiles: 1, 2, 4, 8; partial
  // tiles; its most), and a row count that is not a multiple of its 32-row blocks.
  const std::vector<Case> cases = {{512, 256, 3072, "router"},      {300, 64, 3072, "in_proj_a"},
                                   {2, 64, 2048, "in_proj_a"},      {338, 32, 2048, "in_proj_b"},
                                   {17, 60, 1024, "odd"},           {37, 1000, 1024, "odd"},
                                   {17, 24832, 3072, "lm_head/10"},
                                   {64, 24832, 3072, "lm_head/10"}, {40, 1000000, 64, "chunked"},
                                   {1, 256, 3072, "router"},        {3, 256, 3072, "router"},
                                   {4, 256, 3072, "router"},        {9, 256, 3072, "router"},
                                   {16, 256, 3072, "router"},       {29, 256, 3072, "router"},
                                   {64, 256, 3072, "router"},       {2, 256, 2048, "router 35B"},
                                   {16, 256, 2048, "router 35B"},   {64, 256, 2048, "router 35B"},
                                   {5, 200, 4096, "odd"},           {33, 96, 1024, "odd"}};
  for (const Case& c : cases) {
    Weight w = make_weight(h, {c.N, c.K}, true, 1.0f / std::sqrt(static_cast<float>(c.K)));
    auto xv = randn(c.T * c.K);
    Pair x = h.f32({c.T, c.K}, xv), o = h.out({c.T, c.N});
    h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
    const auto ref = h.cpu_f(o);
    std::vector<double> rn(static_cast<size_t>(c.T)), cn(static_cast<size_t>(c.N));
    for (int64_t t = 0; t < c.T; ++t) {
      double ss = 0;
      for (int64_t k = 0; k < c.K; ++k) ss += static_cast<double>(xv[static_cast<size_t>(t * c.K + k)]) * xv[static_cast<size_t>(t * c.K + k)];
      rn[static_cast<size_t>(t)] = std::sqrt(ss);
    }
    std::vector<uint16_t> wb(static_cast<size_t>(c.N * c.K));
    h.cpu->download(wb.data(), w.p.cpu());
    for (int64_t n = 0; n < c.N; ++n) {
      double ss = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double v = bf16_to_f32(wb[static_cast<size_t>(n * c.K + k)]);
        ss += v * v;
      }
      cn[static_cast<size_t>(n)] = std::sqrt(ss);
    }
    const std::string shape = std::string(c.what) + " TxNxK " + sz({c.T, c.N, c.K});
    const double bound = std::ldexp(1.0, -16) + fp32_sums_bound(c.K);
    for (LinearPath path :
         {LinearPath::kBf16Split, LinearPath::kBf16SmallN, LinearPath::kBf16FewTokens, LinearPath::kDispatch}) {
      const char* name = path == LinearPath::kBf16Split       ? "split"
                         : path == LinearPath::kBf16SmallN    ? "small-n"
                         : path == LinearPath::kBf16FewTokens ? "few-tok"
                                                              : "dispatch";
      if (path == LinearPath::kBf16SmallN && (c.N > 64 || c.K % 32 != 0)) continue;
      if (path == LinearPath::kBf16FewTokens && (c.T > 64 || c.N > 512 || c.K % 32 != 0 || c.K > 4096)) continue;
      h.gpu->upload(o.gpu(), std::vector<float>(static_cast<size_t>(c.T * c.N), NAN).data());
      if (!linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, path)) {
        record("gemm_bf16", std::string(name) + " not taken " + shape, 1.0, 0.0);
        continue;
      }
      const auto got = h.gpu_f(o);
      std::printf("      %-8s %s: max|d|/max|ref| %.3e\n", name, shape.c_str(), rel_err(got, ref));
      record("gemm_bf16", std::string(name) + " " + shape, norm_relative(got, ref, rn, cn), bound);
    }
  }
  {  // K % 8 != 0: declined, and the dispatch's SIMT answer is fp32 (kFp32).
    const int64_t T = 40, N = 100, K = 100;
    Weight w = make_weight(h, {N, K}, true, 0.1f);
    Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
    const bool taken = linear_probe(*h.gpu, o.gpu(), x.gpu(), w.gpu_lin, LinearPath::kBf16Split);
    record("gemm_bf16", "K % 8 != 0 declined by the split path", taken ? 1.0 : 0.0, kExact);
    h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
    h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
    record("gemm_bf16", "K % 8 != 0 dispatch TxNxK " + sz({T, N, K}), h.err(o), kFp32);
  }
}

// The router (256 experts, top-8, K 3072) through the split-bf16 GEMM (one call) and the few-token
// kernel (calls of 64 tokens): how often the top-8 set of a token differs from the one the CPU's
// logits give, and whether each difference is a near-tie: the CPU's 8th and 9th logits closer than
// twice the token's largest logit difference between the backends (then the order is decided by
// rounding, and either answer is the reference's function to within its own f32 error). Bounds:
// flips not explained by a near-tie 0; flips at most 1% of the tokens (each needs two logits within
// ~1e-6 of each other).
void test_router(Harness& h) {
  const int64_t T = 4096, E = 256, K = 3072, k = 8, kFew = 64;
  Weight w = make_weight(h, {E, K}, true, 1.0f / std::sqrt(static_cast<float>(K)));
  Pair x = h.f32({T, K}, randn(T * K)), lg = h.out({T, E});
  h.cpu->linear(lg.cpu(), x.cpu(), w.cpu_lin);
  const auto cl = h.cpu_f(lg);
  auto topk = [&](const std::vector<float>& logits) {
    Pair l = h.f32({T, E}, logits), wt = h.out({T, k}),
         id = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
    h.cpu->moe_route_topk(wt.cpu(), id.cpu(), l.cpu());
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    h.cpu->download(ids.data(), id.cpu());
    return ids;
  };
  const auto ci = topk(cl);
  for (LinearPath path : {LinearPath::kBf16Split, LinearPath::kBf16FewTokens}) {
    const std::string name = path == LinearPath::kBf16Split ? "split" : "few-token";
    bool taken = true;
    if (path == LinearPath::kBf16Split) {
      taken = linear_probe(*h.gpu, lg.gpu(), x.gpu(), w.gpu_lin, LinearPath::kBf16Split);
    } else {
      for (int64_t t0 = 0; t0 < T && taken; t0 += kFew)
        taken = linear_probe(*h.gpu, lg.gpu().rows(t0, kFew), x.gpu().rows(t0, kFew), w.gpu_lin, path);
    }
    if (!taken) {
      record("gemm_router", name + " path not taken", 1.0, 0.0);
      continue;
    }
    const auto gl = h.gpu_f(lg);
    const auto gi = topk(gl);
    int64_t flips = 0, unexplained = 0;
    double worst_gap = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> a(gi.begin() + t * k, gi.begin() + (t + 1) * k), b(ci.begin() + t * k, ci.begin() + (t + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a == b) continue;
      ++flips;
      std::vector<float> row(cl.begin() + t * E, cl.begin() + (t + 1) * E);
      double dmax = 0;
      for (int64_t e = 0; e < E; ++e)
        dmax = std::max(dmax, std::fabs(static_cast<double>(gl[static_cast<size_t>(t * E + e)]) - row[static_cast<size_t>(e)]));
      std::sort(row.begin(), row.end(), std::greater<float>());
      const double gap = static_cast<double>(row[k - 1]) - row[k];
      worst_gap = std::max(worst_gap, gap);
      unexplained += gap > 2 * dmax;
    }
    std::printf("      router %s top-%lld: %lld of %lld tokens flip; widest flipped 8th-9th gap %.3e\n", name.c_str(),
                static_cast<long long>(k), static_cast<long long>(flips), static_cast<long long>(T), worst_gap);
    record("gemm_router", name + " top-8 flips not at near-ties T " + std::to_string(T), static_cast<double>(unexplained),
           kExact);
    record("gemm_router", name + " top-8 flipped tokens T " + std::to_string(T), static_cast<double>(flips),
           static_cast<double>(T) / 100.0);
    record("gemm_router", name + " logits max|d|/max|ref| T " + std::to_string(T), rel_err(gl, cl), kForms);
  }
}

RegisterOpChecks reg_fp8("gemm_fp8", test_fp8);
RegisterOpChecks reg_bf16("gemm_bf16", test_bf16);
RegisterOpChecks reg_router("gemm_router", test_router);

}  // namespace
}  // namespace sparkserve
