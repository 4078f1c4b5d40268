// gpu_ops --bench-kernels --bench-filter gdn_decode: one GDN layer's fused decode step
// (Backend::gdn_decode_step: the conv kernel, then the a/b + gating + delta rule + gated RMSNorm
// kernel) at the Qwen3.5 shapes for 1..64 sequences, timed as bench_kernels.cpp times everything
// (CUDA graph of the op, median of 5 replays), with an f32 and a bf16 recurrent state pool
// (--gdn-state-dtype). The recurrent state (4 MB per sequence at the 122B shapes in f32, 2 MB in bf16) is what moves: each call in
// the graph takes another set of state slots, so every call reads its state from HBM as a decode step
// does (a sequence's state comes back after the other 47 layers), not from the 50 MB L2. Bytes =
// the state read and written + h, mixed, z, the conv state (read and written), in_proj_a/b, out;
// TB/s over the whole op's time.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "bench_common.h"
#include "core/dtype.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

std::vector<float> uniform(int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

struct Shape {
  const char* name;
  int64_t hk, hv, H;
};

void bench_gdn_decode(Backend& gpu) {
  std::printf("%-34s %4s %9s %9s %9s\n", "gdn_decode_step (dk = dv = 128)", "B", "MB moved", "us", "GB/s");
  const int64_t dk = 128, dv = 128, K = 4;
  for (const Shape& sh : {Shape{"122B 16/64 heads", 16, 64, 3072}, Shape{"35B 16/32 heads", 16, 32, 2048}})
  for (const DType sd : {DType::kF32, DType::kBF16}) {
    const std::string name = std::string(sh.name) + (sd == DType::kBF16 ? " bf16 state" : " f32 state");
    const int64_t es = static_cast<int64_t>(dtype_size(sd));
    const GdnDims d{sh.hk, sh.hv, dk, dv, K};
    const int64_t C = d.conv_dim(), Hv = sh.hv, H = sh.H, per_seq = Hv * dk * dv;
    BenchLinear wa = make_linear(&gpu, WeightFormat::kBf16, ActivationQuant::kNone, 1, Hv, H, 1);
    BenchLinear wb = make_linear(&gpu, WeightFormat::kBf16, ActivationQuant::kNone, 1, Hv, H, 1);
    Buffer conv_w(&gpu, DType::kF32, {C, K}), A_log(&gpu, DType::kF32, {Hv}), dt(&gpu, DType::kF32, {Hv}),
        norm_w(&gpu, DType::kF32, {dv});
    gpu.upload(conv_w.tensor(), uniform(C * K, -0.5f, 0.5f, 1).data());
    gpu.upload(A_log.tensor(), uniform(Hv, 0.0f, 2.7f, 2).data());
    gpu.upload(dt.tensor(), uniform(Hv, -0.5f, 0.5f, 3).data());
    gpu.upload(norm_w.tensor(), uniform(dv, 0.8f, 1.2f, 4).data());
    for (int64_t B : {1, 16, 64}) {
      // Enough state sets that one graph replay streams >= 256 MB of distinct state.
      const int64_t sets = std::min<int64_t>(64, std::max<int64_t>(2, (256ll << 20) / (B * per_seq * es)));
      BatchLayout L;
      for (int64_t s = 0; s < B; ++s) {
        SeqSpan sp;
        sp.row_begin = s;
        sp.num_tokens = 1;
        sp.start_pos = 100;
        sp.gdn_slot = static_cast<int32_t>(s);
        L.seqs.push_back(sp);
      }
      L.total_rows = B;
      Buffer hid(&gpu, DType::kF32, {B, H}), mixed(&gpu, DType::kF32, {B, C}), z(&gpu, DType::kF32, {B, Hv * dv}),
          out(&gpu, DType::kF32, {B, Hv * dv}), conv_pool(&gpu, DType::kF32, {B, C, K - 1}),
          rec(&gpu, sd, {sets * B, Hv, dk, dv});
      gpu.upload(hid.tensor(), uniform(B * H, -1.0f, 1.0f, 5).data());
      gpu.upload(mixed.tensor(), uniform(B * C, -2.0f, 2.0f, 6).data());
      gpu.upload(z.tensor(), uniform(B * Hv * dv, -3.0f, 3.0f, 7).data());
      gpu.upload(conv_pool.tensor(), uniform(B * C * (K - 1), -1.0f, 1.0f, 8).data());
      const std::vector<float> rec0 = uniform(sets * B * per_seq, -0.5f, 0.5f, 9);
      if (sd == DType::kBF16) {
        std::vector<uint16_t> b(rec0.size());
        for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(rec0[i]);
        gpu.upload(rec.tensor(), b.data());
      } else {
        gpu.upload(rec.tensor(), rec0.data());
      }
      auto state_set = [&](int i) {
        char* base = rec.tensor().ptr<char>() + static_cast<int64_t>(i % sets) * B * per_seq * es;
        return Tensor(base, sd, {B, Hv, dk, dv}, Device::kCuda);
      };
      const double bytes = 2.0 * es * B * per_seq + 4.0 * (B * H + B * C + 2 * B * Hv * dv + 2 * B * C * (K - 1)) +
                           2.0 * 2 * Hv * H;
      const double ms = time_graph(
          gpu,
          [&](int i) {
            gpu.gdn_decode_step(out.tensor(), hid.tensor(), mixed.tensor(), z.tensor(), wa.lin, wb.lin,
                                conv_w.tensor(), A_log.tensor(), dt.tensor(), norm_w.tensor(), 1e-6f,
                                conv_pool.tensor(), state_set(i), L, d);
          },
          static_cast<int>(sets));
      std::printf("%-34s %4lld %9.1f %9.2f %9.0f\n", name.c_str(), static_cast<long long>(B), bytes / 1e6, ms * 1e3,
                  bytes / (ms * 1e-3) / 1e9);
      std::fflush(stdout);
    }
  }
}

RegisterKernelBench register_gdn_decode_bench("gdn_decode", bench_gdn_decode);

}  // namespace
}  // namespace sparkserve
