#include "runtime/sampling_params.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <type_traits>

namespace sparkserve {
namespace {

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Status field_error(std::string* param, const char* name, std::string message) {
  if (param) *param = name;
  return make_error(std::move(message));
}

// One generation_config.json number field; absent or null leaves `out` unset.
template <class T>
Status read_number(const nlohmann::json& config, const char* key, std::optional<T>& out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() || it->is_boolean())
    return make_error(std::string("generation_config.json: \"") + key + "\" must be a number, got " +
                      it->dump());
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer())
      return make_error(std::string("generation_config.json: \"") + key +
                        "\" must be an integer, got " + it->dump());
    out = it->get<T>();
  } else {
    out = it->get<T>();
  }
  return Status::Ok();
}

// The n-th output of splitmix64 started at `state`.
uint64_t splitmix64_nth(uint64_t state, uint64_t n) {
  uint64_t z = state + 0x9E3779B97F4A7C15ull * n;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Expected<GenerationDefaults> parse_generation_defaults(const nlohmann::json& config) {
  if (!config.is_object()) return make_error("generation_config.json: top level must be an object");
  GenerationDefaults d;
  SS_RETURN_IF_ERROR(read_number(config, "temperature", d.temperature));
  SS_RETURN_IF_ERROR(read_number(config, "top_p", d.top_p));
  SS_RETURN_IF_ERROR(read_number(config, "min_p", d.min_p));
  SS_RETURN_IF_ERROR(read_number(config, "repetition_penalty", d.repetition_penalty));
  SS_RETURN_IF_ERROR(read_number(config, "top_k", d.top_k));
  SS_RETURN_IF_ERROR(read_number(config, "max_new_tokens", d.max_new_tokens));
  if (auto it = config.find("do_sample"); it != config.end() && it->is_boolean() && !it->get<bool>())
    d.temperature = 0.0;  // HF: do_sample=false means greedy whatever temperature says
  if (auto it = config.find("eos_token_id"); it != config.end() && !it->is_null()) {
    auto read_id = [&](const nlohmann::json& v) -> Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        return make_error("generation_config.json: \"eos_token_id\" must be a token id or a list "
                          "of token ids, got " + it->dump());
      d.eos_token_ids.push_back(v.get<int32_t>());
      return Status::Ok();
    };
    if (it->is_array()) {
      for (const auto& v : *it) SS_RETURN_IF_ERROR(read_id(v));
    } else {
      SS_RETURN_IF_ERROR(read_id(*it));
    }
  }
  // The defaults pass the same checks as request values; a broken config is a load error.
  SamplingOptions as_options;
  as_options.temperature = d.temperature;
  as_options.top_p = d.top_p;
  as_options.min_p = d.min_p;
  as_options.repetition_penalty = d.repetition_penalty;
  as_options.top_k = d.top_k;
  std::string param;
  if (Status s = validate_sampling_options(as_options, INT64_MAX, &param); !s.ok())
    return make_error("generation_config.json: " + s.message());
  return d;
}

bool SamplingParams::is_stop_token(int32_t token) const {
  if (std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end())
    return true;
  return !ignore_eos &&
         std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

std::optional<TokenStop> check_token_stop(const SamplingParams& p, int32_t token,
                                          int64_t num_generated, int64_t sequence_length,
                                          int64_t max_model_len) {
  if (num_generated < p.min_tokens) return std::nullopt;
  if (!p.ignore_eos &&
      std::find(p.eos_token_ids.begin(), p.eos_token_ids.end(), token) != p.eos_token_ids.end())
    return TokenStop{"stop", std::nullopt};
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end())
    return TokenStop{"stop", token};
  if (num_generated >= p.max_tokens || sequence_length >= max_model_len)
    return TokenStop{"length", std::nullopt};
  return std::nullopt;
}

SamplingParams resolve_sampling_params(const SamplingOptions& o, const GenerationDefaults& d,
                                       int64_t max_tokens_limit) {
  SamplingParams p;
  p.temperature = static_cast<float>(o.temperature.value_or(d.temperature.value_or(1.0)));
  p.top_p = static_cast<float>(o.top_p.value_or(d.top_p.value_or(1.0)));
  int64_t top_k = o.top_k.value_or(d.top_k.value_or(0));
  p.top_k = top_k < 0 ? 0 : static_cast<int32_t>(std::min<int64_t>(top_k, INT32_MAX));
  p.min_p = static_cast<float>(o.min_p.value_or(d.min_p.value_or(0.0)));
  p.presence_penalty = static_cast<float>(o.presence_penalty.value_or(0.0));
  p.frequency_penalty = static_cast<float>(o.frequency_penalty.value_or(0.0));
  p.repetition_penalty =
      static_cast<float>(o.repetition_penalty.value_or(d.repetition_penalty.value_or(1.0)));
  if (p.temperature >= kGreedyTemperature && p.temperature < kMinTemperature)
    p.temperature = kMinTemperature;
  if (p.greedy()) {  // as vLLM: the truncations cannot change an argmax
    p.top_p = 1.0f;
    p.top_k = 0;
    p.min_p = 0.0f;
  }
  if (o.seed) {
    p.seed = static_cast<uint64_t>(*o.seed);
  } else if (d.server_seed) {
    static std::atomic<uint64_t> drawn{0};
    p.seed = splitmix64_nth(*d.server_seed, drawn.fetch_add(1) + 1);
  } else {
    // A fresh seed per request without asking the OS or the CPU's entropy source each time
    // (std::random_device: ~20 us per request on a Xeon, in the request's path): one random base
    // per process, then splitmix64's sequence from it (distinct seeds: it is a bijection).
    static const uint64_t base = [] {
      std::random_device rd;
      return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    static std::atomic<uint64_t> fresh{0};
    p.seed = splitmix64_nth(base, fresh.fetch_add(1) + 1);
  }
  std::optional<int64_t> asked = o.max_tokens ? o.max_tokens : d.max_new_tokens;
  p.max_tokens = std::max<int64_t>(1, asked ? std::min(*asked, max_tokens_limit) : max_tokens_limit);
  p.min_tokens = std::min(o.min_tokens.value_or(0), p.max_tokens);
  p.eos_token_ids = d.eos_token_ids;
  p.stop_token_ids = o.stop_token_ids;
  p.ignore_eos = o.ignore_eos;
  p.num_logprobs = o.logprobs ? *o.logprobs : -1;
  p.logit_bias = o.logit_bias;
  p.allowed_token_ids = o.allowed_token_ids;
  return p;
}

Status validate_sampling_options(const SamplingOptions& o, int64_t vocab_size, std::string* param) {
  if (o.temperature) {
    double t = *o.temperature;
    if (!std::isfinite(t) || t < 0.0 || t > 2.0)
      return field_error(param, "temperature", "temperature must be in [0, 2], got " + fmt(t) + ".");
  }
  if (o.top_p) {
    double v = *o.top_p;
    if (!(v > 0.0 && v <= 1.0))
      return field_error(param, "top_p", "top_p must be in (0, 1], got " + fmt(v) + ".");
  }
  if (o.top_k && *o.top_k < -1)
    return field_error(param, "top_k",
                       "top_k must be -1 or 0 (disabled) or at least 1, got " +
                           std::to_string(*o.top_k) + ".");
  if (o.min_p) {
    double v = *o.min_p;
    if (!(v >= 0.0 && v <= 1.0))
      return field_error(param, "min_p", "min_p must be in [0, 1], got " + fmt(v) + ".");
  }
  if (o.presence_penalty) {
    double v = *o.presence_penalty;
    if (!(v >= -2.0 && v <= 2.0))
      return field_error(param, "presence_penalty",
                         "presence_penalty must be in [-2, 2], got " + fmt(v) + ".");
  }
  if (o.frequency_penalty) {
    double v = *o.frequency_penalty;
    if (!(v >= -2.0 && v <= 2.0))
      return field_error(param, "frequency_penalty",
                         "frequency_penalty must be in [-2, 2], got " + fmt(v) + ".");
  }
  if (o.repetition_penalty) {
    double v = *o.repetition_penalty;
    if (!std::isfinite(v) || v <= 0.0)
      return field_error(param, "repetition_penalty",
                         "repetition_penalty must be a finite number greater than zero, got " +
                             fmt(v) + ".");
  }
  if (o.max_tokens && *o.max_tokens < 1)
    return field_error(param, "max_tokens",
                       "max_tokens must be at least 1, got " + std::to_string(*o.max_tokens) + ".");
  if (o.min_tokens) {
    if (*o.min_tokens < 0)
      return field_error(param, "min_tokens",
                         "min_tokens must be greater than or equal to 0, got " +
                             std::to_string(*o.min_tokens) + ".");
    if (o.max_tokens && *o.min_tokens > *o.max_tokens)
      return field_error(param, "min_tokens",
                         "min_tokens must be less than or equal to max_tokens=" +
                             std::to_string(*o.max_tokens) + ", got " +
                             std::to_string(*o.min_tokens) + ".");
  }
  if (o.logprobs && (*o.logprobs < 0 || *o.logprobs > kMaxTopLogprobs))
    return field_error(param, "top_logprobs",
                       "the number of top logprobs must be in [0, " +
                           std::to_string(kMaxTopLogprobs) + "], got " +
                           std::to_string(*o.logprobs) + ".");
  auto check_id = [&](int64_t id, const char* field) -> Status {
    if (id < 0 || id >= vocab_size)
      return field_error(param, field,
                         std::string(field) + " contains token id " + std::to_string(id) +
                             ", outside the vocabulary [0, " + std::to_string(vocab_size) + ").");
    return Status::Ok();
  };
  for (int32_t id : o.stop_token_ids) SS_RETURN_IF_ERROR(check_id(id, "stop_token_ids"));
  for (const auto& [id, bias] : o.logit_bias) {
    SS_RETURN_IF_ERROR(check_id(id, "logit_bias"));
    if (!(bias >= -100.0f && bias <= 100.0f))
      return field_error(param, "logit_bias",
                         "logit_bias value for token " + std::to_string(id) +
                             " must be in [-100, 100], got " + fmt(bias) + ".");
  }
  if (o.allowed_token_ids) {
    if (o.allowed_token_ids->empty())
      return field_error(param, "allowed_token_ids", "allowed_token_ids must not be empty.");
    for (int32_t id : *o.allowed_token_ids) SS_RETURN_IF_ERROR(check_id(id, "allowed_token_ids"));
  }
  return Status::Ok();
}

}  // namespace sparkserve
