// gpu_ops --bench-kernels cases of the attention kernels (`--bench-filter attention`, or
// attention_prefill / attention_decode), one attention
// layer per call, timed as CUDA-graph replays (bench_common.h time_graph) on a fixed device layout
// as a recorded decode step reads it:
//  - prefill: one span of T = 2K / 8K / 32K tokens (an 8K chunk after a 24K prefix; attention_agent_turn:
//    338 / 384 tokens after a 10K prefix) at the 122B (32 query / 2 kv heads) and 35B (16 / 2)
//    shapes, hd 256; TFLOP/s counts the causal work 2·T·(start + T/2)·nh·hd·2 once (what the wgmma
//    kernel's single bf16 operands execute; the mma.sync kernel's hi/lo split doubles it). Where the
//    wgmma kernel runs, the mma.sync kernel the other targets take is timed beside it.
//  - decode: B = 1 / 16 / 64 sequences at contexts 0 / 8K / 32K / 128K; GB/s counts the K/V bytes
//    read. Pools of several copies (rotated per call) keep small contexts out of L2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/synth_fill.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {

// backend/cuda/attention_prefill.cu: the prefill kernel forced (0 mma.sync, 1 wgmma, -1 automatic).
bool attention_prefill_force(int kernel);

namespace {

struct Case {
  std::vector<std::array<int64_t, 2>> spans;  // (start_pos, num_tokens)
};

// Times attention (gated) over `spans` with `copies` pools rotated per call; returns ms per call.
double time_attention(Backend& g, int64_t nh, int64_t kvh, int64_t hd, DType dt,
                      const std::vector<std::array<int64_t, 2>>& spans, int copies, int iters) {
  const int64_t bs = 16;
  int64_t blocks_one = 0, T = 0, max_blocks = 0;
  for (auto [s, n] : spans) {
    const int64_t b = (s + n + bs - 1) / bs;
    blocks_one += b;
    max_blocks = std::max(max_blocks, b);
    T += n;
  }
  const int64_t blocks = blocks_one * copies;
  const std::vector<int64_t> shape{blocks, bs, kvh, hd}, rows{blocks, bs, kvh};
  Buffer k(&g, dt, shape), v(&g, dt, shape), ks(&g, DType::kF32, rows), vs(&g, DType::kF32, rows);
  const bool fp8 = dt == DType::kF8E4M3;
  const KvPool pool{k, v, fp8 ? ks.tensor() : Tensor(), fp8 ? vs.tensor() : Tensor()};
  Buffer q(&g, DType::kF32, {T, nh, hd}), gate(&g, DType::kF32, {T, nh, hd}), out(&g, DType::kF32, {T, nh, hd});
  // Random values, filled on the device (never zeros: a softmax over equal scores skips the
  // rescales that real data needs). Q, K, V: bf16 values of magnitude [2^-7, 2) with random signs
  // (f32 tensors take the same values); fp8 pools: random valid E4M3 codes with positive row scales.
  auto table = [&](DType t, int kind, bool positive) {
    std::vector<uint8_t> bytes = random_bytes(t == DType::kBF16 ? 2 * 65536 : 65536, kind);
    if (positive)
      for (size_t i = 1; i < bytes.size(); i += 2) bytes[i] &= 0x7f;
    Buffer b(&g, t, {65536});
    g.upload(b, bytes.data());
    return b;
  };
  const Buffer vals = table(DType::kBF16, 2, false), pos = table(DType::kBF16, 2, true),
               codes = table(DType::kU8, 1, false);
  uint64_t seed = g_bench_rng();
  auto fill = [&](const Tensor& t, const Tensor& tab) {
    const SynthFillKind kind = t.dtype == DType::kF8E4M3 ? SynthFillKind::kTableU8
                               : t.dtype == DType::kBF16 ? SynthFillKind::kTableBf16
                                                         : SynthFillKind::kTableBf16F32;
    synth_fill(g, t, kind, seed++, tab);
  };
  for (const Buffer* b : {&k, &v}) fill(*b, fp8 ? codes.tensor() : vals.tensor());
  for (const Buffer* b : {&q, &gate}) fill(*b, vals);
  for (const Buffer* b : {&ks, &vs}) fill(*b, pos);
  // One packed layout per copy, each naming its own blocks.
  const int64_t S = static_cast<int64_t>(spans.size());
  const int64_t words_n = g.layout_words(S, T, max_blocks);
  std::vector<Buffer> words;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(S));
  BatchLayout L;
  for (int c = 0; c < copies; ++c) {
    int64_t next = c * blocks_one, row = 0;
    L = BatchLayout();
    for (int64_t i = 0; i < S; ++i) {
      const auto [s, n] = spans[static_cast<size_t>(i)];
      auto& t = tables[static_cast<size_t>(i)];
      t.clear();
      for (int64_t b = 0; b < (s + n + bs - 1) / bs; ++b) t.push_back(static_cast<int32_t>(next++));
      SeqSpan sp;
      sp.row_begin = row;
      sp.num_tokens = n;
      sp.start_pos = s;
      sp.gdn_slot = static_cast<int32_t>(i);
      sp.block_table = t.data();
      sp.num_blocks = static_cast<int64_t>(t.size());
      L.seqs.push_back(sp);
      row += n;
    }
    L.total_rows = T;
    std::vector<int32_t> w(static_cast<size_t>(words_n));
    g.pack_layout(L, max_blocks, w.data());
    words.emplace_back(&g, DType::kI32, std::vector<int64_t>{words_n});
    g.upload(words.back(), w.data());
  }
  AttentionDims d{nh, kvh, hd, bs, 1.0f / std::sqrt(static_cast<float>(hd))};
  const double ms = time_graph(
      g,
      [&](int i) {
        g.set_fixed_layout(words[static_cast<size_t>(i % copies)], L, max_blocks, max_blocks * bs);
        g.gated_attention(out, q, gate, pool, L, d);
        g.clear_fixed_layout();
      },
      iters);
  return ms;
}

struct Shape {
  const char* name;
  int64_t nh, kvh, hd;
};
const Shape s122{"122B", 32, 2, 256}, s35{"35B", 16, 2, 256};

struct Pf {
  Shape s;
  DType dt;
  int64_t start, T;
};

void bench_prefill_cases(Backend& g, const std::vector<Pf>& cases) {
  // The automatic choice (the wgmma kernel on an H200) and the mma.sync kernel forced, in one run.
  const bool ab = attention_prefill_force(1);
  attention_prefill_force(-1);
  std::printf("\n%-34s %8s %10s %10s %12s %10s\n", "attention prefill (one layer)", "tokens", "ms", "TFLOP/s",
              ab ? "mma.sync ms" : "", ab ? "TFLOP/s" : "");
  for (const Pf& p : cases) {
    const int iters = p.T >= 32768 ? 2 : p.T <= 512 ? 20 : 5;
    const double flops = 4.0 * p.T * (p.start + p.T / 2.0) * p.s.nh * p.s.hd;
    const std::string name = std::string(p.s.name) + (p.dt == DType::kBF16 ? " bf16" : " fp8") +
                             (p.start ? " after " + std::to_string(p.start) : std::string());
    const double ms = time_attention(g, p.s.nh, p.s.kvh, p.s.hd, p.dt, {{p.start, p.T}}, 1, iters);
    std::printf("%-34s %8lld %10.3f %10.1f", name.c_str(), static_cast<long long>(p.T), ms, flops / (ms * 1e-3) / 1e12);
    if (ab) {
      attention_prefill_force(0);
      const double ms0 = time_attention(g, p.s.nh, p.s.kvh, p.s.hd, p.dt, {{p.start, p.T}}, 1, iters);
      attention_prefill_force(-1);
      std::printf(" %12.3f %10.1f", ms0, flops / (ms0 * 1e-3) / 1e12);
    }
    std::printf("\n");
  }
}

void bench_prefill(Backend& g) {
  bench_prefill_cases(g, {Pf{s122, DType::kBF16, 0, 2048}, Pf{s122, DType::kBF16, 0, 8192},
                          Pf{s122, DType::kBF16, 0, 32768}, Pf{s122, DType::kBF16, 24576, 8192},
                          Pf{s122, DType::kF8E4M3, 0, 8192}, Pf{s35, DType::kBF16, 0, 8192},
                          Pf{s35, DType::kBF16, 0, 32768}});
}

// A later turn of an agent session: a few hundred new tokens after a ~10K cached prefix.
void bench_agent_turn(Backend& g) {
  bench_prefill_cases(g, {Pf{s35, DType::kBF16, 10240, 338}, Pf{s35, DType::kBF16, 10240, 384},
                          Pf{s35, DType::kF8E4M3, 10240, 384}, Pf{s122, DType::kBF16, 10240, 338}});
}

void bench_decode(Backend& g) {
  std::printf("\n%-34s %6s %8s %10s %10s %9s\n", "attention decode (one layer)", "batch", "context", "MB read", "us",
              "GB/s");
  struct Dc {
    Shape s;
    DType dt;
    int64_t B, C;
  };
  std::vector<Dc> cases;
  for (int64_t C : {0, 8192, 32768, 131072})
    for (int64_t B : {1, 16, 64}) cases.push_back({s35, DType::kBF16, B, C});
  for (int64_t C : {0, 32768, 131072}) cases.push_back({s122, DType::kBF16, 1, C});
  cases.push_back({s122, DType::kBF16, 16, 32768});
  for (int64_t C : {32768, 131072}) cases.push_back({s35, DType::kF8E4M3, 1, C});
  cases.push_back({s35, DType::kF32, 1, 8192});  // the f32 (SIMT) path, for comparison
  for (const Dc& c : cases) {
    const double elem = c.dt == DType::kF32 ? 4 : c.dt == DType::kBF16 ? 2 : 1;
    const double row_bytes = c.s.hd * elem + (c.dt == DType::kF8E4M3 ? 4 : 0);
    const double bytes = 2.0 * c.B * (c.C + 1) * c.s.kvh * row_bytes;
    const int copies = static_cast<int>(std::clamp(std::ceil(256e6 / bytes), 1.0, 8.0));
    const int iters = bytes > 4e9 ? 3 : bytes > 5e8 ? 10 : 50;
    const std::vector<std::array<int64_t, 2>> spans(static_cast<size_t>(c.B), {c.C, 1});
    const double ms = time_attention(g, c.s.nh, c.s.kvh, c.s.hd, c.dt, spans, copies, iters);
    const std::string name = std::string(c.s.name) + (c.dt == DType::kBF16 ? " bf16" : c.dt == DType::kF8E4M3 ? " fp8" : " f32");
    std::printf("%-34s %6lld %8lld %10.1f %10.1f %9.0f\n", name.c_str(), static_cast<long long>(c.B),
                static_cast<long long>(c.C), bytes / 1e6, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
  }
}

RegisterKernelBench reg_prefill("attention_prefill", bench_prefill);
RegisterKernelBench reg_agent("attention_agent_turn", bench_agent_turn);
RegisterKernelBench reg_decode("attention_decode", bench_decode);

}  // namespace
}  // namespace sparkserve
