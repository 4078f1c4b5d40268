// Parameter counts and bytes per decoded token of the real model shapes, checked against
// model-qwen35.md §6 (122.11B text parameters, 125.09B with MTP and vision; all-NVFP4 5.07 GB/token;
// NVFP4 experts + FP8 dense + BF16 lm_head/router/gates/in_proj_a,b 8.24 GB/token) and against exact
// closed forms written here from the dimensions.
#include <gtest/gtest.h>

#include "loader/quant_scheme.h"
#include "loader/synth_checkpoint.h"
#include "loader/weight_budget.h"

namespace sparkserve {
namespace {

WeightBudget budget(const std::string& model_name, SynthLayout layout) {
  auto model = model_like(model_name);
  EXPECT_TRUE(model.ok());
  const SynthPlan sp = synth_plan(*model, layout);
  auto qc = parse_quant_config(sp.config, sp.hf_quant_config);
  EXPECT_TRUE(qc.ok()) << qc.message();
  static std::map<std::string, TensorInfo> infos;  // the plan points into it
  infos = synth_tensor_infos(sp);
  static QuantPlan plan;
  auto p = plan_module_formats(infos, *qc);
  EXPECT_TRUE(p.ok()) << p.message();
  EXPECT_TRUE(p->warnings.empty());
  plan = std::move(p.value());
  return compute_weight_budget(plan, model->text.num_experts, model->text.num_experts_per_tok);
}

uint64_t comp(const WeightBudget& b, Component c, uint64_t ComponentBudget::*field) {
  return b.components[static_cast<size_t>(c)].*field;
}

TEST(Budget, Qwen122bParameterCounts) {
  const WeightBudget b = budget("qwen3.5-122b-a10b", SynthLayout::kBf16);
  EXPECT_EQ(b.text_params, 122111526912ull);  // §6.1, = GGUF metadata 122.11B
  EXPECT_EQ(b.total_params, 125086497008ull);
  EXPECT_EQ(comp(b, Component::kRoutedExperts, &ComponentBudget::params), 115964116992ull);
  EXPECT_EQ(comp(b, Component::kSharedExpert, &ComponentBudget::params), 452984832ull);
  EXPECT_EQ(comp(b, Component::kVision, &ComponentBudget::params), 451290864ull);
  EXPECT_EQ(comp(b, Component::kMtp, &ComponentBudget::params), 2523679232ull);
  EXPECT_EQ(comp(b, Component::kEmbeddings, &ComponentBudget::params), 762839040ull);
  EXPECT_EQ(comp(b, Component::kLmHead, &ComponentBudget::params), 762839040ull);
  EXPECT_EQ(b.total_bytes, 2 * 125086497008ull);  // 250.2 GB BF16
}

TEST(Budget, Qwen35bParameterCounts) {
  const WeightBudget b = budget("qwen3.5-35b-a3b", SynthLayout::kBf16);
  // §6.1 note: text 34.66B, MTP 0.84B, vision 0.45B, total 35.95B.
  EXPECT_NEAR(b.text_params / 1e9, 34.66, 0.005);
  EXPECT_NEAR(comp(b, Component::kMtp, &ComponentBudget::params) / 1e9, 0.84, 0.005);
  EXPECT_NEAR(b.total_params / 1e9, 35.95, 0.005);
}

// Closed forms for 122B: H 3072, 48 layers (36 GDN + 12 attention), 256 experts top-8, I = Is = 1024,
// vocab 248320. NVFP4 [N,K]: N*K/2 + N*K/16 + 8 bytes (two F32 global scales); FP8 [N,K]: N*K + 2N;
// BF16: 2*N*K.
constexpr uint64_t H = 3072, I = 1024, E = 256, TOPK = 8, V = 248320;
uint64_t nv(uint64_t n, uint64_t k) { return n * k / 2 + n * k / 16 + 8; }
uint64_t f8(uint64_t n, uint64_t k) { return n * k + 2 * n; }
uint64_t bf(uint64_t n, uint64_t k) { return 2 * n * k; }
constexpr uint64_t kVectors122b = 2 * (48 * 2 * H + H + 36 * (64 + 64 + 128) + 12 * (256 + 256));  // norms, A_log, dt_bias

TEST(Budget, Qwen122bAllNvfp4BytesPerToken) {
  const WeightBudget b = budget("qwen3.5-122b-a10b", SynthLayout::kNvfp4);
  auto lin = nv;
  const uint64_t routed = 48 * TOPK * (2 * lin(I, H) + lin(H, I));
  const uint64_t shared = 48 * (2 * lin(I, H) + lin(H, I));
  const uint64_t router = 48 * (lin(E, H) + lin(1, H));
  const uint64_t gdn = 36 * (lin(12288, H) + lin(8192, H) + 2 * lin(64, H) + lin(H, 8192));
  const uint64_t attn = 12 * (lin(16384, H) + 2 * lin(512, H) + lin(H, 8192));
  const uint64_t conv = 36 * 2 * 12288 * 4;
  const uint64_t want = routed + shared + router + gdn + attn + lin(V, H) + 2 * H /*one embedding row*/ + kVectors122b + conv;
  EXPECT_NEAR(b.token_bytes, static_cast<double>(want), 1.0);
  EXPECT_NEAR(b.token_bytes / 1e9, 5.07, 0.005);  // §6.3 (a)
}

TEST(Budget, Qwen122bNvfp4ExpertsFp8DenseBytesPerToken) {
  const WeightBudget b = budget("qwen3.5-122b-a10b", SynthLayout::kNvfp4Fp8Dense);
  const uint64_t routed = 48 * TOPK * (2 * nv(I, H) + nv(H, I));
  const uint64_t shared = 48 * (2 * f8(I, H) + f8(H, I));
  const uint64_t router = 48 * (bf(E, H) + bf(1, H));
  const uint64_t gdn = 36 * (f8(12288, H) + f8(8192, H) + 2 * bf(64, H) + f8(H, 8192));
  const uint64_t attn = 12 * (f8(16384, H) + 2 * f8(512, H) + f8(H, 8192));
  const uint64_t conv = 36 * 2 * 12288 * 4;
  const uint64_t want = routed + shared + router + gdn + attn + bf(V, H) + 2 * H + kVectors122b + conv;
  EXPECT_NEAR(b.token_bytes, static_cast<double>(want), 1.0);
  EXPECT_NEAR(b.token_bytes / 1e9, 8.24, 0.005);  // §6.3 (b)
  EXPECT_NEAR(b.components[static_cast<size_t>(Component::kLmHead)].token_bytes / 1e9, 1.53, 0.005);
  EXPECT_NEAR(b.components[static_cast<size_t>(Component::kRoutedExperts)].token_bytes / 1e9, 2.04, 0.005);
}

TEST(Budget, TiedEmbeddingsCountTheTableAsLmHead) {
  auto model = model_like("tiny");
  model->text.tie_word_embeddings = true;
  const SynthPlan sp = synth_plan(*model, SynthLayout::kBf16);
  const auto infos = synth_tensor_infos(sp);
  EXPECT_EQ(infos.count("lm_head.weight"), 0u);
  auto plan = plan_module_formats(infos, QuantConfig{});
  ASSERT_TRUE(plan.ok()) << plan.message();
  const WeightBudget b = compute_weight_budget(*plan, 8, 2);
  EXPECT_TRUE(b.lm_head_tied);
  EXPECT_EQ(b.components[static_cast<size_t>(Component::kLmHead)].token_bytes, 2.0 * 1024 * 128);
}

}  // namespace
}  // namespace sparkserve
