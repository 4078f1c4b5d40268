// Parsing compressed-tensors and ModelOpt quantization configs, and refusing what cannot run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "loader/quant_config.h"
#include "loader/quant_match.h"

namespace sparkserve {
namespace {

using ::testing::HasSubstr;

const char* kNvfp4Group = R"({"targets": ["Linear"], "format": "nvfp4-pack-quantized",
  "weights": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group", "group_size": 16, "dynamic": false},
  "input_activations": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}})";

std::string ct(const std::string& groups, const std::string& extra = "", const std::string& format = "nvfp4-pack-quantized") {
  return R"({"quantization_config": {"quant_method": "compressed-tensors", "format": ")" + format +
         R"(", "quantization_status": "compressed", "config_groups": )" + groups + extra + "}}";
}

Expected<QuantConfig> parse(const std::string& config, const std::string& hf = "") {
  return parse_quant_config_text(config, hf);
}

TEST(QuantConfig, NoQuantizationConfigIsMethodNone) {
  auto c = parse(R"({"model_type": "qwen3_5_moe"})");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->method, QuantMethod::kNone);
}

TEST(QuantConfig, CompressedTensorsNvfp4W4A4) {
  auto c = parse(ct(std::string(R"({"group_0": )") + kNvfp4Group + "}", R"(, "ignore": ["lm_head", "re:.*mlp.gate$"], "kv_cache_scheme": null, "transform_config": {}, "sparsity_config": {})"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->method, QuantMethod::kCompressedTensors);
  ASSERT_EQ(c->groups.size(), 1u);
  EXPECT_EQ(c->groups[0].targets, std::vector<std::string>{"Linear"});
  EXPECT_TRUE(c->groups[0].scheme.quantized);
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kNvfp4);
  EXPECT_EQ(c->groups[0].scheme.activation, ActivationQuant::kNvfp4);
  EXPECT_EQ(c->groups[0].input_activations->dynamic, DynamicKind::kLocal);
  EXPECT_EQ(c->ignore.size(), 2u);
}

TEST(QuantConfig, Nvfp4WeightOnlyIsW4A16) {
  auto c = parse(ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}})"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kNvfp4);
  EXPECT_EQ(c->groups[0].scheme.activation, ActivationQuant::kNone);
}

TEST(QuantConfig, MixedPrecisionPerGroupFormats) {
  auto c = parse(ct(std::string(R"({"group_0": {"targets": ["Linear"], "format": "float-quantized",
      "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false},
      "input_activations": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token", "dynamic": true}},
    "group_1": )") + kNvfp4Group + "}", "", "mixed-precision"));
  ASSERT_TRUE(c.ok()) << c.message();
  ASSERT_EQ(c->groups.size(), 2u);
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kFp8Channel);
  EXPECT_EQ(c->groups[0].scheme.activation, ActivationQuant::kFp8TokenDynamic);
  EXPECT_EQ(c->groups[1].scheme.weight, WeightFormat::kNvfp4);
}

TEST(QuantConfig, Fp8StaticTensorAndNaiveQuantized) {
  auto c = parse(ct(R"({"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false}}})", "", "naive-quantized"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kFp8Tensor);
  EXPECT_EQ(c->groups[0].scheme.activation, ActivationQuant::kFp8TensorStatic);
}

TEST(QuantConfig, StrategyInferredFromGroupSize) {
  auto c = parse(ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "group_size": -1}}})", "", "float-quantized"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->groups[0].weights->strategy, QuantStrategy::kChannel);
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kFp8Channel);
}

TEST(QuantConfig, PresetGroups) {
  auto c = parse(ct(R"({"NVFP4": ["re:.*experts.*"], "FP8_DYNAMIC": ["Linear"]})", "", "mixed-precision"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->groups[0].scheme.weight, WeightFormat::kNvfp4);
  EXPECT_EQ(c->groups[0].scheme.activation, ActivationQuant::kNvfp4);
  EXPECT_EQ(c->groups[1].scheme.weight, WeightFormat::kFp8Channel);
  EXPECT_EQ(c->groups[1].scheme.activation, ActivationQuant::kFp8TokenDynamic);
  auto bad = parse(ct(R"({"W4A16": ["Linear"]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("not a known preset"));
}

TEST(QuantConfig, KvCacheScheme) {
  auto c = parse(ct(std::string(R"({"g": )") + kNvfp4Group + "}",
                    R"(, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false, "symmetric": true})"));
  ASSERT_TRUE(c.ok()) << c.message();
  ASSERT_TRUE(c->kv_cache.has_value());
  EXPECT_EQ(c->kv_cache->num_bits, 8);
}

struct Refusal {
  std::string config;
  std::string message;
};

TEST(QuantConfig, RefusesWhatCannotRun) {
  const std::string nv = std::string(R"({"g": )") + kNvfp4Group + "}";
  const Refusal cases[] = {
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}})", "", "pack-quantized"),
       "int4/int8 weights are not supported"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}})", "", "int-quantized"),
       "integer quantization is not supported"},
      {ct(nv, R"(, "transform_config": {"config_groups": {"u": {"type": "hadamard"}}})"), "transform_config is not empty"},
      {ct(nv, R"(, "sparsity_config": {"format": "sparse-24-bitmask"})"), "sparsity_config is not empty"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}})", "", "float-quantized"),
       "strategy block is not supported for FP8"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": false}}})", "", "float-quantized"),
       "asymmetric"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}}})", "", "mxfp4-pack-quantized"),
       "MX formats are not supported"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}}})"),
       "NVFP4 needs float4 tensor_group group_size 16"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "dynamic": "local"}}})", "", "float-quantized"),
       "only legal with strategy tensor_group"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": true}}})", "", "float-quantized"),
       "is not supported (supported: dynamic token, static tensor)"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "output_activations": {"num_bits": 8, "type": "float"}}})", "", "float-quantized"),
       "output quantization is not supported"},
      {ct(R"({"g": {"targets": [], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}})", "", "float-quantized"),
       "targets is empty"},
      {ct(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": "yes"}}})", "", "float-quantized"),
       "dynamic must be true, false or \"local\""},
      {R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})", "quant_method \"gptq\" is not supported"},
      {R"({"quantization_config": {"quant_method": "compressed-tensors"}})", "config_groups is missing"},
      {R"({"quantization_config": {"quant_method": "compressed-tensors", "quantization_status": "frozen", "config_groups": {}}})",
       "only checkpoints saved compressed"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.config);
    ASSERT_FALSE(r.ok()) << c.config;
    EXPECT_THAT(r.message(), HasSubstr(c.message)) << c.config;
  }
}

TEST(QuantConfig, ModelOptHfQuantConfig) {
  auto c = parse(R"({"model_type": "qwen3_5_moe"})",
                 R"({"producer": {"name": "modelopt", "version": "0.42.0"},
                     "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                                      "exclude_modules": ["lm_head", "*mlp.gate"]}})");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->method, QuantMethod::kModelOpt);
  EXPECT_EQ(c->producer, "modelopt 0.42.0");
  EXPECT_EQ(c->modelopt_scheme.weight, WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(c->modelopt_scheme.activation, ActivationQuant::kNvfp4);
  EXPECT_EQ(c->exclude_modules.size(), 2u);
}

TEST(QuantConfig, ModelOptInConfigJsonAndAlgorithms) {
  auto c = parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"], "kv_cache_quant_algo": "FP8"}})");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->modelopt_scheme.weight, WeightFormat::kFp8Tensor);
  EXPECT_EQ(c->modelopt_scheme.activation, ActivationQuant::kFp8TensorStatic);
  EXPECT_EQ(c->exclude_modules, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(c->kv_cache_quant_algo, "FP8");
  auto w4a16 = parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "group_size": 16}})");
  ASSERT_TRUE(w4a16.ok()) << w4a16.message();
  EXPECT_EQ(w4a16->modelopt_scheme.activation, ActivationQuant::kNone);
  auto mixed = parse("", R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION",
      "quantized_layers": {"model.layers.0.mlp.experts.0.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
                           "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}}}})");
  ASSERT_TRUE(mixed.ok()) << mixed.message();
  ASSERT_EQ(mixed->quantized_layers.size(), 2u);
  auto kv = parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": false}}})");
  ASSERT_TRUE(kv.ok()) << kv.message();
  EXPECT_EQ(kv->kv_cache_quant_algo, "FP8");
  auto bad_algo = parse("", R"({"quantization": {"quant_algo": "INT4_AWQ"}})");
  ASSERT_FALSE(bad_algo.ok());
  EXPECT_THAT(bad_algo.message(), HasSubstr("\"INT4_AWQ\" is not supported"));
  auto bad_group = parse("", R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})");
  ASSERT_FALSE(bad_group.ok());
  EXPECT_THAT(bad_group.message(), HasSubstr("NVFP4 needs 16"));
  auto conflict = parse(ct(std::string(R"({"g": )") + kNvfp4Group + "}"), R"({"quantization": {"quant_algo": "NVFP4"}})");
  ASSERT_FALSE(conflict.ok());
  EXPECT_THAT(conflict.message(), HasSubstr("disagree"));
}

TEST(QuantMatch, RegexIsAnchoredAtStartOnly) {
  auto m = TargetMatcher::compile("re:.*in_proj_qkv");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->matches_name("model.language_model.layers.0.linear_attn.in_proj_qkv"));
  EXPECT_TRUE(m->matches_name("model.layers.0.linear_attn.in_proj_qkvz")) << "re.match does not anchor the end";
  auto start = TargetMatcher::compile("re:mlp\\.gate$");
  ASSERT_TRUE(start.ok());
  EXPECT_FALSE(start->matches_name("model.layers.0.mlp.gate")) << "re.match anchors the start";
  EXPECT_TRUE(start->matches_name("mlp.gate"));
  EXPECT_FALSE(start->matches_name("mlp.gate_proj"));
  auto visual = TargetMatcher::compile("re:model.visual.*");
  EXPECT_TRUE(visual->matches_name("model.visual.blocks.0.attn.qkv"));
  EXPECT_FALSE(visual->matches_name("visual.blocks.0.attn.qkv"));
  auto bad = TargetMatcher::compile("re:(unclosed");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("invalid regex in \"re:(unclosed\""));
}

TEST(QuantMatch, ExactNamesAndClassNames) {
  auto m = TargetMatcher::compile("lm_head");
  EXPECT_TRUE(m->matches_name("lm_head"));
  EXPECT_FALSE(m->matches_name("lm_head.weight"));
  EXPECT_FALSE(m->matches_name("language_model.lm_head"));
  auto lin = TargetMatcher::compile("Linear");
  EXPECT_TRUE(lin->matches_class(ModuleClass::kLinear));
  EXPECT_TRUE(lin->matches_class(ModuleClass::kFusedExperts));
  EXPECT_FALSE(lin->matches_class(ModuleClass::kEmbedding));
  EXPECT_FALSE(lin->matches_class(ModuleClass::kOther));
  EXPECT_FALSE(lin->matches_name("model.layers.0.mlp.down_proj"));
  auto emb = TargetMatcher::compile("Embedding");
  EXPECT_TRUE(emb->matches_class(ModuleClass::kEmbedding));
  auto re = TargetMatcher::compile("re:Linear");
  EXPECT_FALSE(re->matches_class(ModuleClass::kLinear));
}

TEST(QuantMatch, PrefixAliases) {
  using V = std::vector<std::string>;
  EXPECT_EQ(module_name_aliases("model.language_model.layers.1.mlp.gate"),
            (V{"model.language_model.layers.1.mlp.gate", "model.layers.1.mlp.gate", "language_model.model.layers.1.mlp.gate"}));
  EXPECT_EQ(module_name_aliases("model.layers.1.mlp.gate"),
            (V{"model.layers.1.mlp.gate", "model.language_model.layers.1.mlp.gate", "language_model.model.layers.1.mlp.gate"}));
  EXPECT_EQ(module_name_aliases("lm_head"), (V{"lm_head", "language_model.lm_head"}));
  EXPECT_EQ(module_name_aliases("language_model.lm_head"), (V{"language_model.lm_head", "lm_head"}));
  EXPECT_EQ(module_name_aliases("model.visual.blocks.0.attn.qkv"), (V{"model.visual.blocks.0.attn.qkv", "visual.blocks.0.attn.qkv"}));
  EXPECT_EQ(module_name_aliases("mtp.fc"), (V{"mtp.fc"}));
}

TEST(QuantMatch, FnmatchLikePython) {
  EXPECT_TRUE(fnmatch_name("*mlp.gate", "model.language_model.layers.3.mlp.gate"));
  EXPECT_FALSE(fnmatch_name("*mlp.gate", "model.language_model.layers.3.mlp.gate_proj"));
  EXPECT_TRUE(fnmatch_name("model.layers.0.self_attn*", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(fnmatch_name("lm_head", "lm_head"));
  EXPECT_TRUE(fnmatch_name("*.experts.[0-3].*", "m.experts.2.up_proj"));
  EXPECT_FALSE(fnmatch_name("*.experts.[!0-3].*", "m.experts.2.up_proj"));
}

}  // namespace
}  // namespace sparkserve
