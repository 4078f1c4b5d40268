// Per-request sampling parameters (vLLM SamplingParams semantics) and the request-default
// resolution from generation_config.json: a field the request omits takes the model's default,
// then vLLM's built-in default.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace sparkserve {

// Below this temperature sampling is greedy; in (kGreedyTemperature, kMinTemperature) the
// temperature is raised to kMinTemperature (vLLM's _SAMPLING_EPS / _MAX_TEMP, which avoid
// inf/nan from dividing logits by a tiny number).
inline constexpr float kGreedyTemperature = 1e-5f;
inline constexpr float kMinTemperature = 1e-2f;
inline constexpr int kMaxTopLogprobs = 20;  // vLLM's default --max-logprobs

// What a request asked for; nullopt = not given (the default applies).
struct SamplingOptions {
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<double> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> seed;
  std::optional<int64_t> max_tokens;  // nullopt: up to the context length
  std::optional<int64_t> min_tokens;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::optional<int> logprobs;  // number of top logprobs; nullopt = no logprobs at all
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<std::vector<int32_t>> allowed_token_ids;
};

// generation_config.json fields that act as request defaults (each optional).
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_new_tokens;
  std::vector<int32_t> eos_token_ids;  // eos_token_id (int or list)
  // serve --seed: requests without a seed draw theirs from a sequence that starts here (the
  // same requests in the same order then sample the same), instead of from the OS.
  std::optional<uint64_t> server_seed;
};

// Parses the fields above from a generation_config.json object; wrong types are errors, other
// fields are ignored. do_sample=false makes greedy (temperature 0) the default, as in HF.
Expected<GenerationDefaults> parse_generation_defaults(const nlohmann::json& config);

// Fully resolved parameters that the sampler and the engine's stop checks read.
struct SamplingParams {
  float temperature = 1.0f;  // < kGreedyTemperature: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // [-2, 2], over generated tokens
  float repetition_penalty = 1.0f;  // > 0, over prompt + generated tokens
  uint64_t seed = 0;                // always set: random per request when the client sent none
  int64_t max_tokens = 16;          // >= 1
  int64_t min_tokens = 0;           // EOS and stop ids are masked while fewer were generated
  std::vector<int32_t> eos_token_ids;   // model EOS ids (stop unless ignore_eos)
  std::vector<int32_t> stop_token_ids;  // request stop ids (always stop)
  bool ignore_eos = false;
  int num_logprobs = -1;  // -1: none; k >= 0: sampled token's logprob plus the top k
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])
  std::optional<std::vector<int32_t>> allowed_token_ids;

  bool greedy() const { return temperature < kGreedyTemperature; }
  // Generation stops at `token` (EOS unless ignore_eos, or a request stop id).
  bool is_stop_token(int32_t token) const;
};

// Why a sequence stops after a token was appended (vLLM v1's check_stop order: nothing before
// min_tokens; then EOS unless ignore_eos; then request stop ids; then max_tokens or the context
// limit). stop_token is the request stop id that matched (the response's stop_reason); EOS
// stops leave it empty. Stop strings are the detokenizer's job.
struct TokenStop {
  const char* finish_reason;  // "stop" or "length"
  std::optional<int32_t> stop_token;
};
// num_generated counts `token`; sequence_length = prompt + generated tokens.
std::optional<TokenStop> check_token_stop(const SamplingParams& params, int32_t token,
                                          int64_t num_generated, int64_t sequence_length,
                                          int64_t max_model_len);

// Request options over model defaults over vLLM defaults. `max_tokens_limit` is the resolved
// completion budget (see check_context_length in server/openai_request.h). The seed is
// options.seed when given, else a fresh random one (so unseeded requests differ but each
// request's draws are still reproducible from its own seed).
SamplingParams resolve_sampling_params(const SamplingOptions& options,
                                       const GenerationDefaults& defaults,
                                       int64_t max_tokens_limit);

// Checks ranges (vLLM's limits) and token ids against the vocabulary; the message names the
// field and the value. `param` receives the offending field name.
Status validate_sampling_options(const SamplingOptions& options, int64_t vocab_size,
                                 std::string* param = nullptr);

}  // namespace sparkserve
