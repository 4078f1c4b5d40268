// `synth --like tiny` in every layout, read back through the real loader (Checkpoint, config.json,
// quantization config) and the format decision: every module gets the layout's format, no errors, no
// warnings; the random values are valid; the CLI works end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/dtype.h"
#include "loader/hf_config.h"
#include "loader/quant_scheme.h"
#include "loader/synth_checkpoint.h"

namespace sparkserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("sparkserve_quant_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

struct Written {
  fs::path dir;
  ~Written() { fs::remove_all(dir); }
};

// The format every text Linear of each layout should have (mirrors the layout table in synth_checkpoint.h).
WeightFormat expected_format(SynthLayout layout, const std::string& m) {
  const bool routed = m.find(".mlp.experts.") != std::string::npos;
  const bool small = m.ends_with(".mlp.gate") || m.ends_with(".shared_expert_gate");
  const bool ab = m.ends_with(".in_proj_a") || m.ends_with(".in_proj_b");
  switch (layout) {
    case SynthLayout::kBf16: return WeightFormat::kBf16;
    case SynthLayout::kNvfp4: return WeightFormat::kNvfp4;
    case SynthLayout::kNvfp4Fp8Dense:
      if (routed) return WeightFormat::kNvfp4;
      return (m == "lm_head" || small || ab) ? WeightFormat::kBf16 : WeightFormat::kFp8Channel;
    case SynthLayout::kFp8: return (m == "lm_head" || small) ? WeightFormat::kBf16 : WeightFormat::kFp8Channel;
    case SynthLayout::kModelOptNvfp4:
      return (m == "lm_head" || small || ab) ? WeightFormat::kBf16 : WeightFormat::kNvfp4ModelOpt;
  }
  return WeightFormat::kBf16;
}

class SynthRoundTrip : public ::testing::TestWithParam<SynthLayout> {};

TEST_P(SynthRoundTrip, LoadsWithTheLayoutsFormats) {
  const SynthLayout layout = GetParam();
  auto model = model_like("tiny");
  ASSERT_TRUE(model.ok());
  const SynthPlan plan = synth_plan(*model, layout);
  Written w{temp_dir(std::string(synth_layout_name(layout)))};
  SynthOptions opt;
  opt.out = w.dir;
  opt.shard_bytes = 1'000'000;  // several shards even for tiny
  auto stats = write_synth_checkpoint(plan, opt);
  ASSERT_TRUE(stats.ok()) << stats.message();
  EXPECT_GE(stats->files.size(), 3u);
  EXPECT_TRUE(fs::exists(w.dir / "model_mtp.safetensors"));
  EXPECT_EQ(fs::exists(w.dir / "hf_quant_config.json"), layout == SynthLayout::kModelOptNvfp4);

  auto cfg = load_model_config(w.dir);
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  EXPECT_EQ(cfg->hidden_size, 128);
  EXPECT_EQ(cfg->num_experts, 8);
  EXPECT_EQ(cfg->mtp_num_hidden_layers, 1);
  auto ckpt = Checkpoint::open(w.dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  EXPECT_EQ(ckpt->tensors().size(), plan.tensors.size());
  for (const SynthTensor& t : plan.tensors) {
    const TensorInfo* info = ckpt->find(t.spec.name);
    ASSERT_NE(info, nullptr) << t.spec.name;
    EXPECT_EQ(info->dtype, t.spec.dtype) << t.spec.name;
    EXPECT_EQ(info->shape, t.spec.shape) << t.spec.name;
    EXPECT_EQ(info->file.filename() == "model_mtp.safetensors", t.mtp) << t.spec.name;
  }
  auto qc = load_quant_config(w.dir);
  ASSERT_TRUE(qc.ok()) << qc.message();
  auto qp = plan_module_formats(ckpt->tensors(), *qc);
  ASSERT_TRUE(qp.ok()) << qp.message();
  EXPECT_TRUE(qp->warnings.empty()) << ::testing::PrintToString(qp->warnings);

  int linear = 0, experts_checked = 0;
  for (const auto& [name, m] : qp->modules) {
    const bool off_path = name.starts_with("mtp.") || name.starts_with("model.visual.");
    if (m.cls == ModuleClass::kLinear) {
      ++linear;
      const WeightFormat want = off_path ? WeightFormat::kBf16 : expected_format(layout, name);
      EXPECT_EQ(m.format, want) << name;
      if (name.find(".mlp.experts.") != std::string::npos) ++experts_checked;
      if (m.format == WeightFormat::kNvfp4 || m.format == WeightFormat::kNvfp4ModelOpt) {
        EXPECT_EQ(m.activation, ActivationQuant::kNvfp4) << name;
      }
      if (m.format == WeightFormat::kFp8Channel) {
        EXPECT_EQ(m.activation, ActivationQuant::kFp8TokenDynamic) << name;
      }
    }
    if (m.cls == ModuleClass::kFusedExperts) {
      EXPECT_TRUE(layout == SynthLayout::kBf16 || name.starts_with("mtp.")) << name;
    }
  }
  EXPECT_GT(linear, 0);
  // 4 layers x 8 experts x 3 projections, per expert in every quantized layout.
  EXPECT_EQ(experts_checked, layout == SynthLayout::kBf16 ? 0 : 4 * 8 * 3);

  // Values are valid: finite floats, positive scales, no NaN E4M3 codes.
  for (const auto& [name, info] : ckpt->tensors()) {
    const auto [module, role] = split_module_role(name);
    if (info.dtype == DType::kU8) continue;  // packed E2M1: every nibble is a valid code
    auto values = ckpt->read_f32(info);
    ASSERT_TRUE(values.ok()) << name << ": " << values.message();
    for (float v : *values) {
      ASSERT_TRUE(std::isfinite(v)) << name;
      if (role.find("scale") != std::string::npos) {
        ASSERT_GT(v, 0.0f) << name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, SynthRoundTrip,
                         ::testing::Values(SynthLayout::kBf16, SynthLayout::kNvfp4, SynthLayout::kNvfp4Fp8Dense,
                                           SynthLayout::kFp8, SynthLayout::kModelOptNvfp4),
                         [](const auto& info) {
                           std::string n(synth_layout_name(info.param));
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Synth, OutputDoesNotDependOnThreadsAndSeedChangesIt) {
  auto model = model_like("tiny");
  const SynthPlan plan = synth_plan(*model, SynthLayout::kNvfp4Fp8Dense);
  Written a{temp_dir("t1")}, b{temp_dir("t3")}, c{temp_dir("seed")};
  SynthOptions o;
  o.out = a.dir;
  o.threads = 1;
  ASSERT_TRUE(write_synth_checkpoint(plan, o).ok());
  o.out = b.dir;
  o.threads = 3;
  ASSERT_TRUE(write_synth_checkpoint(plan, o).ok());
  o.out = c.dir;
  o.seed = 7;
  ASSERT_TRUE(write_synth_checkpoint(plan, o).ok());
  const std::string f = "model-00001-of-00001.safetensors";
  EXPECT_EQ(file_bytes(a.dir / f), file_bytes(b.dir / f));
  EXPECT_NE(file_bytes(a.dir / f), file_bytes(c.dir / f));
  EXPECT_EQ(file_bytes(a.dir / "model_mtp.safetensors"), file_bytes(b.dir / "model_mtp.safetensors"));
}

TEST(Synth, RefusesAFolderWithSafetensors) {
  auto model = model_like("tiny");
  const SynthPlan plan = synth_plan(*model, SynthLayout::kBf16);
  Written a{temp_dir("twice")};
  SynthOptions o;
  o.out = a.dir;
  ASSERT_TRUE(write_synth_checkpoint(plan, o).ok());
  auto again = write_synth_checkpoint(plan, o);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.message(), HasSubstr(".safetensors; synth writes into an empty folder"));
}

TEST(Synth, VocabAndLayerOverrides) {
  auto model = model_like("qwen3.5-35b-a3b");
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE(resize_model(*model, 1000, 6).ok());
  EXPECT_EQ(model->text.num_hidden_layers, 6);
  EXPECT_EQ(model->text.layer_types.size(), 6u);
  EXPECT_EQ(model->text.layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(model->text.layer_types[4], LayerType::kLinearAttention);
  EXPECT_FALSE(resize_model(*model, 0, std::nullopt).ok());
  EXPECT_FALSE(model_like("qwen3.5-7b").ok());
  EXPECT_THAT(model_like("qwen3.5-7b").message(), HasSubstr("known: qwen3.5-122b-a10b, qwen3.5-35b-a3b, tiny"));
}

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

TEST(SynthCli, SynthThenInspect) {
  Written a{temp_dir("cli")};
  int st = 0;
  std::string out = run(std::string(SPARKSERVE_BINARY) + " synth --like tiny --layout nvfp4-fp8dense --vocab 512 --out " +
                            a.dir.string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_THAT(out, HasSubstr("wrote"));
  out = run(std::string(SPARKSERVE_BINARY) + " inspect " + a.dir.string() + " --json", &st);
  ASSERT_EQ(st, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["warnings"].size(), 0u);
  // Same numbers from shapes alone.
  std::string like = run(std::string(SPARKSERVE_BINARY) + " inspect --like tiny --layout nvfp4-fp8dense --vocab 512 --json", &st);
  ASSERT_EQ(st, 0) << like;
  auto k = nlohmann::json::parse(like);
  EXPECT_EQ(j["total"], k["total"]);
  EXPECT_EQ(j["components"], k["components"]);
  bool saw_expert = false;
  for (const auto& m : j["modules"])
    if (m["name"] == "model.language_model.layers.0.mlp.experts.7.down_proj") {
      saw_expert = true;
      EXPECT_EQ(m["format"], "nvfp4");
      EXPECT_EQ(m["shape"], nlohmann::json({128, 64}));
    }
  EXPECT_TRUE(saw_expert);
  // Errors are clear and the exit status is non-zero.
  out = run(std::string(SPARKSERVE_BINARY) + " inspect --like tiny --layout int4", &st);
  EXPECT_NE(st, 0);
  EXPECT_THAT(out, HasSubstr("unknown layout 'int4'"));
  out = run(std::string(SPARKSERVE_BINARY) + " synth --like tiny --layout bf16 --out " + a.dir.string(), &st);
  EXPECT_NE(st, 0);
  EXPECT_THAT(out, HasSubstr("already holds"));
}

}  // namespace
}  // namespace sparkserve
