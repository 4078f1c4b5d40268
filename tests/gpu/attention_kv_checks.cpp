// gpu_ops checks of the KV cache dtypes and the tensor-core attention kernels against the CPU
// backend (run alone with `gpu_ops --only attn_`):
//  - attn_kv:    kv_cache_write and attention_prep store the CPU's rounded values bit for bit
//                (bf16 bits; fp8 codes and per-row scales), zero rows and saturating rows included.
//  - attn_tc:    attention / gated_attention over bf16 and fp8 pools holding the same bytes on both
//                sides: prefill (flash kernel), prefill chunks continuing a cached prefix, several
//                spans of mixed kinds, decode batches and speculative-verify spans (split-K kernel),
//                contexts crossing many blocks, at the 122B / 35B head shapes and the fixtures'.
//                Bounds: kBf16Operands where the sm_90a wgmma prefill kernel runs (Q and P as
//                single bf16), kTensorCore for the mma.sync kernels (prefill on the other targets,
//                decode and verify everywhere: Q and P as bf16 hi + lo). Also the SIMT path (f32
//                pools, odd head dims). Where the wgmma prefill kernel runs (head_dim 256), every
//                prefill case runs again with the mma.sync prefill kernel forced (the other targets'
//                kernel), tagged "[prefill mma.sync]"; an agent turn (384 tokens after 10000) and
//                short chunks exercise the wgmma kernel's key splits.
//  - attn_graph: the decode kernel reading a fixed layout (as inside a recorded decode step, with a
//                larger length bound) gives bit-identical results to the same call run eagerly.
//  - attn_small: a few small cases of both kernels (for compute-sanitizer runs).
//  - attn_model: the BF16 fixtures with bf16 / fp8 KV on CUDA vs the CPU backend with the same KV
//                dtype: teacher-forced logits, cached decode steps (recorded as CUDA graphs after
//                the first), batched decode. Bound kKvRounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.h"
#include "gpu_harness.h"
#include "model/load.h"
#include "runtime/direct_state.h"

namespace sparkserve {

// backend/cuda/attention_prefill.cu (a header for nvcc-built files): the prefill kernel forced for
// the next calls (0 mma.sync, 1 wgmma, -1 automatic); false when the forced kernel cannot run here.
bool attention_prefill_force(int kernel);

namespace {

// The mma.sync kernels vs the fp32 CPU reference on identical K/V values. Q and P go through the
// MMAs as bf16 hi + lo pairs (relative error <= 2^-17 ~ 7.6e-6 per operand, attention_common.cuh)
// with f32 accumulation, against the CPU's f32 dot products and softmax; over hd = 256 products and
// thousands of keys the worst element lands around 1e-5 of max|out|. 1e-4 leaves margin and stays
// 40x below what one bf16 operand gives (~4e-3, below).
constexpr double kTensorCore = 1e-4;

// The wgmma prefill kernel (sm_90a, head_dim 256) vs the same fp32 CPU reference: Q and P are single
// bf16 operands, K and V the pool's exact values, f32 accumulation and softmax. Rounding x to bf16
// (8 significant bits, round to nearest even) gives x (1 + d) with |d| <= u = 2^-8 and, for values
// spread over binades, RMS(d) ~ 2^-9. The inputs of check_attention: q ~ N(0, 2^2), k ~ N(0, 1),
// v ~ N(0, 2^2) (K and V rounded to the pool's dtype on both sides), scale 1 / sqrt(hd), so every
// score s_j = scale q.k_j has standard deviation 2 whatever hd.
//  - Q rounding: s_j moves by scale sum_c q_c d_c k_jc, independent across keys j (the k_j are), with
//    standard deviation RMS(d) * std(s) = 2^-9 * 2 = 2^-8; exp() turns that into a relative change
//    of each unnormalised probability p_j by ~2^-8 (the max subtracted is exact: any common shift
//    cancels).
//  - P rounding: each p_j entering P.V is p_j (1 + e_j), RMS(e) ~ 2^-9; the row sum l is taken over
//    the unrounded p_j, so it does not cancel.
// With pi_j = p_j / l, out = sum_j pi_j v_j moves by sum_j pi_j (ds_j (v_j - out) + e_j v_j): a sum
// of independent terms of relative size sqrt(2^-16 + 2^-18) ~ 4.4e-3 against the output's own
// scale sqrt(sum_j pi_j^2 v_j^2) (the size of out itself for v independent of pi, peaked rows and
// flat ones alike). err() = max|d out| / max|out| over the tensor is then ~4.4e-3 (measured 5.7e-3
// worst over the head_dim-256 checks of a Q/P-hi-only build of the previous kernel). Bound 2e-2:
// ~4.5x the expected value for the tail over 124 cases and two kernels, and still 5x to 50x below
// what a real fault gives (a key masked wrongly, a missed rescale, a wrong fp8 scale: 1e-1 .. 1).
constexpr double kBf16Operands = 2e-2;

// Spans of more than this many tokens take the prefill kernels (attention_kernels.cuh's
// kDecodeMaxTokens); all shorter ones the decode kernel.
constexpr int64_t kDecodeMaxTokens = 8;

// Whole fixture models, CUDA vs CPU with the same bf16 / fp8 KV dtype. The K rows come out of
// attention_prep a few fp32 ulps apart on the two backends (cosf/sinf, summation order: the fp32
// model checks agree to ~3e-6), and rounding to the pool's dtype turns an ulp into a whole bf16 or
// e4m3 step wherever a value sits that close to a rounding midpoint: every prefill of these
// fixtures flips some (the count is printed), and the logits then differ by up to ~1e-4 (9.3e-5
// measured on the H200). Bound 1e-3: 10x that, and below what a dtype left unrounded on one side
// gives (bf16 vs f32 KV on these fixtures: 1.8e-3 .. 5e-3; fp8: 3e-2 and more).
constexpr double kKvRounding = 1e-3;

std::vector<uint8_t> bytes_of(Backend* b, const Tensor& t) {
  std::vector<uint8_t> v(t.nbytes());
  b->download(v.data(), t);
  return v;
}
// Bytes that differ between the two sides of p.
double byte_mismatches(Harness& h, const Pair& p) {
  const auto a = bytes_of(h.cpu, p.cpu()), b = bytes_of(h.gpu, p.gpu());
  double n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// A KV pool on both backends holding the same random initial bytes.
struct KvPair {
  Pair k, v, ks, vs;
  KvPool cpu, gpu;
};
KvPair make_kv(Harness& h, DType dt, int64_t blocks, int64_t bs, int64_t kvh, int64_t hd) {
  const std::vector<int64_t> shape{blocks, bs, kvh, hd}, rows{blocks, bs, kvh};
  const size_t n = static_cast<size_t>(blocks * bs * kvh * hd);
  auto payload = [&] {
    if (dt == DType::kF32) {
      auto f = randn(static_cast<int64_t>(n));
      std::vector<uint8_t> b(n * 4);
      std::memcpy(b.data(), f.data(), b.size());
      return b;
    }
    return random_bytes(n * dtype_size(dt), dt == DType::kF8E4M3 ? 1 : 2);
  };
  auto scales = [&] {
    auto s = randn(blocks * bs * kvh, 0.01f);
    for (auto& x : s) x = std::fabs(x) + 1e-3f;
    return s;
  };
  KvPair p{h.make(dt, shape, payload().data()), h.make(dt, shape, payload().data()),
           h.f32(rows, scales()), h.f32(rows, scales()), {}, {}};
  const bool fp8 = dt == DType::kF8E4M3;
  p.cpu = {p.k.cpu(), p.v.cpu(), fp8 ? p.ks.cpu() : Tensor(), fp8 ? p.vs.cpu() : Tensor()};
  p.gpu = {p.k.gpu(), p.v.gpu(), fp8 ? p.ks.gpu() : Tensor(), fp8 ? p.vs.gpu() : Tensor()};
  return p;
}
double pool_mismatches(Harness& h, const KvPair& p, DType dt) {
  double n = byte_mismatches(h, p.k) + byte_mismatches(h, p.v);
  if (dt == DType::kF8E4M3) n += byte_mismatches(h, p.ks) + byte_mismatches(h, p.vs);
  return n;
}

const char* dt_name(DType dt) { return dt == DType::kBF16 ? "bf16" : dt == DType::kF8E4M3 ? "fp8" : "f32"; }

// Every position [0, start + len) of each span, as one batch (what earlier steps would have written).
Spans history_of(const Spans& sp) {
  Spans h;
  h.tables = sp.tables;
  int64_t row = 0;
  for (size_t i = 0; i < sp.layout.seqs.size(); ++i) {
    SeqSpan s = sp.layout.seqs[i];
    s.row_begin = row;
    s.num_tokens = s.start_pos + s.num_tokens;
    s.start_pos = 0;
    s.block_table = h.tables[i].data();
    row += s.num_tokens;
    h.layout.seqs.push_back(s);
  }
  h.layout.total_rows = row;
  return h;
}

int32_t blocks_needed(const std::vector<std::array<int64_t, 2>>& spans, int64_t bs) {
  int64_t n = 0;
  for (auto [s, l] : spans) n += (s + l + bs - 1) / bs;
  return static_cast<int32_t>(n + 3);
}

void check_writes(Harness& h) {
  struct Case { int64_t kvh, hd; };
  const std::vector<std::array<int64_t, 2>> spans = {{0, 37}, {50, 5}, {200, 1}, {700, 1}};
  for (DType dt : {DType::kBF16, DType::kF8E4M3})
    for (Case c : {Case{2, 256}, Case{2, 32}, Case{4, 128}}) {
      const int64_t bs = 16;
      const int32_t nb = blocks_needed(spans, bs);
      Spans sp = make_spans(spans, bs, nb, 4);
      const int64_t T = sp.layout.total_rows, row = c.kvh * c.hd;
      auto kv = randn(T * row, 3.0f), vv = randn(T * row, 0.5f);
      std::fill_n(kv.begin(), c.hd, 0.0f);                            // a zero row (floor scale)
      kv[static_cast<size_t>(row + 3)] = 1e4f;                       // a row dominated by one value
      vv[static_cast<size_t>(2 * row + 1)] = -3e-6f;                 // tiny values: fp8 subnormals
      Pair k = h.f32({T, c.kvh, c.hd}, kv), v = h.f32({T, c.kvh, c.hd}, vv);
      KvPair p = make_kv(h, dt, nb, bs, c.kvh, c.hd);
      h.cpu->kv_cache_write(p.cpu, k.cpu(), v.cpu(), sp.layout);
      h.gpu->kv_cache_write(p.gpu, k.gpu(), v.gpu(), sp.layout);
      record("attn_kv", std::string("kv_cache_write ") + dt_name(dt) + " kvh" + std::to_string(c.kvh) + " hd" +
                            std::to_string(c.hd) + " (bytes differing)",
             pool_mismatches(h, p, dt), kExact);
    }
  // attention_prep: q and the rotated k as the fp32 checks of ops_vs_cpu; the pool rows are the
  // CPU's rounding of exactly the k the GPU produced.
  struct Prep { int64_t nh, kvh, hd, rot; };
  for (DType dt : {DType::kBF16, DType::kF8E4M3})
    for (Prep c : {Prep{32, 2, 256, 64}, Prep{4, 2, 32, 8}}) {
      const int64_t bs = 16;
      const std::vector<std::array<int64_t, 2>> pspans = {{0, 20}, {33, 1}, {90, 3}};
      const int32_t nb = blocks_needed(pspans, bs);
      Spans sp = make_spans(pspans, bs, nb, 3);
      const int64_t T = sp.layout.total_rows;
      std::vector<int32_t> pos;
      for (auto& s : sp.layout.seqs)
        for (int64_t i = 0; i < s.num_tokens; ++i) pos.push_back(static_cast<int32_t>(s.start_pos + i));
      Pair qg = h.f32({T, c.nh, 2 * c.hd}, randn(T * c.nh * 2 * c.hd)), k = h.f32({T, c.kvh, c.hd}, randn(T * c.kvh * c.hd)),
           v = h.f32({T, c.kvh, c.hd}, randn(T * c.kvh * c.hd)), qw = h.f32({c.hd}, randn(c.hd, 0.3f)),
           kw = h.f32({c.hd}, randn(c.hd, 0.3f)), p = h.i32({T}, pos), q = h.out({T, c.nh, c.hd}),
           gate = h.out({T, c.nh, c.hd});
      KvPair pool = make_kv(h, dt, nb, bs, c.kvh, c.hd);
      const std::vector<uint8_t> k0 = bytes_of(h.cpu, pool.k.cpu()), v0 = bytes_of(h.cpu, pool.v.cpu());
      h.cpu->attention_prep(q.cpu(), gate.cpu(), qg.cpu(), k.cpu(), v.cpu(), qw.cpu(), kw.cpu(), 1e-6f, p.cpu(), c.rot,
                            1e7, pool.cpu, sp.layout);
      h.gpu->attention_prep(q.gpu(), gate.gpu(), qg.gpu(), k.gpu(), v.gpu(), qw.gpu(), kw.gpu(), 1e-6f, p.gpu(), c.rot,
                            1e7, pool.gpu, sp.layout);
      const std::string name = std::string("attention_prep ") + dt_name(dt) + " nh" + std::to_string(c.nh) + " hd" +
                               std::to_string(c.hd);
      record("attn_kv", name + " q", h.err(q), kFp32);
      record("attn_kv", name + " k", h.err(k), kFp32);
      // The CPU pool rewritten from the GPU's k: the GPU pool must hold exactly that.
      h.cpu->upload(pool.k.cpu(), k0.data());
      h.cpu->upload(pool.v.cpu(), v0.data());
      Pair kg = h.f32({T, c.kvh, c.hd}, h.gpu_f(k));
      h.cpu->kv_cache_write(pool.cpu, kg.cpu(), v.cpu(), sp.layout);
      record("attn_kv", name + " pool == cpu rounding of its k (bytes differing)", pool_mismatches(h, pool, dt), kExact);
    }
}

struct Shape {
  const char* name;
  int64_t nh, kvh, hd;
};
struct LayoutCase {
  const char* name;
  std::vector<std::array<int64_t, 2>> spans;  // (start_pos, num_tokens)
  int64_t block_size = 16;                      // positions per KV block
};

// The spans of a layout case with pools holding their random history, the same bytes on both sides.
struct CaseSetup {
  Spans sp;
  KvPair pool;
  int64_t T = 0;
  AttentionDims d;
};
CaseSetup setup_case(Harness& h, const Shape& s, DType dt, const LayoutCase& lc) {
  const int64_t bs = lc.block_size;
  const int32_t nb = blocks_needed(lc.spans, bs);
  CaseSetup c{make_spans(lc.spans, bs, nb, static_cast<int32_t>(lc.spans.size())), make_kv(h, dt, nb, bs, s.kvh, s.hd),
              0, AttentionDims{s.nh, s.kvh, s.hd, bs, 1.0f / std::sqrt(static_cast<float>(s.hd))}};
  c.T = c.sp.layout.total_rows;
  const Spans hist = history_of(c.sp);
  const int64_t H = hist.layout.total_rows;
  Pair k = h.f32({H, s.kvh, s.hd}, randn(H * s.kvh * s.hd)), v = h.f32({H, s.kvh, s.hd}, randn(H * s.kvh * s.hd, 2.0f));
  h.cpu->kv_cache_write(c.pool.cpu, k.cpu(), v.cpu(), hist.layout);
  h.gpu->kv_cache_write(c.pool.gpu, k.gpu(), v.gpu(), hist.layout);
  return c;
}

// Queries and gates; attention and gated_attention on both sides over the same pools.
void check_attention(Harness& h, const Shape& s, DType dt, const LayoutCase& lc, const std::string& group) {
  CaseSetup c = setup_case(h, s, dt, lc);
  const Spans& sp = c.sp;
  const KvPair& pool = c.pool;
  const AttentionDims& d = c.d;
  const int64_t T = c.T;
  const std::string name = std::string(s.name) + " " + dt_name(dt) + " " + lc.name;
  if (pool_mismatches(h, pool, dt) != 0) {
    record(group, name + " pools equal", 1, kExact);
    return;
  }
  // q scaled up so the softmax is peaked, as trained models' are (exercises the running max).
  Pair q = h.f32({T, s.nh, s.hd}, randn(T * s.nh * s.hd, 2.0f)), g = h.f32({T, s.nh, s.hd}, randn(T * s.nh * s.hd, 3.0f));
  Pair o = h.out({T, s.nh, s.hd}), og = h.out({T, s.nh, s.hd});
  h.cpu->attention(o.cpu(), q.cpu(), pool.cpu, sp.layout, d);
  h.cpu->gated_attention(og.cpu(), q.cpu(), g.cpu(), pool.cpu, sp.layout, d);
  // The automatic kernel choice, then (head_dim 256 on a device where the wgmma prefill kernel runs,
  // a layout that takes the prefill kernels) the mma.sync prefill kernel that the other targets take,
  // forced, against the same reference.
  bool prefill = false;
  for (const SeqSpan& x : sp.layout.seqs) prefill = prefill || x.num_tokens > kDecodeMaxTokens;
  const bool wgmma = prefill && s.hd == 256 && dt != DType::kF32 && attention_prefill_force(1);
  attention_prefill_force(-1);
  for (int kernel : {-1, 0}) {
    if (kernel != -1 && !wgmma) break;
    const bool on_wgmma = wgmma && kernel != 0;
    const double bound = dt == DType::kF32 ? kFp32 : on_wgmma ? kBf16Operands : kTensorCore;
    attention_prefill_force(kernel);
    h.gpu->attention(o.gpu(), q.gpu(), pool.gpu, sp.layout, d);
    h.gpu->gated_attention(og.gpu(), q.gpu(), g.gpu(), pool.gpu, sp.layout, d);
    attention_prefill_force(-1);
    const std::string tag = kernel == 0 ? " [prefill mma.sync]" : on_wgmma ? " [wgmma]" : "";
    record(group, name + tag, h.err(o), bound);
    record(group, name + " gated" + tag, h.err(og), bound);
  }
}

const std::vector<Shape> kShapes = {{"122B nh32/2 hd256", 32, 2, 256},
                                    {"35B nh16/2 hd256", 16, 2, 256},
                                    {"nh8/2 hd128", 8, 2, 128},
                                    {"nh8/1 hd64", 8, 1, 64},
                                    {"fixture nh4/2 hd32", 4, 2, 32}};
const std::vector<LayoutCase> kLayouts = {
    {"prefill 300", {{0, 300}}},
    {"chunk after prefix 1000+200", {{1000, 200}}},
    {"mixed spans", {{0, 77}, {513, 64}, {40, 1}}},
    {"decode B4", {{0, 1}, {17, 1}, {4000, 1}, {700, 1}}},
    {"verify T4/3/2", {{300, 4}, {1200, 3}, {5000, 2}}},
    {"long decode 20000", {{20000, 1}}},
};

void check_tensor_core(Harness& h) {
  // (The cases of the wgmma kernel's tiles, splits and block sizes first: the CPU reference of the
  // whole group takes ~30 s on 16 cores.)
  // A long prefill crossing many blocks and many key tiles, one shape.
  check_attention(h, kShapes[0], DType::kBF16, {"prefill 1024", {{0, 1024}}}, "attn_tc");
  check_attention(h, kShapes[1], DType::kF8E4M3, {"chunk 512 after 3000", {{3000, 512}}}, "attn_tc");
  // An agent turn: a few hundred new tokens after a long cached prefix (many full key tiles, the
  // causal edge in the last ones), and a batch of prefill chunks with tile-sized and odd lengths.
  check_attention(h, kShapes[1], DType::kBF16, {"agent turn 384 after 10000", {{10000, 384}}}, "attn_tc");
  check_attention(h, kShapes[0], DType::kF8E4M3, {"chunks 8/16/129 after 64/0/1023", {{64, 8}, {0, 16}, {1023, 129}}},
                  "attn_tc");
  // Blocks that neither hold a key tile nor divide one (the kernels look each key's block up once
  // per tile): an agent turn over blocks of 24, short fp8 chunks over blocks of 5.
  check_attention(h, kShapes[1], DType::kBF16, {"agent turn 338 after 9000, blocks of 24", {{9000, 338}}, 24},
                  "attn_tc");
  check_attention(h, kShapes[2], DType::kF8E4M3, {"chunks 40/97 after 300/7, blocks of 5", {{300, 40}, {7, 97}}, 5},
                  "attn_tc");
  // The wgmma kernel's 96-key tiles over blocks that do not divide them, with key splits (26 and 38
  // CTAs: groups of 8 and 16 query heads) and the causal edge inside a tile.
  check_attention(h, kShapes[1], DType::kBF16, {"chunk 200 after 4100, blocks of 40", {{4100, 200}}, 40}, "attn_tc");
  check_attention(h, kShapes[0], DType::kF8E4M3, {"chunk 150 after 2000, blocks of 7", {{2000, 150}}, 7}, "attn_tc");
  // Every shape, dtype and layout kind.
  for (const Shape& s : kShapes)
    for (DType dt : {DType::kBF16, DType::kF8E4M3})
      for (const LayoutCase& lc : kLayouts) check_attention(h, s, dt, lc, "attn_tc");
  // The SIMT path: f32 pools (exact fp32) and head dims the tensor-core kernels do not take.
  check_attention(h, kShapes[0], DType::kF32, kLayouts[2], "attn_simt");
  check_attention(h, kShapes[0], DType::kF32, kLayouts[3], "attn_simt");
  check_attention(h, {"nh6/2 hd40", 6, 2, 40}, DType::kBF16, kLayouts[2], "attn_simt");
  check_attention(h, {"nh6/2 hd40", 6, 2, 40}, DType::kF8E4M3, kLayouts[3], "attn_simt");
}

// The decode kernel under a fixed layout with room for twice the blocks (a recorded step's view) vs
// the same call with the eager layout: the key splits must not depend on the layout's bounds.
void check_graph_layout(Harness& h) {
  for (const LayoutCase& lc : {kLayouts[3], kLayouts[4], kLayouts[5]})
    for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
      const Shape& s = kShapes[0];
      CaseSetup c = setup_case(h, s, dt, lc);
      const Spans& sp = c.sp;
      const int64_t T = c.T, bs = c.d.block_size;
      const AttentionDims& d = c.d;
      const KvPool& gpu_pool = c.pool.gpu;
      Pair q = h.f32({T, s.nh, s.hd}, randn(T * s.nh * s.hd, 2.0f)), eager = h.out({T, s.nh, s.hd}),
           fixed = h.out({T, s.nh, s.hd});
      h.gpu->attention(eager.gpu(), q.gpu(), gpu_pool, sp.layout, d);
      int64_t max_blocks = 0;
      for (auto& x : sp.layout.seqs) max_blocks = std::max(max_blocks, x.num_blocks);
      max_blocks *= 2;
      const int64_t S = static_cast<int64_t>(sp.layout.seqs.size());
      std::vector<int32_t> words(static_cast<size_t>(h.gpu->layout_words(S, T, max_blocks)));
      h.gpu->pack_layout(sp.layout, max_blocks, words.data());
      Buffer dev(h.gpu, DType::kI32, {static_cast<int64_t>(words.size())});
      h.gpu->upload(dev, words.data());
      h.gpu->set_fixed_layout(dev, sp.layout, max_blocks, max_blocks * bs);
      h.gpu->attention(fixed.gpu(), q.gpu(), gpu_pool, sp.layout, d);
      h.gpu->clear_fixed_layout();
      const auto a = h.gpu_f(eager), b = h.gpu_f(fixed);
      double diff = a.size() == b.size() ? 0 : INFINITY;
      for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
      record("attn_graph", std::string(dt_name(dt)) + " " + lc.name + " fixed == eager (floats differing)", diff, kExact);
    }
}

// ---- model level ------------------------------------------------------------------------------

std::filesystem::path fixture(const std::string& name) {
  std::filesystem::path p = std::filesystem::path("tests/fixtures") / name;
  if (std::filesystem::is_directory(p)) return p;
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

StateLimits kv_limits(int32_t seqs, DType dt) {
  StateLimits l;
  l.max_sequences = seqs;
  l.num_kv_blocks = 64 * seqs;
  l.block_size = 16;
  l.kv_dtype = dt;
  return l;
}

// Teacher-forced logits of every prompt, then `steps` decode steps of all prompts batched, feeding
// the CPU's greedy ids to both sides.
void check_model(Harness& h, const std::string& fname, DType dt) {
  auto mg = load_qwen35(fixture(fname), *h.gpu);
  auto mc = load_qwen35(fixture(fname), *h.cpu);
  const std::string tag = fname + " kv " + dt_name(dt);
  if (!mg.ok() || !mc.ok()) {
    record("attn_model", tag + " load", INFINITY, 0);
    return;
  }
  std::ifstream f(fixture(fname) / "reference.json");
  const auto ref = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts;
  for (auto& p : ref["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int32_t>>());
  const int32_t n = static_cast<int32_t>(prompts.size());
  DirectState sg(*h.gpu, (*mg)->config(), kv_limits(n, dt)), sc(*h.cpu, (*mc)->config(), kv_limits(n, dt));
  std::vector<SequenceState> qg, qc;
  for (int32_t i = 0; i < n; ++i) {
    qg.push_back(*sg.open_sequence());
    qc.push_back(*sc.open_sequence());
  }
  std::vector<SequenceInput> bg(static_cast<size_t>(n)), bc(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    bg[static_cast<size_t>(i)] = {&qg[static_cast<size_t>(i)], prompts[static_cast<size_t>(i)], true, nullptr};
    bc[static_cast<size_t>(i)] = {&qc[static_cast<size_t>(i)], prompts[static_cast<size_t>(i)], true, nullptr};
  }
  auto lg = sg.forward(**mg, bg);
  auto lc = sc.forward(**mc, bc);
  if (!lg.ok() || !lc.ok()) {
    record("attn_model", tag + " prefill", INFINITY, 0);
    return;
  }
  record("attn_model", tag + " prefill logits (3 prompts batched) vs cpu", rel_err(lg->data, lc->data), kKvRounding);
  {
    int64_t differ = 0, total = 0;
    for (int l = 0; l < count_layers((*mg)->config(), LayerType::kFullAttention); ++l) {
      const auto a = bytes_of(h.gpu, sg.state().kv().pool(l).k), b = bytes_of(h.cpu, sc.state().kv().pool(l).k);
      const size_t elem = dtype_size(dt);
      for (const auto& st : qc)
        for (int64_t p = 0; p < st.num_tokens; ++p) {
          const int64_t blk = st.block_table[static_cast<size_t>(p / 16)];
          const size_t row = static_cast<size_t>((blk * 16 + p % 16) * (*mg)->config().num_key_value_heads) *
                             static_cast<size_t>((*mg)->config().head_dim) * elem;
          const size_t n = static_cast<size_t>((*mg)->config().num_key_value_heads * (*mg)->config().head_dim) * elem;
          for (size_t e = 0; e < n; e += elem) {
            ++total;
            differ += std::memcmp(&a[row + e], &b[row + e], elem) != 0;
          }
        }
    }
    std::printf("      attn_model     %s: %lld of %lld cached K values rounded differently\n", tag.c_str(),
                static_cast<long long>(differ), static_cast<long long>(total));
  }
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    const int64_t V = lc->vocab;
    for (int32_t i = 0; i < n; ++i) {
      // Greedy id of the CPU's last row of sequence i (prefill: all rows returned, one decode row after).
      int64_t last = step == 0 ? -1 : i;
      if (step == 0) {
        int64_t r = 0;
        for (int32_t j = 0; j <= i; ++j) r += static_cast<int64_t>(prompts[static_cast<size_t>(j)].size());
        last = r - 1;
      }
      const float* row = lc->data.data() + last * V;
      const int32_t id = static_cast<int32_t>(std::max_element(row, row + V) - row);
      bg[static_cast<size_t>(i)].tokens = bc[static_cast<size_t>(i)].tokens = {id};
      bg[static_cast<size_t>(i)].all_logits = bc[static_cast<size_t>(i)].all_logits = false;
    }
    lg = sg.forward(**mg, bg);
    lc = sc.forward(**mc, bc);
    if (!lg.ok() || !lc.ok()) {
      worst = INFINITY;
      break;
    }
    worst = std::max(worst, rel_err(lg->data, lc->data));
  }
  record("attn_model", tag + " 6 batched decode steps (graphs) vs cpu", worst, kKvRounding);
}

void check_models(Harness& h) {
  for (const char* fx : {"qwen35-dense-tiny", "qwen35-moe-tiny"})
    for (DType dt : {DType::kBF16, DType::kF8E4M3}) check_model(h, fx, dt);
}

// A few small cases of both kernels, for running under compute-sanitizer.
void check_small(Harness& h) {
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    check_attention(h, kShapes[4], dt, {"prefill 70 + chunk", {{0, 70}, {40, 9}}}, "attn_small");
    check_attention(h, kShapes[0], dt, {"prefill 40", {{0, 40}}}, "attn_small");
    check_attention(h, kShapes[1], dt, {"decode 300/1", {{300, 1}, {5, 1}}}, "attn_small");
  }
}

RegisterOpChecks reg_kv("attn_kv", check_writes);
RegisterOpChecks reg_small("attn_small", check_small);
RegisterOpChecks reg_tc("attn_tc", check_tensor_core);
RegisterOpChecks reg_graph("attn_graph", check_graph_layout);
RegisterOpChecks reg_model("attn_model", check_models);

}  // namespace
}  // namespace sparkserve
