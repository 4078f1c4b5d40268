// The per-module format decision: read from tensors, checked against the config; each malformed
// case gives its message naming the module.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "loader/quant_scheme.h"

namespace sparkserve {
namespace {

using ::testing::HasSubstr;

// A tensor list built by hand (no files): name -> dtype, shape.
class Tensors {
 public:
  Tensors& add(const std::string& name, DType dt, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = name;
    t.dtype = dt;
    t.shape = std::move(shape);
    uint64_t n = dtype_size(dt);
    for (auto d : t.shape) n *= static_cast<uint64_t>(d);
    t.nbytes = n;
    map_[name] = t;
    return *this;
  }
  Tensors& bf16(const std::string& module, int64_t N, int64_t K) { return add(module + ".weight", DType::kBF16, {N, K}); }
  Tensors& nvfp4(const std::string& m, int64_t N, int64_t K, bool input_scale = true) {
    add(m + ".weight_packed", DType::kU8, {N, K / 2});
    add(m + ".weight_scale", DType::kF8E4M3, {N, K / 16});
    add(m + ".weight_global_scale", DType::kF32, {1});
    if (input_scale) add(m + ".input_global_scale", DType::kF32, {1});
    return *this;
  }
  Tensors& modelopt(const std::string& m, int64_t N, int64_t K, bool input_scale = true) {
    add(m + ".weight", DType::kU8, {N, K / 2});
    add(m + ".weight_scale", DType::kF8E4M3, {N, K / 16});
    add(m + ".weight_scale_2", DType::kF32, {});
    if (input_scale) add(m + ".input_scale", DType::kF32, {});
    return *this;
  }
  Tensors& fp8(const std::string& m, int64_t N, int64_t K, std::vector<int64_t> scale_shape = {}) {
    add(m + ".weight", DType::kF8E4M3, {N, K});
    add(m + ".weight_scale", DType::kBF16, scale_shape.empty() ? std::vector<int64_t>{N, 1} : scale_shape);
    return *this;
  }
  Tensors& erase(const std::string& name) {
    map_.erase(name);
    return *this;
  }
  const std::map<std::string, TensorInfo>& map() const { return map_; }

 private:
  std::map<std::string, TensorInfo> map_;
};

const std::string L = "model.language_model.layers.0.";

const char* kNvfp4Args = R"("weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
  "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"})";
const char* kFp8Args = R"("weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
  "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true})";

QuantConfig ct_config(const std::string& groups, const std::string& ignore) {
  auto c = parse_quant_config_text(R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "mixed-precision",
      "config_groups": )" + groups + R"(, "ignore": )" + ignore + "}}", "");
  EXPECT_TRUE(c.ok()) << c.message();
  return c.value();
}

std::string group(const std::string& targets, const char* args) {
  return R"({"targets": )" + targets + ", " + args + "}";
}

// A small MoE-like module set: NVFP4 experts (2), FP8 attention, BF16 router and lm_head.
Tensors mixed_tensors() {
  Tensors t;
  t.add("model.language_model.embed_tokens.weight", DType::kBF16, {64, 32});
  t.add(L + "input_layernorm.weight", DType::kBF16, {32});
  for (int e = 0; e < 2; ++e) {
    const std::string X = L + "mlp.experts." + std::to_string(e) + ".";
    t.nvfp4(X + "gate_proj", 16, 32).nvfp4(X + "up_proj", 16, 32).nvfp4(X + "down_proj", 32, 16);
  }
  t.fp8(L + "self_attn.q_proj", 64, 32);
  t.bf16(L + "mlp.gate", 2, 32);
  t.bf16("lm_head", 64, 32);
  t.add(L + "linear_attn.A_log", DType::kF32, {4});
  return t;
}

QuantConfig mixed_config(const std::string& ignore = R"(["lm_head", "re:.*mlp\\.gate$"])") {
  return ct_config(R"({"group_0": )" + group(R"(["Linear"])", kFp8Args) + R"(, "group_1": )" +
                       group(R"(["re:.*mlp\\.experts\\..*"])", kNvfp4Args) + "}",
                   ignore);
}

TEST(QuantScheme, SplitModuleRole) {
  EXPECT_EQ(split_module_role("a.b.weight_packed"), (std::pair<std::string, std::string>{"a.b", "weight_packed"}));
  EXPECT_EQ(split_module_role("a.b.weight_scale_2"), (std::pair<std::string, std::string>{"a.b", "weight_scale_2"}));
  EXPECT_EQ(split_module_role("a.b.input_global_scale"), (std::pair<std::string, std::string>{"a.b", "input_global_scale"}));
  EXPECT_EQ(split_module_role("a.linear_attn.A_log"), (std::pair<std::string, std::string>{"a.linear_attn.A_log", ""}));
  EXPECT_EQ(split_module_role("a.mlp.experts.gate_up_proj"), (std::pair<std::string, std::string>{"a.mlp.experts.gate_up_proj", ""}));
  EXPECT_EQ(split_module_role("lm_head.weight"), (std::pair<std::string, std::string>{"lm_head", "weight"}));
}

TEST(QuantScheme, MixedLayoutEveryModuleGetsItsFormat) {
  const Tensors t = mixed_tensors();
  auto plan = plan_module_formats(t.map(), mixed_config());
  ASSERT_TRUE(plan.ok()) << plan.message();
  EXPECT_TRUE(plan->warnings.empty()) << ::testing::PrintToString(plan->warnings);
  const ModuleFormat* up = plan->find(L + "mlp.experts.1.up_proj");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->format, WeightFormat::kNvfp4);
  EXPECT_EQ(up->activation, ActivationQuant::kNvfp4);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(up->tensors.weight->name, L + "mlp.experts.1.up_proj.weight_packed");
  EXPECT_EQ(up->tensors.global_scale->name, L + "mlp.experts.1.up_proj.weight_global_scale");
  EXPECT_EQ(up->tensors.input_scale->name, L + "mlp.experts.1.up_proj.input_global_scale");
  EXPECT_THAT(up->decided_by, HasSubstr("group_1"));
  const ModuleFormat* q = plan->find(L + "self_attn.q_proj");
  EXPECT_EQ(q->format, WeightFormat::kFp8Channel);
  EXPECT_EQ(q->activation, ActivationQuant::kFp8TokenDynamic);
  EXPECT_EQ(plan->find("lm_head")->format, WeightFormat::kBf16);
  EXPECT_THAT(plan->find("lm_head")->decided_by, HasSubstr("ignore entry \"lm_head\""));
  EXPECT_EQ(plan->find(L + "mlp.gate")->format, WeightFormat::kBf16);
  EXPECT_EQ(plan->find(L + "linear_attn.A_log")->format, WeightFormat::kF32);
  EXPECT_EQ(plan->find(L + "input_layernorm")->format, WeightFormat::kBf16);
  EXPECT_EQ(plan->find("model.language_model.embed_tokens")->cls, ModuleClass::kEmbedding);
}

TEST(QuantScheme, OverlappingTargetsWarn) {
  // "re:.*experts.*" (group_0, FP8) and "re:.*mlp.experts.*" (group_1, NVFP4): compressed-tensors picks the
  // alphabetically first pattern ("re:.*experts.*" < "re:.*mlp..."), vLLM the first listed - here the same
  // group, so list them the other way round to make the tools disagree.
  Tensors t;
  t.nvfp4(L + "mlp.experts.0.up_proj", 16, 32);
  const QuantConfig c = ct_config(R"({"group_0": )" + group(R"(["re:.*mlp\\.experts.*"])", kNvfp4Args) + R"(, "group_1": )" +
                                      group(R"(["re:.*experts.*"])", kFp8Args) + "}",
                                  "[]");
  // compressed-tensors applies group_1 (FP8) -> tensors (NVFP4) disagree: an error, and the overlap warning.
  auto plan = plan_module_formats(t.map(), c);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr(L + "mlp.experts.0.up_proj: config says float-quantized FP8 channel"));
  // Swap the tensors to FP8: consistent with compressed-tensors' choice, with the overlap warning.
  Tensors f;
  f.fp8(L + "mlp.experts.0.up_proj", 16, 32);
  auto ok = plan_module_formats(f.map(), c);
  ASSERT_TRUE(ok.ok()) << ok.message();
  ASSERT_FALSE(ok->warnings.empty());
  EXPECT_THAT(ok->warnings[0], HasSubstr("overlapping targets: compressed-tensors applies group_1 (target \"re:.*experts.*\") "
                                         "but vLLM's first-match order would apply group_0"));
}

TEST(QuantScheme, ExactNameBeatsRegexBeatsClass) {
  Tensors t;
  t.fp8(L + "self_attn.q_proj", 64, 32).nvfp4(L + "self_attn.k_proj", 16, 32).nvfp4(L + "self_attn.v_proj", 16, 32);
  const QuantConfig c = ct_config(R"({"a": )" + group(R"(["Linear", ")" + L + R"(self_attn.q_proj"])", kFp8Args) + R"(, "b": )" +
                                      group(R"(["re:.*self_attn.*"])", kNvfp4Args) + "}",
                                  "[]");
  auto plan = plan_module_formats(t.map(), c);
  ASSERT_TRUE(plan.ok()) << plan.message();
  EXPECT_EQ(plan->find(L + "self_attn.q_proj")->format, WeightFormat::kFp8Channel);
  EXPECT_EQ(plan->find(L + "self_attn.k_proj")->format, WeightFormat::kNvfp4);
  // q_proj: exact name (group a) vs regex (group b): vLLM's first-match also finds "a" first -> no warning.
  EXPECT_TRUE(plan->warnings.empty()) << ::testing::PrintToString(plan->warnings);
}

TEST(QuantScheme, WrongTensorDtypeIsAnError) {
  Tensors t = mixed_tensors();
  t.add(L + "mlp.experts.1.down_proj.weight_scale", DType::kF32, {32, 1});  // should be F8_E4M3 [32, 1]
  auto plan = plan_module_formats(t.map(), mixed_config());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr(L + "mlp.experts.1.down_proj: weight_scale must be F8_E4M3 [32, 1], got F32 [32, 1]"));
  Tensors u = mixed_tensors();
  u.add(L + "self_attn.q_proj.weight_scale", DType::kU8, {64, 1});
  auto p2 = plan_module_formats(u.map(), mixed_config());
  ASSERT_FALSE(p2.ok());
  EXPECT_THAT(p2.message(), HasSubstr(L + "self_attn.q_proj: weight_scale of an FP8 weight must be F32/BF16/F16, got U8 [64, 1]"));
  Tensors v = mixed_tensors();
  v.add(L + "mlp.experts.0.up_proj.weight_packed", DType::kI32, {16, 4});
  auto p3 = plan_module_formats(v.map(), mixed_config());
  ASSERT_FALSE(p3.ok());
  EXPECT_THAT(p3.message(), HasSubstr("integer pack-quantized"));
}

TEST(QuantScheme, MissingScaleIsAnErrorNamingTheTensor) {
  Tensors t = mixed_tensors();
  t.erase(L + "mlp.experts.1.gate_proj.weight_global_scale");  // expert 1, not expert 0: every expert is checked
  auto plan = plan_module_formats(t.map(), mixed_config());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr("missing tensor " + L + "mlp.experts.1.gate_proj.weight_global_scale"));
  Tensors u = mixed_tensors();
  u.erase(L + "mlp.experts.1.up_proj.input_global_scale");  // W4A4 needs the activation global scale
  auto p2 = plan_module_formats(u.map(), mixed_config());
  ASSERT_FALSE(p2.ok());
  EXPECT_THAT(p2.message(), HasSubstr("tensor " + L + "mlp.experts.1.up_proj.input_global_scale is missing"));
  Tensors v = mixed_tensors();
  v.erase(L + "self_attn.q_proj.weight_scale");
  auto p3 = plan_module_formats(v.map(), mixed_config());
  ASSERT_FALSE(p3.ok());
  EXPECT_THAT(p3.message(), HasSubstr(L + "self_attn.q_proj: FP8 weight without weight_scale (missing tensor " + L +
                                      "self_attn.q_proj.weight_scale)"));
}

TEST(QuantScheme, IgnoreEntryMatchingNothingWarns) {
  const Tensors t = mixed_tensors();
  auto plan = plan_module_formats(t.map(), mixed_config(R"(["lm_head", "re:.*mlp\\.gate$", "model.language_model.layers.0.linear_attn",
      "model.language_model.layers.0.input_layernorm", "re:.*input_layernorm$", "model.layers.0.linear_attn.A_log",
      "model.language_model.layers.7.mlp.gate", "re:.*vision_tower.*"])"));
  ASSERT_TRUE(plan.ok()) << plan.message();
  // linear_attn is a parent of A_log, input_layernorm a norm, A_log under another prefix: all count as
  // matching (llm-compressor lists non-Linear modules).
  EXPECT_THAT(plan->warnings, ::testing::UnorderedElementsAre(
                                  "ignore entry \"model.language_model.layers.7.mlp.gate\" matches no module",
                                  "ignore entry \"re:.*vision_tower.*\" matches no module"));
}

TEST(QuantScheme, GroupMatchingNothingWarns) {
  const Tensors t = mixed_tensors();
  const QuantConfig c = ct_config(R"({"group_0": )" + group(R"(["Linear"])", kFp8Args) + R"(, "group_1": )" +
                                      group(R"(["re:.*mlp\\.experts\\..*"])", kNvfp4Args) + R"(, "group_2": )" +
                                      group(R"(["re:.*shared_expert\\..*"])", kNvfp4Args) + "}",
                                  R"(["lm_head", "re:.*mlp\\.gate$"])");
  auto plan = plan_module_formats(t.map(), c);
  ASSERT_TRUE(plan.ok()) << plan.message();
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("config group group_2 (targets \"re:.*shared_expert\\..*\") matches no module"));
}

TEST(QuantScheme, ConfigDisagreeingWithTensorsIsAnError) {
  // The router is not ignored: "Linear" -> FP8, but the tensors hold BF16.
  const Tensors t = mixed_tensors();
  auto plan = plan_module_formats(t.map(), mixed_config(R"(["lm_head"])"));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr(L + "mlp.gate: config says float-quantized FP8 channel, dynamic per-token activations "
                                        "(group_0 target \"Linear\") but tensors hold bf16 (BF16 [2, 32])"));
  // An NVFP4 module whose config is FP8 (experts not targeted by the NVFP4 regex).
  const QuantConfig fp8_only = ct_config(R"({"group_0": )" + group(R"(["Linear"])", kFp8Args) + "}", R"(["lm_head", "re:.*mlp\\.gate$"])");
  auto p2 = plan_module_formats(t.map(), fp8_only);
  ASSERT_FALSE(p2.ok());
  EXPECT_THAT(p2.message(), HasSubstr(L + "mlp.experts.0.down_proj: config says float-quantized FP8 channel"));
  EXPECT_THAT(p2.message(), HasSubstr("but tensors hold nvfp4 (U8 [32, 8])"));
  EXPECT_THAT(p2.message(), HasSubstr("6 module(s) have no consistent reading"));
}

TEST(QuantScheme, QuantizedButIgnoredIsAnError) {
  const Tensors t = mixed_tensors();
  auto plan = plan_module_formats(t.map(), mixed_config(R"(["lm_head", "re:.*mlp\\.gate$", "re:.*experts\\.1\\.down_proj$"])"));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr(L + "mlp.experts.1.down_proj: tensors hold nvfp4 (U8 [32, 8]) but the config leaves it "
                                        "unquantized (ignore entry \"re:.*experts\\.1\\.down_proj$\")"));
}

TEST(QuantScheme, IgnoreWithOtherPrefixesStillApplies) {
  const Tensors t = mixed_tensors();
  // vLLM-namespace and short-namespace entries for the router and lm_head.
  auto plan = plan_module_formats(t.map(), mixed_config(R"(["language_model.lm_head", "model.layers.0.mlp.gate"])"));
  ASSERT_TRUE(plan.ok()) << plan.message();
  EXPECT_THAT(plan->find("lm_head")->decided_by, HasSubstr("language_model.lm_head"));
  EXPECT_THAT(plan->find(L + "mlp.gate")->decided_by, HasSubstr("model.layers.0.mlp.gate"));
}

TEST(QuantScheme, QuantizedTensorsWithoutConfigAreAnError) {
  const Tensors t = mixed_tensors();
  auto plan = plan_module_formats(t.map(), QuantConfig{});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr("but the checkpoint has no quantization config"));
}

TEST(QuantScheme, Fp8BlockAndBadScaleShapesAreRefused) {
  Tensors t;
  t.fp8(L + "self_attn.q_proj", 256, 256, {2, 2});
  const QuantConfig c = ct_config(R"({"g": )" + group(R"(["Linear"])", kFp8Args) + "}", "[]");
  auto plan = plan_module_formats(t.map(), c);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.message(), HasSubstr("block-quantized FP8 is not supported"));
  Tensors u;
  u.nvfp4(L + "self_attn.q_proj", 16, 32).add(L + "self_attn.q_proj.weight_scale", DType::kF8E4M3, {16, 4});
  auto p2 = plan_module_formats(u.map(), ct_config(R"({"g": )" + group(R"(["Linear"])", kNvfp4Args) + "}", "[]"));
  ASSERT_FALSE(p2.ok());
  EXPECT_THAT(p2.message(), HasSubstr("weight_scale must be F8_E4M3 [16, 2], got F8_E4M3 [16, 4]"));
  Tensors v;
  v.nvfp4(L + "self_attn.q_proj", 16, 32).add(L + "self_attn.q_proj.weight_global_scale", DType::kF32, {2});
  auto p3 = plan_module_formats(v.map(), ct_config(R"({"g": )" + group(R"(["Linear"])", kNvfp4Args) + "}", "[]"));
  ASSERT_FALSE(p3.ok());
  EXPECT_THAT(p3.message(), HasSubstr("weight_global_scale must be one float value (F32 [1] or scalar), got F32 [2]"));
}

QuantConfig modelopt_config(const std::string& excludes) {
  auto c = parse_quant_config_text("", R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
      "group_size": 16, "kv_cache_quant_algo": null, "exclude_modules": )" + excludes + "}}");
  EXPECT_TRUE(c.ok()) << c.message();
  return c.value();
}

TEST(QuantScheme, ModelOptNvfp4) {
  Tensors t;
  t.modelopt(L + "mlp.experts.0.up_proj", 16, 32).modelopt(L + "self_attn.q_proj", 64, 32).bf16("lm_head", 64, 32);
  t.bf16(L + "mlp.gate", 2, 32);
  auto plan = plan_module_formats(t.map(), modelopt_config(R"(["lm_head", "*mlp.gate", "model.visual*"])"));
  ASSERT_TRUE(plan.ok()) << plan.message();
  const ModuleFormat* up = plan->find(L + "mlp.experts.0.up_proj");
  EXPECT_EQ(up->format, WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(up->activation, ActivationQuant::kNvfp4);
  EXPECT_EQ(up->tensors.global_scale->name, L + "mlp.experts.0.up_proj.weight_scale_2");
  EXPECT_EQ(up->tensors.input_scale->name, L + "mlp.experts.0.up_proj.input_scale");
  EXPECT_EQ(plan->find("lm_head")->format, WeightFormat::kBf16);
  EXPECT_THAT(plan->warnings, ::testing::ElementsAre("exclude_modules entry \"model.visual*\" matches no module"));
  // Excluded but quantized -> error; NVFP4 W4A4 without input_scale -> error.
  auto p2 = plan_module_formats(t.map(), modelopt_config(R"(["lm_head", "*mlp.gate", "*self_attn*"])"));
  ASSERT_FALSE(p2.ok());
  EXPECT_THAT(p2.message(), HasSubstr(L + "self_attn.q_proj: tensors hold nvfp4-modelopt (U8 [64, 16]) but the config leaves it "
                                      "unquantized (exclude_modules entry \"*self_attn*\")"));
  t.erase(L + "self_attn.q_proj.input_scale");
  auto p3 = plan_module_formats(t.map(), modelopt_config(R"(["lm_head", "*mlp.gate"])"));
  ASSERT_FALSE(p3.ok());
  EXPECT_THAT(p3.message(), HasSubstr("tensor " + L + "self_attn.q_proj.input_scale is missing"));
  // CT-style tensors under a ModelOpt config: the formats disagree.
  Tensors u;
  u.nvfp4(L + "self_attn.q_proj", 64, 32);
  auto p4 = plan_module_formats(u.map(), modelopt_config("[]"));
  ASSERT_FALSE(p4.ok());
  EXPECT_THAT(p4.message(), HasSubstr("weight format nvfp4-modelopt) but tensors hold nvfp4 (U8 [64, 16])"));
  // Mixed naming inside one module.
  Tensors v;
  v.modelopt(L + "self_attn.q_proj", 64, 32).add(L + "self_attn.q_proj.weight_global_scale", DType::kF32, {1});
  auto p5 = plan_module_formats(v.map(), modelopt_config("[]"));
  ASSERT_FALSE(p5.ok());
  EXPECT_THAT(p5.message(), HasSubstr("weight_global_scale (compressed-tensors naming)"));
}

TEST(QuantScheme, ModelOptMixedPrecisionPerLayer) {
  Tensors t;
  t.modelopt(L + "mlp.experts.0.up_proj", 16, 32, /*input_scale=*/false).modelopt(L + "mlp.experts.1.up_proj", 16, 32, false);
  t.fp8(L + "self_attn.q_proj", 64, 32, {}).add(L + "self_attn.q_proj.input_scale", DType::kF32, {});
  t.add(L + "self_attn.q_proj.weight_scale", DType::kF32, {});  // ModelOpt FP8: per-tensor F32 scalar
  t.bf16(L + "self_attn.o_proj", 32, 64);
  auto c = parse_quant_config_text("", R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION",
      "quantized_layers": {")" + L + R"(mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
                           ")" + L + R"(self_attn.q_proj": {"quant_algo": "FP8"}}}})");
  ASSERT_TRUE(c.ok()) << c.message();
  auto plan = plan_module_formats(t.map(), *c);
  ASSERT_TRUE(plan.ok()) << plan.message();
  EXPECT_EQ(plan->find(L + "mlp.experts.1.up_proj")->format, WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(plan->find(L + "mlp.experts.1.up_proj")->activation, ActivationQuant::kNone);
  EXPECT_EQ(plan->find(L + "self_attn.q_proj")->format, WeightFormat::kFp8Tensor);
  EXPECT_EQ(plan->find(L + "self_attn.q_proj")->activation, ActivationQuant::kFp8TensorStatic);
  EXPECT_EQ(plan->find(L + "self_attn.o_proj")->decided_by, "not in quantized_layers");
}

TEST(QuantScheme, KvCacheScales) {
  Tensors t = mixed_tensors();
  t.add(L + "self_attn.k_scale", DType::kBF16, {1}).add(L + "self_attn.v_scale", DType::kBF16, {1});
  auto plan = plan_module_formats(t.map(), mixed_config());
  ASSERT_TRUE(plan.ok()) << plan.message();
  ASSERT_EQ(plan->kv_scales.count(L + "self_attn"), 1u);
  EXPECT_NE(plan->kv_scales.at(L + "self_attn").k_scale, nullptr);
  EXPECT_THAT(plan->warnings, ::testing::ElementsAre(HasSubstr("k_scale/v_scale tensors but no KV-cache quantization")));
}

TEST(QuantScheme, RandomTensorSetsNeverCrash) {
  // Random role/dtype/shape soups: the decision returns a plan or an error, never crashes, and every
  // error line names a module.
  std::mt19937 rng(9);
  const char* roles[] = {"weight", "weight_packed", "weight_scale", "weight_global_scale", "input_global_scale",
                         "weight_scale_2", "input_scale", "k_scale", "bias", "weight_zero_point"};
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kU8, DType::kF8E4M3, DType::kI32};
  const QuantConfig configs[] = {QuantConfig{}, mixed_config(), modelopt_config(R"(["lm_head"])")};
  for (int trial = 0; trial < 300; ++trial) {
    Tensors t;
    const int modules = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < modules; ++m) {
      const std::string name = L + (m % 2 ? "mlp.experts." + std::to_string(m) + ".up_proj" : "self_attn.q_proj" + std::to_string(m));
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int r = 0; r < n; ++r) {
        std::vector<int64_t> shape;
        const int rank = static_cast<int>(rng() % 4);
        for (int d = 0; d < rank; ++d) shape.push_back(static_cast<int64_t>(rng() % 40));
        t.add(name + "." + roles[rng() % 10], dtypes[rng() % 5], shape);
      }
    }
    for (const auto& c : configs) {
      auto plan = plan_module_formats(t.map(), c);
      if (!plan.ok()) {
        EXPECT_THAT(plan.message(), HasSubstr(L)) << plan.message();
      }
    }
  }
}

}  // namespace
}  // namespace sparkserve
