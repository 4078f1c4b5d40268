// gpu_ops group "moe_bf16": the routed bf16 experts on the tensor cores (backend/cuda/moe_bf16_grouped.cu,
// moe.cu's float path) against the CPU's moe_experts on fresh random inputs: the regime forced (so small
// shapes reach it) and the op as dispatched. Shapes cover one and several 16-slot passes per tile, several
// 64-slot tiles per expert, weight-row blocks cut short (N not a multiple of 128), K not a multiple of the
// 128-wide chunk, the 122B MTP expert shape (H 3072, I 1024), and a K the kernel declines.
//
// Bound kFp32 (1e-5 of the output's largest magnitude): x is split exactly into three bf16 parts, so
// every product is the CPU's f32 product; the sums differ in order, and the tensor core's truncating
// accumulation is confined to 128-wide k chunks added in f32 (moe_bf16_grouped.cu). A wrong fragment
// index, a slot written to the wrong row or a dropped x part is off by > 1e-3 (a dropped lo part
// alone: ~2^-17 relative per product).
#include <array>
#include <numeric>

#include "gpu_harness.h"

namespace sparkserve {

// backend/cuda/moe.cu: the float experts with the regime forced (3: bf16 tensor-core grouped tiles).
bool float_experts_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                         const Linear& gate_up, const Linear& down, int path);

namespace {

constexpr int kBf16Grouped = 3;

void test_moe_bf16(Harness& h) {
  for (auto [T, E, k, H, I] : std::vector<std::array<int64_t, 5>>{{3, 16, 8, 3072, 1024},
                                                                  {24, 16, 8, 3072, 1024},
                                                                  {48, 32, 8, 256, 96},
                                                                  {100, 8, 4, 128, 64},
                                                                  {300, 4, 2, 64, 32},
                                                                  {20, 8, 2, 128, 48}}) {
    Weight gu = make_weight(h, {E, 2 * I, H}, true, 1.0f / std::sqrt(static_cast<float>(H)));
    Weight dn = make_weight(h, {E, H, I}, true, 1.0f / std::sqrt(static_cast<float>(I)));
    std::vector<int32_t> ids;
    std::vector<float> wts;
    std::vector<int32_t> all(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token, weights summing to 1
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), g_rng);
      for (int64_t j = 0; j < k; ++j) {
        ids.push_back(all[static_cast<size_t>(j)]);
        wts.push_back((1.0f + static_cast<float>(j)) / static_cast<float>(k * (k + 1) / 2));
      }
    }
    Pair x = h.f32({T, H}, randn(T * H)), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts), o = h.out({T, H}),
         o2 = h.out({T, H});
    h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
    const std::string name = "TxExkxHxI " + sz({T, E, k, H, I});
    const bool taken = float_experts_probe(*h.gpu, o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin,
                                           kBf16Grouped);
    if (I % 32 != 0) {
      record("moe_bf16", "K % 32 != 0 declined " + name, taken ? 1.0 : 0.0, kExact);
    } else {
      record("moe_bf16", "tensor-core tiles " + name, taken ? h.err(o) : INFINITY, kFp32);
    }
    h.gpu->moe_experts(o2.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
    record("moe_bf16", "op " + name, rel_err(h.gpu_f(o2), h.cpu_f(o)), kFp32);
  }
}

const RegisterOpChecks kMoeBf16("moe_bf16", test_moe_bf16);

}  // namespace
}  // namespace sparkserve
