// Default resolution (request > generation_config.json > vLLM defaults) and range checks.
#include <gtest/gtest.h>

#include <set>

#include "runtime/sampling_params.h"

namespace sparkserve {
namespace {

GenerationDefaults qwen_defaults() {
  // The shape of Qwen3.5's shipped generation_config.json (serving-api.md 1.3/1.4).
  auto cfg = nlohmann::json::parse(R"({"bos_token_id": 248044, "do_sample": true,
      "eos_token_id": [248046, 248044], "pad_token_id": 248044, "temperature": 0.6,
      "top_k": 20, "top_p": 0.95, "transformers_version": "4.57.0"})");
  auto d = parse_generation_defaults(cfg);
  EXPECT_TRUE(d.ok()) << d.message();
  return *d;
}

TEST(GenerationDefaults, ParsesQwenConfig) {
  GenerationDefaults d = qwen_defaults();
  EXPECT_DOUBLE_EQ(*d.temperature, 0.6);
  EXPECT_EQ(*d.top_k, 20);
  EXPECT_DOUBLE_EQ(*d.top_p, 0.95);
  EXPECT_FALSE(d.min_p.has_value());
  EXPECT_FALSE(d.repetition_penalty.has_value());
  EXPECT_EQ(d.eos_token_ids, (std::vector<int32_t>{248046, 248044}));
}

TEST(GenerationDefaults, RejectsWrongTypesAndRanges) {
  auto bad = [](const char* text) {
    auto d = parse_generation_defaults(nlohmann::json::parse(text));
    EXPECT_FALSE(d.ok()) << text;
    return d.ok() ? std::string() : d.message();
  };
  EXPECT_NE(bad(R"({"temperature": "hot"})").find("temperature"), std::string::npos);
  EXPECT_NE(bad(R"({"top_k": 2.5})").find("top_k"), std::string::npos);
  EXPECT_NE(bad(R"({"eos_token_id": ["x"]})").find("eos_token_id"), std::string::npos);
  EXPECT_NE(bad(R"({"top_p": 0})").find("top_p"), std::string::npos);
  EXPECT_NE(bad("[1]").find("object"), std::string::npos);
}

TEST(GenerationDefaults, DoSampleFalseMeansGreedy) {
  auto d = parse_generation_defaults(nlohmann::json::parse(R"({"do_sample": false, "temperature": 0.7})"));
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(resolve_sampling_params({}, *d, 100).greedy());
}

TEST(ResolveSampling, RequestOverModelOverVllmDefaults) {
  GenerationDefaults d = qwen_defaults();
  SamplingParams p = resolve_sampling_params({}, d, 1000);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.max_tokens, 1000);  // omitted: the whole remaining context
  EXPECT_EQ(p.eos_token_ids, (std::vector<int32_t>{248046, 248044}));

  SamplingOptions o;
  o.temperature = 1.2;
  o.top_k = -1;
  o.max_tokens = 50;
  o.seed = 7;
  o.presence_penalty = 1.5;
  p = resolve_sampling_params(o, d, 1000);
  EXPECT_FLOAT_EQ(p.temperature, 1.2f);
  EXPECT_EQ(p.top_k, 0);  // -1 means disabled
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.max_tokens, 50);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_FLOAT_EQ(p.presence_penalty, 1.5f);

  GenerationDefaults none;
  p = resolve_sampling_params({}, none, 1000);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
}

TEST(ResolveSampling, GreedyAndTinyTemperature) {
  SamplingOptions o;
  o.temperature = 0.0;
  SamplingParams p = resolve_sampling_params(o, qwen_defaults(), 100);
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.top_k, 0);  // cleared as vLLM does
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  o.temperature = 0.001;
  p = resolve_sampling_params(o, {}, 100);
  EXPECT_FALSE(p.greedy());
  EXPECT_FLOAT_EQ(p.temperature, kMinTemperature);
}

TEST(ResolveSampling, UnseededRequestsGetDistinctSeeds) {
  // Consecutive outputs of splitmix64 from one random base per process: distinct by construction.
  std::set<uint64_t> seeds;
  for (int i = 0; i < 1000; ++i) seeds.insert(resolve_sampling_params({}, {}, 10).seed);
  EXPECT_EQ(seeds.size(), 1000u);
}

TEST(ResolveSampling, MaxTokensCappedByContextAndModelDefault) {
  SamplingOptions o;
  o.max_tokens = 5000;
  EXPECT_EQ(resolve_sampling_params(o, {}, 300).max_tokens, 300);
  GenerationDefaults d;
  d.max_new_tokens = 64;
  EXPECT_EQ(resolve_sampling_params({}, d, 300).max_tokens, 64);
}

TEST(StopTokens, EosUnlessIgnoredStopIdsAlways) {
  SamplingParams p;
  p.eos_token_ids = {10, 11};
  p.stop_token_ids = {5};
  EXPECT_TRUE(p.is_stop_token(10));
  EXPECT_TRUE(p.is_stop_token(5));
  EXPECT_FALSE(p.is_stop_token(6));
  p.ignore_eos = true;
  EXPECT_FALSE(p.is_stop_token(11));
  EXPECT_TRUE(p.is_stop_token(5));
}

struct BadCase {
  const char* field;
  SamplingOptions options;
};

TEST(ValidateSampling, EachOutOfRangeValueNamesItsField) {
  std::vector<BadCase> cases;
  auto add = [&](const char* field, auto set) {
    SamplingOptions o;
    set(o);
    cases.push_back({field, o});
  };
  add("temperature", [](SamplingOptions& o) { o.temperature = -0.1; });
  add("temperature", [](SamplingOptions& o) { o.temperature = 2.5; });
  add("temperature", [](SamplingOptions& o) { o.temperature = NAN; });
  add("top_p", [](SamplingOptions& o) { o.top_p = 0.0; });
  add("top_p", [](SamplingOptions& o) { o.top_p = 1.01; });
  add("top_k", [](SamplingOptions& o) { o.top_k = -2; });
  add("min_p", [](SamplingOptions& o) { o.min_p = 1.5; });
  add("presence_penalty", [](SamplingOptions& o) { o.presence_penalty = 2.5; });
  add("frequency_penalty", [](SamplingOptions& o) { o.frequency_penalty = -3; });
  add("repetition_penalty", [](SamplingOptions& o) { o.repetition_penalty = 0; });
  add("repetition_penalty", [](SamplingOptions& o) { o.repetition_penalty = INFINITY; });
  add("max_tokens", [](SamplingOptions& o) { o.max_tokens = 0; });
  add("min_tokens", [](SamplingOptions& o) { o.min_tokens = -1; });
  add("min_tokens", [](SamplingOptions& o) { o.min_tokens = 10; o.max_tokens = 5; });
  add("top_logprobs", [](SamplingOptions& o) { o.logprobs = 21; });
  add("stop_token_ids", [](SamplingOptions& o) { o.stop_token_ids = {1000}; });
  add("logit_bias", [](SamplingOptions& o) { o.logit_bias = {{-1, 1.0f}}; });
  add("logit_bias", [](SamplingOptions& o) { o.logit_bias = {{3, 101.0f}}; });
  add("allowed_token_ids", [](SamplingOptions& o) { o.allowed_token_ids = std::vector<int32_t>{}; });
  add("allowed_token_ids", [](SamplingOptions& o) { o.allowed_token_ids = std::vector<int32_t>{1000}; });
  for (const auto& c : cases) {
    std::string param;
    Status s = validate_sampling_options(c.options, 1000, &param);
    EXPECT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(param, c.field);
    EXPECT_NE(s.message().find(c.field == std::string("top_logprobs") ? "logprobs" : c.field),
              std::string::npos)
        << s.message();
  }
}

TEST(ValidateSampling, BoundaryValuesAreAccepted) {
  SamplingOptions o;
  o.temperature = 2.0;
  o.top_p = 1.0;
  o.top_k = -1;
  o.min_p = 0.0;
  o.presence_penalty = -2.0;
  o.frequency_penalty = 2.0;
  o.repetition_penalty = 0.01;
  o.max_tokens = 1;
  o.min_tokens = 1;
  o.logprobs = 20;
  o.logit_bias = {{0, -100.0f}, {999, 100.0f}};
  o.stop_token_ids = {999};
  EXPECT_TRUE(validate_sampling_options(o, 1000).ok());
  EXPECT_TRUE(validate_sampling_options({}, 1000).ok());
}

}  // namespace
}  // namespace sparkserve

namespace sparkserve {
namespace {

TEST(TokenStopCheck, OrderOfReasons) {
  SamplingParams p;
  p.eos_token_ids = {100, 101};
  p.stop_token_ids = {7};
  p.max_tokens = 5;
  p.min_tokens = 2;
  // Before min_tokens nothing stops (the sampler masked EOS/stop ids anyway).
  EXPECT_FALSE(check_token_stop(p, 100, 1, 10, 4096));
  auto eos = check_token_stop(p, 101, 2, 10, 4096);
  ASSERT_TRUE(eos);
  EXPECT_STREQ(eos->finish_reason, "stop");
  EXPECT_FALSE(eos->stop_token);
  auto stop = check_token_stop(p, 7, 3, 10, 4096);
  ASSERT_TRUE(stop);
  EXPECT_STREQ(stop->finish_reason, "stop");
  EXPECT_EQ(*stop->stop_token, 7);
  EXPECT_FALSE(check_token_stop(p, 8, 4, 10, 4096));
  auto len = check_token_stop(p, 8, 5, 10, 4096);
  ASSERT_TRUE(len);
  EXPECT_STREQ(len->finish_reason, "length");
  // EOS wins over length on the last allowed token, as in vLLM.
  EXPECT_STREQ(check_token_stop(p, 100, 5, 10, 4096)->finish_reason, "stop");
  // The context limit ends generation as "length" too.
  EXPECT_STREQ(check_token_stop(p, 8, 3, 4096, 4096)->finish_reason, "length");
  p.ignore_eos = true;
  EXPECT_FALSE(check_token_stop(p, 100, 3, 10, 4096));
  EXPECT_TRUE(check_token_stop(p, 7, 3, 10, 4096));  // request stop ids still stop
}

}  // namespace
}  // namespace sparkserve
