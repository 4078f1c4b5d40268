// bench --synth's in-memory weights (loader/synth_weights.h) against the loader: for every layout,
// `synth --like tiny` written to disk and loaded by load_weights must give the same Linear structs
// (format, activation, features, partitions, every tensor's dtype and shape) and the same bytes in
// every tensor as build_synth_model on the same plan and seed. A forward pass over the in-memory
// model must produce finite logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "backend/synth_fill.h"
#include "core/dtype.h"
#include "loader/safetensors.h"
#include "loader/synth_checkpoint.h"
#include "loader/synth_weights.h"
#include "loader/weights.h"
#include "model/qwen35.h"
#include "runtime/direct_state.h"

namespace sparkserve {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name)
      : path(fs::temp_directory_path() / ("sparkserve_synthw_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
  }
  ~Dir() { fs::remove_all(path); }
};

void expect_same_tensor(const std::string& what, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.data == nullptr, b.data == nullptr) << what;
  if (!a.data) return;
  EXPECT_EQ(a.dtype, b.dtype) << what;
  EXPECT_EQ(a.shape, b.shape) << what << ": " << shape_to_string(a.shape) << " vs " << shape_to_string(b.shape);
  if (a.dtype != b.dtype || a.shape != b.shape) return;
  // CPU backend: tensors are host memory.
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << what << ": bytes differ";
}

class SynthWeightsTest : public ::testing::TestWithParam<SynthLayout> {};

TEST_P(SynthWeightsTest, SameStructsAndBytesAsTheLoaderOnTheWrittenCheckpoint) {
  const SynthLayout layout = GetParam();
  auto like = model_like("tiny");
  ASSERT_TRUE(like.ok()) << like.message();
  const SynthPlan plan = synth_plan(*like, layout);
  const uint64_t seed = 5;
  Dir dir(std::string(synth_layout_name(layout)));
  SynthOptions o;
  o.out = dir.path;
  o.seed = seed;
  o.threads = 2;
  auto written = write_synth_checkpoint(plan, o);
  ASSERT_TRUE(written.ok()) << written.message();

  auto backend = make_cpu_backend(2);
  auto ckpt = Checkpoint::open(dir.path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  auto config = load_model_config(dir.path);
  ASSERT_TRUE(config.ok()) << config.message();
  auto loaded = load_weights(*ckpt, *config, *backend);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  auto synth = build_synth_model(plan, *backend, seed);
  ASSERT_TRUE(synth.ok()) << synth.message();

  EXPECT_EQ(synth->config.num_hidden_layers, config->num_hidden_layers);
  EXPECT_EQ(synth->config.vocab_size, config->vocab_size);
  EXPECT_EQ(synth->config.num_experts, config->num_experts);
  EXPECT_EQ(synth->config.layer_types, config->layer_types);
  EXPECT_EQ(synth->weights.report.prefix, loaded->report.prefix);
  EXPECT_EQ(synth->weights.report.per_expert_layout, loaded->report.per_expert_layout);
  EXPECT_EQ(synth->weights.report.visual_tensors, loaded->report.visual_tensors);
  EXPECT_EQ(synth->weights.report.mtp_tensors, loaded->report.mtp_tensors);
  EXPECT_TRUE(loaded->report.unexpected.empty());
  // The MTP layer: built on request, as the loader's load_mtp does.
  EXPECT_FALSE(synth->weights.mtp.present);
  auto with_mtp = build_synth_model(plan, *backend, seed, /*with_mtp=*/true);
  ASSERT_TRUE(with_mtp.ok()) << with_mtp.message();
  EXPECT_TRUE(with_mtp->weights.mtp.present);
  EXPECT_EQ(with_mtp->weights.report.mtp_tensors, 0);
  EXPECT_EQ(with_mtp->weights.mtp.fc.in_features, 2 * synth->config.hidden_size);

  const auto a = model_linears(*loaded);
  const auto b = model_linears(synth->weights);
  ASSERT_EQ(a.size(), b.size());
  int quantized = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& n = a[i].first;
    ASSERT_EQ(n, b[i].first);
    const Linear& x = *a[i].second;
    const Linear& y = *b[i].second;
    EXPECT_EQ(x.format, y.format) << n << ": " << weight_format_name(x.format) << " vs " << weight_format_name(y.format);
    EXPECT_EQ(x.activation, y.activation) << n;
    EXPECT_EQ(x.out_features, y.out_features) << n;
    EXPECT_EQ(x.in_features, y.in_features) << n;
    EXPECT_EQ(x.partitions, y.partitions) << n;
    expect_same_tensor(n + ".weight", x.weight, y.weight);
    expect_same_tensor(n + ".weight_scale", x.weight_scale, y.weight_scale);
    expect_same_tensor(n + ".global_scale", x.global_scale, y.global_scale);
    expect_same_tensor(n + ".input_scale", x.input_scale, y.input_scale);
    if (is_quantized(x.format)) ++quantized;
  }
  // The layouts really are quantized where they say so (not a BF16 model under another name).
  if (layout == SynthLayout::kBf16) EXPECT_EQ(quantized, 0);
  else EXPECT_GT(quantized, 0);
  const auto ta = model_weight_tensors(*loaded);
  const auto tb = model_weight_tensors(synth->weights);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    ASSERT_EQ(ta[i].first, tb[i].first);
    expect_same_tensor(ta[i].first, ta[i].second, tb[i].second);
  }
  EXPECT_EQ(weights_digest(*loaded, *backend), weights_digest(synth->weights, *backend));
  EXPECT_GT(synth->token_bytes, 0.0);
  EXPECT_LT(synth->token_bytes, static_cast<double>(synth->total_bytes));

  // The in-memory model runs: finite logits after a prompt and a decode step.
  Qwen35Model model(*backend, synth->config, std::move(synth->weights));
  StateLimits lim;
  lim.num_kv_blocks = 8;
  DirectState st(*backend, model.config(), lim);
  auto seq = st.open_sequence();
  ASSERT_TRUE(seq.ok());
  std::vector<SequenceInput> batch(1);
  batch[0].state = &*seq;
  batch[0].tokens = {3, 999, 0, 512, 77};
  for (int step = 0; step < 2; ++step) {
    auto logits = st.forward(model, batch);
    ASSERT_TRUE(logits.ok()) << logits.message();
    float amax = 0;
    for (float v : logits->data) {
      ASSERT_TRUE(std::isfinite(v));
      amax = std::max(amax, std::fabs(v));
    }
    EXPECT_GT(amax, 0.0f);  // not an all-zero stub
    batch[0].tokens = {42};
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, SynthWeightsTest,
                         ::testing::Values(SynthLayout::kBf16, SynthLayout::kNvfp4, SynthLayout::kNvfp4Fp8Dense,
                                           SynthLayout::kFp8, SynthLayout::kModelOptNvfp4),
                         [](const ::testing::TestParamInfo<SynthLayout>& info) {
                           std::string s(synth_layout_name(info.param));
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// The fill is the `synth` generator: a different seed or name gives different bytes, and a table
// fill reads the table (a constant table gives that constant everywhere).
TEST(SynthFill, SeedChangesBytesAndTablesAreRead) {
  auto backend = make_cpu_backend(1);
  Buffer a(backend.get(), DType::kU8, {1000}), b(backend.get(), DType::kU8, {1000});
  synth_fill(*backend, a, SynthFillKind::kRandomBytes, 1, {});
  synth_fill(*backend, b, SynthFillKind::kRandomBytes, 2, {});
  EXPECT_NE(std::memcmp(a.tensor().data, b.tensor().data, 1000), 0);
  Buffer tab(backend.get(), DType::kBF16, {65536}), out(backend.get(), DType::kF32, {999});
  std::vector<uint16_t> host(65536, f32_to_bf16(0.25f));
  backend->upload(tab, host.data());
  synth_fill(*backend, out, SynthFillKind::kTableBf16F32, 9, tab);
  for (int i = 0; i < 999; ++i) ASSERT_EQ(out.tensor().ptr<float>()[i], 0.25f);
  Buffer sc(backend.get(), DType::kF8E4M3, {4096});
  synth_fill(*backend, sc, SynthFillKind::kE4M3Scales, 4, {});
  for (int i = 0; i < 4096; ++i) {
    const float v = fp8_e4m3_to_f32(sc.tensor().ptr<uint8_t>()[i]);
    ASSERT_TRUE(v >= 16.0f && v <= 240.0f) << v;
  }
}

}  // namespace
}  // namespace sparkserve
