#include "loader/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "temp_dir.h"

namespace sparkserve {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr auto kLin = LayerType::kLinearAttention;
constexpr auto kFull = LayerType::kFullAttention;

// The text part of Qwen3.5-35B-A3B's config.json (shared/reference/model-qwen35.md §1.3), with
// layer_types written out as the real file has them.
json real_35b_text_config() {
  json layer_types = json::array();
  for (int i = 0; i < 40; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  json text = json::parse(R"({"attention_bias":false,"attention_dropout":0.0,"attn_output_gate":true,"dtype":"bfloat16",
  "eos_token_id":248044,"full_attention_interval":4,"head_dim":256,"hidden_act":"silu","hidden_size":2048,
  "initializer_range":0.02,"linear_conv_kernel_dim":4,"linear_key_head_dim":128,"linear_num_key_heads":16,
  "linear_num_value_heads":32,"linear_value_head_dim":128,"max_position_embeddings":262144,"mlp_only_layers":[],
  "model_type":"qwen3_5_moe_text","moe_intermediate_size":512,"mtp_num_hidden_layers":1,
  "mtp_use_dedicated_embeddings":false,"num_attention_heads":16,"num_experts":256,"num_experts_per_tok":8,
  "num_hidden_layers":40,"num_key_value_heads":2,"rms_norm_eps":1e-06,"router_aux_loss_coef":0.001,
  "shared_expert_intermediate_size":512,"use_cache":true,"vocab_size":248320,"mamba_ssm_dtype":"float32",
  "rope_parameters":{"mrope_interleaved":true,"mrope_section":[11,11,10],"rope_type":"default",
                     "rope_theta":10000000,"partial_rotary_factor":0.25}})");
  text["layer_types"] = layer_types;
  return text;
}

json real_35b_config() {
  return {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"image_token_id", 248056},
          {"model_type", "qwen3_5_moe"},
          {"text_config", real_35b_text_config()},
          {"tie_word_embeddings", false},
          {"transformers_version", "4.57.0.dev0"},
          {"video_token_id", 248057},
          {"vision_config", {{"depth", 27}, {"hidden_size", 1152}, {"model_type", "qwen3_5_moe"}}},
          {"vision_end_token_id", 248054},
          {"vision_start_token_id", 248053}};
}

// A small flat dense config (qwen3_5_text, *ForCausalLM layout) with legacy-free keys.
json flat_dense_config() {
  return json::parse(R"({"architectures":["Qwen3_5ForCausalLM"],"model_type":"qwen3_5_text","hidden_size":64,
    "num_hidden_layers":6,"vocab_size":1000,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":32,
    "linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":24,"linear_value_head_dim":16,
    "linear_conv_kernel_dim":4,"intermediate_size":88,"full_attention_interval":3,
    "rope_parameters":{"rope_type":"default","rope_theta":1000000,"partial_rotary_factor":0.5}})");
}

ModelConfig parse_ok(const json& j) {
  auto cfg = parse_model_config(j.dump(), "config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.message();
  return cfg.ok() ? *cfg : ModelConfig{};
}

std::string parse_error(const json& j) {
  auto cfg = parse_model_config(j.dump(), "config.json");
  EXPECT_FALSE(cfg.ok()) << j.dump();
  return cfg.ok() ? std::string() : cfg.message();
}

// ---- the real config and the committed transformers fixtures ----

TEST(HfConfig, Real35BConfig) {
  ModelConfig c = parse_ok(real_35b_config());
  EXPECT_EQ(c.model_type, "qwen3_5_moe");
  EXPECT_EQ(c.architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_TRUE(c.is_moe);
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_EQ(c.layer_types.size(), 40u);
  EXPECT_EQ(c.layer_types[2], kLin);
  EXPECT_EQ(c.layer_types[3], kFull);
  EXPECT_EQ(c.layer_types[39], kFull);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.partial_rotary_factor, 0.25f);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_THAT(c.mrope_section, ElementsAre(11, 11, 10));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.gdn_key_dim(), 2048);
  EXPECT_EQ(c.gdn_value_dim(), 4096);
  EXPECT_EQ(c.gdn_conv_dim(), 8192);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.intermediate_size, 0);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(248044));
  EXPECT_FALSE(c.bos_token_id.has_value());
}

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

// Values from tests/fixtures/README.md's shape table (written by transformers save_pretrained).
TEST(HfConfig, MoeFixturesParse) {
  for (const char* name : {"qwen35-moe-tiny", "qwen35-moe-tiny-per-expert", "qwen35-moe-tiny-causallm"}) {
    SCOPED_TRACE(name);
    auto cfg = load_model_config(fixture(name));
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    const ModelConfig& c = *cfg;
    const bool flat = std::string(name).find("causallm") != std::string::npos;
    EXPECT_EQ(c.model_type, "qwen3_5_moe");
    EXPECT_EQ(c.architecture, flat ? "Qwen3_5MoeForCausalLM" : "Qwen3_5MoeForConditionalGeneration");
    EXPECT_EQ(c.nested_text_config, !flat);
    EXPECT_TRUE(c.is_moe);
    EXPECT_EQ(c.vocab_size, 1000);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_THAT(c.layer_types, ElementsAre(kLin, kFull, kLin, kLin, kFull));
    EXPECT_EQ(c.num_attention_heads, 4);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.rotary_dim(), 8);
    EXPECT_THAT(c.mrope_section, ElementsAre(2, 1, 1));
    EXPECT_EQ(c.rope_theta, 1e7);
    EXPECT_TRUE(c.mrope_interleaved);
    EXPECT_EQ(c.linear_num_key_heads, 2);
    EXPECT_EQ(c.linear_key_head_dim, 16);
    EXPECT_EQ(c.linear_num_value_heads, 6);
    EXPECT_EQ(c.linear_value_head_dim, 24);
    EXPECT_EQ(c.gdn_conv_dim(), 208);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.num_experts_per_tok, 3);
    EXPECT_EQ(c.moe_intermediate_size, 40);
    EXPECT_EQ(c.shared_expert_intermediate_size, 56);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  }
}

TEST(HfConfig, DenseFixturesParse) {
  for (const char* name : {"qwen35-dense-tiny", "qwen35-dense-tiny-causallm"}) {
    SCOPED_TRACE(name);
    auto cfg = load_model_config(fixture(name));
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    const ModelConfig& c = *cfg;
    const bool flat = std::string(name).find("causallm") != std::string::npos;
    EXPECT_EQ(c.model_type, "qwen3_5");
    EXPECT_EQ(c.architecture, flat ? "Qwen3_5ForCausalLM" : "Qwen3_5ForConditionalGeneration");
    EXPECT_EQ(c.nested_text_config, !flat);
    EXPECT_FALSE(c.is_moe);
    EXPECT_THAT(c.layer_types, ElementsAre(kLin, kFull, kLin, kLin, kFull, kLin));
    EXPECT_EQ(c.num_key_value_heads, 1);
    EXPECT_EQ(c.rotary_dim(), 16);
    EXPECT_THAT(c.mrope_section, ElementsAre(3, 3, 2));
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.linear_key_head_dim, 24);
    EXPECT_EQ(c.linear_num_value_heads, 4);
    EXPECT_EQ(c.linear_value_head_dim, 16);
    EXPECT_EQ(c.gdn_conv_dim(), 160);
    EXPECT_EQ(c.intermediate_size, 88);
    EXPECT_EQ(c.num_experts, 0);
  }
}

// ---- layout variants ----

TEST(HfConfig, FlatConfigAcceptsTextAndOuterModelType) {
  json j = flat_dense_config();
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.model_type, "qwen3_5");
  EXPECT_FALSE(c.nested_text_config);
  j["model_type"] = "qwen3_5";
  EXPECT_EQ(parse_ok(j).model_type, "qwen3_5");

  json moe = real_35b_text_config();
  moe["architectures"] = {"Qwen3_5MoeForCausalLM"};
  EXPECT_EQ(parse_ok(moe).model_type, "qwen3_5_moe");
  moe["model_type"] = "qwen3_5_moe";
  ModelConfig m = parse_ok(moe);
  EXPECT_TRUE(m.is_moe);
  EXPECT_EQ(m.num_experts, 256);
}

TEST(HfConfig, DefaultsForOptionalKeys) {
  json j = flat_dense_config();
  j.erase("head_dim");
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.head_dim, 16);  // hidden_size / num_attention_heads
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.mrope_section.empty());
  EXPECT_FALSE(c.mrope_interleaved);
  EXPECT_TRUE(c.eos_token_ids.empty());
  // partial_rotary_factor defaults to 0.25 as in transformers.
  j["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(parse_ok(j).partial_rotary_factor, 0.25f);
  // null is "not set", as transformers writes it.
  j["bos_token_id"] = nullptr;
  j["tie_word_embeddings"] = nullptr;
  EXPECT_FALSE(parse_ok(j).bos_token_id.has_value());
  j["bos_token_id"] = 7;
  j["attn_output_gate"] = false;
  j["tie_word_embeddings"] = true;
  ModelConfig d = parse_ok(j);
  EXPECT_EQ(d.bos_token_id, 7);
  EXPECT_FALSE(d.attn_output_gate);
  EXPECT_TRUE(d.tie_word_embeddings);
}

TEST(HfConfig, LayerTypesFromIntervalListOrDefault) {
  json j = flat_dense_config();  // interval 3, 6 layers
  EXPECT_THAT(parse_ok(j).layer_types, ElementsAre(kLin, kLin, kFull, kLin, kLin, kFull));
  j["layer_types"] = {"linear_attention", "linear_attention", "full_attention",
                      "linear_attention", "linear_attention", "full_attention"};
  EXPECT_THAT(parse_ok(j).layer_types, ElementsAre(kLin, kLin, kFull, kLin, kLin, kFull));
  j.erase("full_attention_interval");
  j["layer_types"][0] = "full_attention";
  EXPECT_THAT(parse_ok(j).layer_types, ElementsAre(kFull, kLin, kFull, kLin, kLin, kFull));
  j.erase("layer_types");  // neither: transformers' default interval of 4
  EXPECT_THAT(parse_ok(j).layer_types, ElementsAre(kLin, kLin, kLin, kFull, kLin, kLin));
}

TEST(HfConfig, LayerTypesErrors) {
  json j = flat_dense_config();
  j["layer_types"] = {"linear_attention", "full_attention", "linear_attention",
                      "linear_attention", "linear_attention", "full_attention"};
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("config.json: layer_types[1]"), HasSubstr("disagrees"),
                                    HasSubstr("full_attention_interval (3)")));
  j.erase("full_attention_interval");
  j["layer_types"].erase(5);
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("layer_types has 5 entries"), HasSubstr("num_hidden_layers is 6")));
  j["layer_types"].push_back("sliding_attention");
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("layer_types[5]"), HasSubstr("\"sliding_attention\"")));
  j["layer_types"] = "full_attention";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("layer_types"), HasSubstr("list")));
  j.erase("layer_types");
  j["full_attention_interval"] = 0;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("full_attention_interval"), HasSubstr("positive")));

  json nested = real_35b_config();
  nested["text_config"]["layer_types"][3] = "linear_attention";
  EXPECT_THAT(parse_error(nested), AllOf(HasSubstr("text_config.layer_types[3]"), HasSubstr("disagrees")));
}

TEST(HfConfig, LegacyRopeSpellings) {
  json j = flat_dense_config();
  j.erase("rope_parameters");
  j["rope_theta"] = 5e5;
  j["partial_rotary_factor"] = 0.25;
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}, {"mrope_interleaved", true}};
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_THAT(c.mrope_section, ElementsAre(2, 1, 1));
  EXPECT_TRUE(c.mrope_interleaved);

  // "type" instead of "rope_type" inside rope_parameters (MLX re-exports).
  json k = flat_dense_config();
  k["rope_parameters"].erase("rope_type");
  k["rope_parameters"]["type"] = "default";
  k["rope_parameters"]["mrope_section"] = {3, 3, 2};
  EXPECT_THAT(parse_ok(k).mrope_section, ElementsAre(3, 3, 2));

  // The same value in two places is fine (transformers 5.17 writes partial_rotary_factor twice).
  k["partial_rotary_factor"] = 0.5;
  k["rope_theta"] = 1000000.0;
  EXPECT_EQ(parse_ok(k).rotary_dim(), 16);
}

TEST(HfConfig, RopeErrors) {
  json j = flat_dense_config();
  j["rope_theta"] = 10000;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_parameters.rope_theta (1000000)"),
                                    HasSubstr("rope_theta (10000)"), HasSubstr("disagree")));
  j = flat_dense_config();
  j["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_parameters.rope_type"), HasSubstr("\"yarn\""),
                                    HasSubstr("not supported")));
  j = flat_dense_config();
  j["rope_parameters"].erase("rope_theta");
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_theta"), HasSubstr("missing")));
  j["rope_parameters"]["rope_theta"] = -1;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_parameters.rope_theta"), HasSubstr("positive")));
  j = flat_dense_config();
  j["rope_parameters"]["partial_rotary_factor"] = 1.5;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("partial_rotary_factor"), HasSubstr("(0, 1]")));
  j["rope_parameters"]["partial_rotary_factor"] = 0.0;
  EXPECT_THAT(parse_error(j), HasSubstr("partial_rotary_factor"));
  j["rope_parameters"]["partial_rotary_factor"] = 0.125;
  j["head_dim"] = 20;  // int(20 * 0.125) = 2 is fine; 0.15 gives 3 (odd)
  EXPECT_EQ(parse_ok(j).rotary_dim(), 2);
  j["rope_parameters"]["partial_rotary_factor"] = 0.15;
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rotary dim 3"), HasSubstr("even")));
  j = flat_dense_config();
  j["rope_parameters"]["mrope_section"] = {3, 3, 3};
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_parameters.mrope_section sums to 9"),
                                    HasSubstr("rotary_dim/2 = 8")));
  j["rope_parameters"]["mrope_section"] = {3, -3, 8};
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("mrope_section[1]"), HasSubstr("non-negative")));
  j["rope_parameters"]["mrope_section"] = 8;
  EXPECT_THAT(parse_error(j), HasSubstr("mrope_section"));
  j["rope_parameters"]["mrope_section"] = {4, 4};
  j["rope_parameters"]["mrope_interleaved"] = "yes";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("mrope_interleaved"), HasSubstr("true or false")));
  j = flat_dense_config();
  j["rope_parameters"] = "default";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("rope_parameters"), HasSubstr("object")));
}

TEST(HfConfig, TokenIds) {
  json j = flat_dense_config();
  j["eos_token_id"] = {5, 9};
  EXPECT_THAT(parse_ok(j).eos_token_ids, ElementsAre(5, 9));
  j["eos_token_id"] = 4;
  EXPECT_THAT(parse_ok(j).eos_token_ids, ElementsAre(4));
  j["eos_token_id"] = "</s>";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("eos_token_id"), HasSubstr("token id")));
  j["eos_token_id"] = "a\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9";
  // Long values are shortened in messages without splitting a UTF-8 character.
  std::string msg = parse_error(j);
  EXPECT_THAT(msg, HasSubstr("...\""));
  EXPECT_NO_THROW((void)json(msg).dump());
  j["eos_token_id"] = {1, -2};
  EXPECT_THAT(parse_error(j), HasSubstr("eos_token_id[1]"));

  // Nested: text_config wins; the top level is the fallback.
  json n = real_35b_config();
  n["eos_token_id"] = 7;
  EXPECT_THAT(parse_ok(n).eos_token_ids, ElementsAre(248044));
  n["text_config"]["eos_token_id"] = nullptr;
  EXPECT_THAT(parse_ok(n).eos_token_ids, ElementsAre(7));
}

// ---- validation errors name the key ----

TEST(HfConfig, NotAConfig) {
  EXPECT_THAT(parse_model_config("{\"model_type\": ", "config.json").message(),
              AllOf(HasSubstr("config.json"), HasSubstr("JSON")));
  EXPECT_THAT(parse_model_config("[]", "config.json").message(), HasSubstr("object"));
  EXPECT_THAT(parse_model_config("", "config.json").message(), HasSubstr("JSON"));
  testing::TempDir dir;
  auto missing = load_model_config(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), AllOf(HasSubstr((dir / "config.json").string()), HasSubstr("not found")));
  testing::write_text(dir / "config.json", flat_dense_config().dump());
  EXPECT_TRUE(load_model_config(dir.path()).ok());
}

TEST(HfConfig, ModelTypeErrors) {
  json j = flat_dense_config();
  j["model_type"] = "llama";
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("model_type \"llama\" is not supported"), HasSubstr("qwen3_5_moe"),
                                    HasSubstr("qwen3_5_text")));
  j.erase("model_type");
  EXPECT_THAT(parse_error(j), AllOf(HasSubstr("model_type is missing"), HasSubstr("qwen3_5")));
  json n = real_35b_config();
  n["text_config"]["model_type"] = "qwen3_5_text";
  EXPECT_THAT(parse_error(n), AllOf(HasSubstr("text_config.model_type"), HasSubstr("does not match")));
  n = real_35b_config();
  n["text_config"] = {1, 2};
  EXPECT_THAT(parse_error(n), AllOf(HasSubstr("text_config"), HasSubstr("object")));
  n = real_35b_config();
  n["architectures"] = "Qwen3_5MoeForConditionalGeneration";
  EXPECT_THAT(parse_error(n), HasSubstr("architectures"));
}

TEST(HfConfig, MissingMistypedAndOutOfRangeSizes) {
  json n = real_35b_config();
  n["text_config"].erase("hidden_size");
  EXPECT_THAT(parse_error(n), HasSubstr("config.json: text_config.hidden_size is missing"));
  n = real_35b_config();
  n["text_config"]["hidden_size"] = "2048";
  EXPECT_THAT(parse_error(n), AllOf(HasSubstr("text_config.hidden_size must be a positive integer"),
                                    HasSubstr("\"2048\"")));
  n["text_config"]["hidden_size"] = 2048.0;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.hidden_size must be a positive integer, got 2048.0"));
  n["text_config"]["hidden_size"] = 0;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.hidden_size must be a positive integer, got 0"));
  n["text_config"]["hidden_size"] = -64;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.hidden_size must be a positive integer"));
  n["text_config"]["hidden_size"] = 99999999999LL;
  EXPECT_THAT(parse_error(n), AllOf(HasSubstr("text_config.hidden_size"), HasSubstr("at most")));
  n["text_config"]["hidden_size"] = true;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.hidden_size must be a positive integer, got true"));

  for (const char* key : {"num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
                          "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                          "moe_intermediate_size", "shared_expert_intermediate_size"}) {
    n = real_35b_config();
    n["text_config"].erase(key);
    EXPECT_THAT(parse_error(n), HasSubstr(std::string("text_config.") + key + " is missing"));
  }
  json d = flat_dense_config();
  d.erase("intermediate_size");
  EXPECT_THAT(parse_error(d), HasSubstr("config.json: intermediate_size is missing"));
  d = flat_dense_config();
  d["rms_norm_eps"] = 0;
  EXPECT_THAT(parse_error(d), HasSubstr("rms_norm_eps"));
  d = flat_dense_config();
  d["mtp_num_hidden_layers"] = -1;
  EXPECT_THAT(parse_error(d), HasSubstr("mtp_num_hidden_layers must be an integer >= 0"));
  d = flat_dense_config();
  d["attn_output_gate"] = 1;
  EXPECT_THAT(parse_error(d), AllOf(HasSubstr("attn_output_gate"), HasSubstr("true or false")));
  d = flat_dense_config();
  d["linear_num_value_heads"] = 1 << 20;
  d["linear_value_head_dim"] = 1 << 16;
  EXPECT_THAT(parse_error(d), HasSubstr("implausibly large"));
}

TEST(HfConfig, DivisibilityAndRangeRules) {
  json n = real_35b_config();
  n["text_config"]["linear_num_value_heads"] = 6;
  n["text_config"]["linear_num_key_heads"] = 4;
  EXPECT_THAT(parse_error(n), HasSubstr("config.json: text_config.linear_num_value_heads (6) must be a multiple of "
                                        "linear_num_key_heads (4)"));
  n = real_35b_config();
  n["text_config"]["num_key_value_heads"] = 3;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.num_attention_heads (16) must be a multiple of "
                                        "num_key_value_heads (3)"));
  n = real_35b_config();
  n["text_config"]["num_experts_per_tok"] = 257;
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.num_experts_per_tok (257) must be at most num_experts (256)"));
  json d = flat_dense_config();
  d.erase("head_dim");
  d["num_attention_heads"] = 3;
  d["num_key_value_heads"] = 1;
  EXPECT_THAT(parse_error(d), AllOf(HasSubstr("head_dim is missing"), HasSubstr("not a multiple")));
}

TEST(HfConfig, RefusesFeaturesThisEngineDoesNotImplement) {
  json d = flat_dense_config();
  d["hidden_act"] = "gelu";
  EXPECT_THAT(parse_error(d), AllOf(HasSubstr("hidden_act"), HasSubstr("gelu"), HasSubstr("silu")));
  d = flat_dense_config();
  d["attention_bias"] = true;
  EXPECT_THAT(parse_error(d), HasSubstr("attention_bias"));
  json n = real_35b_config();
  n["text_config"]["mlp_only_layers"] = {0};
  EXPECT_THAT(parse_error(n), HasSubstr("text_config.mlp_only_layers"));
}

TEST(HfConfig, TieWordEmbeddingsPlacement) {
  json n = real_35b_config();
  n["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_ok(n).tie_word_embeddings);
  n["text_config"]["tie_word_embeddings"] = false;
  EXPECT_THAT(parse_error(n), AllOf(HasSubstr("tie_word_embeddings"), HasSubstr("disagree")));
  n["text_config"]["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_ok(n).tie_word_embeddings);
}

}  // namespace
}  // namespace sparkserve
