// gpu_ops group "gdn_decode": the fused GDN decode step (Backend::gdn_decode_step: a/b projections,
// conv, gating, delta rule, gated RMSNorm) on CUDA against the CPU backend's composition of the
// separate ops, on fresh random inputs: the 122B-A10B and 35B-A3B shapes (16 key heads of 128, 64 / 32 value heads of 128, conv 4,
// H 3072 / 2048, in_proj_a/b bf16 / f32) at 1, 2, 16, 64 and 65 sequences on shuffled state slots, and an odd
// geometry (3 value heads per key head, dk 64, dv 48, conv 3, f32 in_proj_a/b, H % 4 != 0: the
// element-by-element a/b loop and masked rows and columns). Checked: the output, the recurrent state
// pool and the conv state pool (slots no span uses must come back unchanged).
//
// Bound kFp32 (1e-5, max |cuda - cpu| / max |cpu|): both sides are fp32 in other summation orders.
// The H-term a/b products differ by ~sqrt(H) x 2^-24 x |partial sums| (~2e-6 absolute for a, b of
// size ~2); decay = exp(-A softplus(a + dt)) moves by A sigmoid(x) da relative, and decay x S is
// largest where that sensitivity is smallest (decay (-ln decay) <= 1/e), so the state moves by
// <= ~1e-6 of max |S|; the dk-term dot products S^T k, S^T q carry ~sqrt(128) x 2^-24 relative; the
// norm's sum of squares is in double on both sides. A formula error (a wrong head pairing, a decay
// step missed, a column or slot mixed up) moves results by > 1e-2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_harness.h"

namespace sparkserve {
namespace {

struct DecodeCase {
  const char* name;
  int64_t hk, hv, dk, dv, K, H;
  bool bf16;
  std::vector<int64_t> batches;
};

// Uniform in [-r, r) from a 64-bit LCG seeded by g_rng: the state pools are up to 70 M floats.
std::vector<float> uniform_fill(int64_t n, float r) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = g_rng();
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = r * (2.0f * static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 1.0f);
  }
  return v;
}

void check_case(Harness& h, const DecodeCase& c, int64_t B) {
  const GdnDims d{c.hk, c.hv, c.dk, c.dv, c.K};
  const int64_t C = d.conv_dim(), Hv = c.hv, slots = B + 3;
  const std::string tag = std::string(c.name) + " B" + std::to_string(B);
  // B single-token spans on shuffled slots; 3 slots belong to no span.
  BatchLayout L = single_token_spans(B, slots);
  // in_proj_a/b scaled so that a, b ~ N(0, 2^2) (the gates' working range, both softplus branches);
  // A_log, dt_bias as HF initialises them.
  Weight wa = make_weight(h, {Hv, c.H}, c.bf16, 2.0f / std::sqrt(static_cast<float>(c.H)));
  Weight wb = make_weight(h, {Hv, c.H}, c.bf16, 2.0f / std::sqrt(static_cast<float>(c.H)));
  std::vector<float> alog(static_cast<size_t>(Hv)), nw = randn(c.dv, 0.2f);
  for (auto& x : alog) x = std::log(1.0f + 15.0f * std::uniform_real_distribution<float>(0, 1)(g_rng));
  for (auto& x : nw) x += 1.0f;
  Pair hid = h.f32({B, c.H}, randn(B * c.H)), mixed = h.f32({B, C}, randn(B * C)),
       z = h.f32({B, Hv * c.dv}, randn(B * Hv * c.dv, 2.0f)), conv_w = h.f32({C, c.K}, randn(C * c.K, 0.5f)),
       A_log = h.f32({Hv}, alog), dt = h.f32({Hv}, randn(Hv, 0.5f)), norm_w = h.f32({c.dv}, nw);
  const std::vector<float> conv0 = randn(slots * C * (c.K - 1)),
                           rec0 = uniform_fill(slots * Hv * c.dk * c.dv, 0.5f);
  Pair conv_pool = h.f32({slots, C, c.K - 1}, conv0), rec_pool = h.f32({slots, Hv, c.dk, c.dv}, rec0),
       out = h.out({B, Hv * c.dv});
  const float eps = 1e-6f;
  h.cpu->gdn_decode_step(out.cpu(), hid.cpu(), mixed.cpu(), z.cpu(), wa.cpu_lin, wb.cpu_lin, conv_w.cpu(),
                         A_log.cpu(), dt.cpu(), norm_w.cpu(), eps, conv_pool.cpu(), rec_pool.cpu(), L, d);
  h.gpu->gdn_decode_step(out.gpu(), hid.gpu(), mixed.gpu(), z.gpu(), wa.gpu_lin, wb.gpu_lin, conv_w.gpu(),
                         A_log.gpu(), dt.gpu(), norm_w.gpu(), eps, conv_pool.gpu(), rec_pool.gpu(), L, d);
  record("gdn_decode", tag + " out", h.err(out), kFp32);
  record("gdn_decode", tag + " state", h.err(rec_pool), kFp32);
  record("gdn_decode", tag + " conv state", h.err(conv_pool), kFp32);
}

void test_gdn_decode(Harness& h) {
  const DecodeCase cases[] = {
      {"122B hk16 hv64 H3072", 16, 64, 128, 128, 4, 3072, true, {1, 2, 16, 64, 65}},
      {"35B hk16 hv32 H2048 f32", 16, 32, 128, 128, 4, 2048, false, {1, 2, 16, 64, 65}},
      {"odd hk2 hv6 dk64 dv48 H1030 f32", 2, 6, 64, 48, 3, 1030, false, {1, 3}},
  };
  for (const DecodeCase& c : cases)
    for (int64_t B : c.batches) check_case(h, c, B);
}

RegisterOpChecks register_gdn_decode("gdn_decode", test_gdn_decode);

}  // namespace
}  // namespace sparkserve
