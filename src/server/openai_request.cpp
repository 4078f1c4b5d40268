#include "server/openai_request.h"

#include <algorithm>

#include "server/chat_messages.h"

namespace sparkserve {
namespace {

#define SS_API_CHECK(reader) \
  do { if (!(reader).ok()) return *(reader).error(); } while (0)

ApiError type_error(const std::string& path, const char* expected, const RequestJson& got) {
  return bad_request("`" + path + "` must be " + expected + ", got " + json_type_phrase(got) + ".",
                     path);
}

// A list of token ids, each in [0, vocab_size).
std::optional<ApiError> read_token_list(const RequestJson& v, const std::string& path,
                                        int64_t vocab_size, std::vector<int32_t>& out) {
  if (!v.is_array()) return type_error(path, "a list of token ids", v);
  out.clear();
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = path + "[" + std::to_string(i) + "]";
    auto id = v[i].is_number() ? json_to_int64(v[i]) : std::nullopt;
    if (!id) return type_error(p, "an integer token id", v[i]);
    if (*id < 0 || *id >= vocab_size)
      return bad_request("`" + p + "` is token id " + std::to_string(*id) +
                             ", outside the vocabulary [0, " + std::to_string(vocab_size) + ").",
                         p);
    out.push_back(static_cast<int32_t>(*id));
  }
  return std::nullopt;
}

std::optional<ApiError> check_model(const std::optional<std::string>& model,
                                    const ServedModelInfo& info) {
  if (!model) return std::nullopt;
  if (std::find(info.names.begin(), info.names.end(), *model) == info.names.end())
    return model_not_found(*model);
  return std::nullopt;
}

// The fields both endpoints share. `is_chat` switches the logprobs shape (chat: bool +
// top_logprobs; completions: an int).
std::optional<ApiError> read_generation_fields(FieldReader& r, const ServedModelInfo& info,
                                               bool is_chat, GenerationRequest& g) {
  r.get("model", g.model);
  if (!r.ok()) return r.error();
  if (auto e = check_model(g.model, info)) return e;

  SamplingOptions& s = g.sampling;
  r.get("temperature", s.temperature);
  r.get("top_p", s.top_p);
  r.get("top_k", s.top_k);
  r.get("min_p", s.min_p);
  r.get("presence_penalty", s.presence_penalty);
  r.get("frequency_penalty", s.frequency_penalty);
  r.get("repetition_penalty", s.repetition_penalty);
  r.get("min_tokens", s.min_tokens);
  r.get("ignore_eos", s.ignore_eos);
  r.get("seed", s.seed);
  if (s.seed && *s.seed == -1) s.seed.reset();  // vLLM: -1 means "no seed"

  r.get("num_speculative_tokens", g.num_speculative_tokens);
  if (!r.ok()) return r.error();
  if (g.num_speculative_tokens && *g.num_speculative_tokens < 0)
    return bad_request("`num_speculative_tokens` must be at least 0, got " + std::to_string(*g.num_speculative_tokens) +
                           ".",
                       "num_speculative_tokens");
  std::optional<int64_t> max_tokens, max_completion_tokens;
  r.get("max_tokens", max_tokens);
  if (is_chat) r.get("max_completion_tokens", max_completion_tokens);
  if (!r.ok()) return r.error();
  r.get("echo", g.echo);
  if (!r.ok()) return r.error();
  if (!is_chat && g.echo && max_tokens && *max_tokens == 0) {
    // echo with max_tokens 0 (lm-eval style): prompt logprobs only. One token is budgeted so
    // the sampling checks below hold; the engine stops after the prompt.
    g.prompt_only = true;
    max_tokens = 1;
  }
  if (max_completion_tokens && *max_completion_tokens < 1)
    return bad_request("`max_completion_tokens` must be at least 1, got " +
                           std::to_string(*max_completion_tokens) + ".",
                       "max_completion_tokens");
  s.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (!is_chat && !s.max_tokens) s.max_tokens = 16;  // vLLM's CompletionRequest default

  std::optional<int64_t> n, best_of;
  r.get("n", n);
  r.get("best_of", best_of);
  if (!r.ok()) return r.error();
  if (n && (*n < 1 || *n > kMaxChoices))
    return bad_request("`n` must be in [1, " + std::to_string(kMaxChoices) + "] (got n=" + std::to_string(*n) + ").",
                       "n");
  g.n = n.value_or(1);
  if (best_of && *best_of != g.n)
    return bad_request("`best_of` is not supported: it must be absent or equal to `n` (got " +
                           std::to_string(*best_of) + ").", "best_of");
  std::optional<bool> beam;
  r.get("use_beam_search", beam);
  if (beam && *beam) return bad_request("Beam search is not supported.", "use_beam_search");

  if (const RequestJson* stop = r.raw("stop")) {
    if (stop->is_string()) {
      g.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string())
          return type_error("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]);
        g.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return type_error("stop", "a string or a list of strings", *stop);
    }
    if (g.stop.size() > kMaxStopStrings)
      return bad_request("`stop` has " + std::to_string(g.stop.size()) + " entries; at most " +
                             std::to_string(kMaxStopStrings) + " are allowed.", "stop");
    for (const auto& x : g.stop) {
      if (x.empty()) return bad_request("`stop` cannot contain an empty string.", "stop");
      if (x.size() > kMaxStopStringBytes)
        return bad_request("a `stop` string is " + std::to_string(x.size()) + " bytes; at most " +
                               std::to_string(kMaxStopStringBytes) + " are allowed.", "stop");
    }
  }
  if (const RequestJson* ids = r.raw("stop_token_ids")) {
    if (auto e = read_token_list(*ids, "stop_token_ids", info.vocab_size, s.stop_token_ids)) return e;
    if (s.stop_token_ids.size() > kMaxStopTokenIds)  // checked per generated token on the engine thread
      return bad_request("`stop_token_ids` has " + std::to_string(s.stop_token_ids.size()) + " entries; at most " +
                             std::to_string(kMaxStopTokenIds) + " are allowed.", "stop_token_ids");
  }
  if (const RequestJson* ids = r.raw("allowed_token_ids")) {
    std::vector<int32_t> list;
    if (auto e = read_token_list(*ids, "allowed_token_ids", info.vocab_size, list)) return e;
    s.allowed_token_ids = std::move(list);
  }
  if (const RequestJson* bias = r.raw("logit_bias")) {
    if (!bias->is_object()) return type_error("logit_bias", "an object {token id: bias}", *bias);
    for (const auto& [key, value] : bias->items()) {
      std::string p = "logit_bias[\"" + key + "\"]";
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty())
        return bad_request("`logit_bias` key \"" + key + "\" is not an integer token id.",
                           "logit_bias");
      if (!value.is_number()) return type_error(p, "a number", value);
      if (id < 0 || id >= info.vocab_size) {
        return bad_request("`logit_bias` key " + key + " is outside the vocabulary [0, " +
                               std::to_string(info.vocab_size) + ").", "logit_bias");
      }
      double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0))  // checked before narrowing to float
        return bad_request("`logit_bias` value for token " + key + " must be in [-100, 100], got " +
                               value.dump() + ".", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }

  r.get("stream", g.stream);
  if (const RequestJson* so = r.raw("stream_options")) {
    if (!so->is_object()) return type_error("stream_options", "an object", *so);
    if (!g.stream)
      return bad_request("`stream_options` can only be set when `stream` is true.", "stream_options");
    FieldReader sr(*so, "stream_options");
    sr.get("include_usage", g.include_usage);
    sr.get("continuous_usage_stats", g.continuous_usage_stats);
    SS_API_CHECK(sr);
  }
  r.get("skip_special_tokens", g.skip_special_tokens);
  r.get("spaces_between_special_tokens", g.spaces_between_special_tokens);
  r.get("include_stop_str_in_output", g.include_stop_str_in_output);
  r.get("return_token_ids", g.return_token_ids);
  std::optional<std::string> user;
  r.get("user", user);  // accepted and ignored, as vLLM

  if (auto e = read_structured_output(r, g.structured)) return e;
  // Fields that would change what is generated or returned: refused rather than ignored.
  for (const char* key : {"guided_grammar", "guided_whitespace_pattern", "prompt_logprobs", "bad_words", "truncate_prompt_tokens",
                          "logprob_token_ids", "thinking_token_budget", "suffix"}) {
    const RequestJson* v = r.raw(key);
    if (v && !(v->is_array() && v->empty()))
      return bad_request("`" + std::string(key) + "` is not supported by this server.", key);
  }
  r.get("return_tokens_as_token_ids", g.return_tokens_as_token_ids);
  if (!r.ok()) return r.error();
  return std::nullopt;
}

std::optional<ApiError> finish_sampling(FieldReader& r, const ServedModelInfo& info,
                                        GenerationRequest& g) {
  std::string param;
  if (Status st = validate_sampling_options(g.sampling, info.vocab_size, &param); !st.ok())
    return bad_request(st.message(), param);
  g.unknown_fields = r.unknown_fields();
  return std::nullopt;
}

std::optional<ApiError> read_tool_choice(FieldReader& r, ChatRequest& c) {
  const RequestJson* tc = r.raw("tool_choice");
  c.tool_choice = c.tools.is_array() && !c.tools.empty() ? ToolChoice::kAuto : ToolChoice::kNone;
  if (!tc) return std::nullopt;
  if (tc->is_string()) {
    std::string v = tc->get<std::string>();
    if (v == "none") c.tool_choice = ToolChoice::kNone;
    else if (v == "auto") c.tool_choice = ToolChoice::kAuto;
    else if (v == "required") c.tool_choice = ToolChoice::kRequired;
    else
      return bad_request("`tool_choice` \"" + v +
                             "\" is not one of \"none\", \"auto\", \"required\" or a named function.",
                         "tool_choice");
  } else if (tc->is_object()) {
    auto fn = tc->find("function");
    auto type = tc->find("type");
    if (type == tc->end() || !type->is_string() || type->get<std::string>() != "function" ||
        fn == tc->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return bad_request("A named `tool_choice` must be {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}.", "tool_choice");
    c.tool_choice = ToolChoice::kNamed;
    c.tool_choice_name = (*fn)["name"].get<std::string>();
  } else {
    return type_error("tool_choice", "a string or an object", *tc);
  }
  bool have_tools = c.tools.is_array() && !c.tools.empty();
  if ((c.tool_choice == ToolChoice::kRequired || c.tool_choice == ToolChoice::kNamed) && !have_tools)
    return bad_request("`tool_choice` is \"required\" or a named function, but no `tools` were given.",
                       "tool_choice");
  if (c.tool_choice == ToolChoice::kNamed) {
    bool found = std::any_of(c.tools.begin(), c.tools.end(), [&](const RequestJson& t) {
      return t["function"]["name"] == c.tool_choice_name;
    });
    if (!found)
      return bad_request("`tool_choice` names the function \"" + c.tool_choice_name +
                             "\", which is not among `tools`.", "tool_choice");
  }
  return std::nullopt;
}

// chat_template_kwargs / add_generation_prompt / continue_final_message, shared with /tokenize.
std::optional<ApiError> read_template_fields(FieldReader& r, RequestJson& kwargs,
                                             bool& add_generation_prompt,
                                             bool& continue_final_message) {
  if (const RequestJson* k = r.raw("chat_template_kwargs")) {
    if (!k->is_object()) return type_error("chat_template_kwargs", "an object", *k);
    kwargs = *k;
  }
  r.get("add_generation_prompt", add_generation_prompt);
  r.get("continue_final_message", continue_final_message);
  if (!r.ok()) return r.error();
  if (add_generation_prompt && continue_final_message)
    return bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to "
                       "true.", "continue_final_message");
  if (r.raw("chat_template"))
    return bad_request("A per-request `chat_template` is not accepted; the model's template is used.",
                       "chat_template");
  return std::nullopt;
}

}  // namespace

// A conversation of more messages than the context has tokens cannot fit (a chat template writes
// at least a role marker per message): refused before the messages are copied and rendered.
static std::optional<ApiError> too_many_messages(const RequestJson& messages, const ServedModelInfo& info) {
  if (!messages.is_array() || info.max_model_len <= 0 || static_cast<int64_t>(messages.size()) <= info.max_model_len)
    return std::nullopt;
  return bad_request("`messages` has " + std::to_string(messages.size()) + " entries, more than max_model_len (" +
                         std::to_string(info.max_model_len) + ") tokens can hold", "messages");
}

ApiResult<ChatRequest> parse_chat_request(std::string_view body, const ServedModelInfo& info) {
  auto json = parse_json_object_body(body);
  if (!json.ok()) return json.error();
  const RequestJson& j = *json;
  FieldReader r(j, "");
  ChatRequest c;
  if (auto e = read_generation_fields(r, info, /*is_chat=*/true, c)) return *e;

  const RequestJson* messages = r.raw("messages");
  if (!messages) return bad_request("`messages` is required.", "messages");
  if (auto e = too_many_messages(*messages, info)) return *e;
  // The body's messages and tools move into the request (nothing reads them from the body later).
  auto normalized = normalize_chat_messages(std::move((*json)["messages"]));
  if (!normalized.ok()) return normalized.error();
  c.messages = std::move(normalized).value();

  if (r.raw("tools")) {
    auto t = validate_tools(std::move((*json)["tools"]));
    if (!t.ok()) return t.error();
    c.tools = std::move(t).value();
  }
  if (auto e = read_tool_choice(r, c)) return *e;
  r.get("parallel_tool_calls", c.parallel_tool_calls);
  if (auto e = read_template_fields(r, c.chat_template_kwargs, c.add_generation_prompt,
                                    c.continue_final_message))
    return *e;
  r.get("add_special_tokens", c.add_special_tokens);
  r.get("include_reasoning", c.include_reasoning);
  r.get("reasoning_effort", c.reasoning_effort);

  std::optional<bool> logprobs;
  std::optional<int64_t> top_logprobs;
  r.get("logprobs", logprobs);
  r.get("top_logprobs", top_logprobs);
  SS_API_CHECK(r);
  c.logprobs = logprobs.value_or(false);
  if (top_logprobs) {
    if (*top_logprobs < 0 || *top_logprobs > kMaxTopLogprobs)
      return bad_request("`top_logprobs` must be in [0, " + std::to_string(kMaxTopLogprobs) +
                             "], got " + std::to_string(*top_logprobs) + ".", "top_logprobs");
    if (*top_logprobs > 0 && !c.logprobs)
      return bad_request("`top_logprobs` needs `logprobs` set to true.", "top_logprobs");
  }
  if (c.logprobs) c.sampling.logprobs = static_cast<int>(top_logprobs.value_or(0));
  if (auto e = finish_sampling(r, info, c)) return *e;
  return c;
}

ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                      const ServedModelInfo& info) {
  auto json = parse_json_object_body(body);
  if (!json.ok()) return json.error();
  FieldReader r(*json, "");
  CompletionRequest c;
  if (auto e = read_generation_fields(r, info, /*is_chat=*/false, c)) return *e;

  const RequestJson* prompt = r.raw("prompt");
  if (!prompt) return bad_request("`prompt` is required.", "prompt");
  // A string, a list of token ids, or a list of several of either (a batch).
  std::vector<std::pair<const RequestJson*, std::string>> items;
  if (prompt->is_array() && !prompt->empty() && (prompt->front().is_string() || prompt->front().is_array())) {
    for (size_t i = 0; i < prompt->size(); ++i) items.emplace_back(&(*prompt)[i], "prompt[" + std::to_string(i) + "]");
  } else {
    items.emplace_back(prompt, "prompt");
  }
  if (static_cast<int64_t>(items.size()) * c.n > kMaxChoices)
    return bad_request("`prompt` holds " + std::to_string(items.size()) + " prompts with n=" + std::to_string(c.n) +
                           "; at most " + std::to_string(kMaxChoices) + " choices per request.", "prompt");
  for (const auto& [p, path] : items) {
    CompletionRequest::Prompt one;
    if (p->is_string()) {
      if (p->get_ref<const std::string&>().empty()) return bad_request("`" + path + "` must not be empty.", path);
      one.text = p->get<std::string>();
    } else if (p->is_array()) {
      if (auto e = read_token_list(*p, path, info.vocab_size, one.tokens)) return *e;
      if (one.tokens.empty()) return bad_request("`" + path + "` must not be empty.", path);
    } else {
      return type_error(path, "a string, a list of token ids, or a list of those", *p);
    }
    c.prompts.push_back(std::move(one));
  }
  r.get("add_special_tokens", c.add_special_tokens);

  if (const RequestJson* lp = r.raw("logprobs")) {
    auto k = lp->is_number() ? json_to_int64(*lp) : std::nullopt;
    if (!k) return type_error("logprobs", "an integer (the number of top logprobs)", *lp);
    if (*k < 0 || *k > kMaxTopLogprobs)
      return bad_request("`logprobs` must be in [0, " + std::to_string(kMaxTopLogprobs) +
                             "], got " + std::to_string(*k) + ".", "logprobs");
    c.sampling.logprobs = static_cast<int>(*k);
  }
  SS_API_CHECK(r);
  if (auto e = finish_sampling(r, info, c)) return *e;
  return c;
}

ApiResult<TokenizeRequest> parse_tokenize_request(std::string_view body,
                                                  const ServedModelInfo& info) {
  auto json = parse_json_object_body(body);
  if (!json.ok()) return json.error();
  FieldReader r(*json, "");
  TokenizeRequest t;
  r.get("model", t.model);
  SS_API_CHECK(r);
  if (auto e = check_model(t.model, info)) return *e;
  r.get("prompt", t.prompt);
  const RequestJson* messages = r.raw("messages");
  SS_API_CHECK(r);
  if (t.prompt.has_value() == (messages != nullptr))
    return bad_request("Send exactly one of `prompt` and `messages`.", t.prompt ? "messages" : "prompt");
  if (messages) {
    if (auto e = too_many_messages(*messages, info)) return *e;
    auto normalized = normalize_chat_messages(*messages);
    if (!normalized.ok()) return normalized.error();
    t.messages = std::move(normalized).value();
    t.add_special_tokens = false;
    if (const RequestJson* tools = r.raw("tools")) {
      auto v = validate_tools(*tools);
      if (!v.ok()) return v.error();
      t.tools = std::move(v).value();
    }
    if (auto e = read_template_fields(r, t.chat_template_kwargs, t.add_generation_prompt,
                                      t.continue_final_message))
      return *e;
  }
  r.get("add_special_tokens", t.add_special_tokens);
  r.get("return_token_strs", t.return_token_strs);
  SS_API_CHECK(r);
  return t;
}

ApiResult<DetokenizeRequest> parse_detokenize_request(std::string_view body,
                                                      const ServedModelInfo& info) {
  auto json = parse_json_object_body(body);
  if (!json.ok()) return json.error();
  FieldReader r(*json, "");
  DetokenizeRequest d;
  r.get("model", d.model);
  SS_API_CHECK(r);
  if (auto e = check_model(d.model, info)) return *e;
  const RequestJson* tokens = r.raw("tokens");
  if (!tokens) return bad_request("`tokens` is required.", "tokens");
  if (auto e = read_token_list(*tokens, "tokens", info.vocab_size, d.tokens)) return *e;
  if (static_cast<int64_t>(d.tokens.size()) > info.max_model_len)
    return bad_request("`tokens` has " + std::to_string(d.tokens.size()) + " ids; at most max_model_len (" +
                           std::to_string(info.max_model_len) + ") are detokenized at once.", "tokens");
  return d;
}

ApiResult<int64_t> check_context_length(int64_t prompt_tokens, std::optional<int64_t> max_tokens,
                                        int64_t max_model_len) {
  if (prompt_tokens >= max_model_len)
    return bad_request("This model's maximum context length is " + std::to_string(max_model_len) +
                           " tokens. However, your request has " + std::to_string(prompt_tokens) +
                           " input tokens, which leaves no room for a completion. Please reduce "
                           "the length of the input.",
                       "messages");
  // Compared as a difference and summed unsigned: max_tokens may be near INT64_MAX.
  if (max_tokens && *max_tokens > max_model_len - prompt_tokens)
    return bad_request("This model's maximum context length is " + std::to_string(max_model_len) +
                           " tokens. However, you requested " +
                           std::to_string(static_cast<uint64_t>(prompt_tokens) +
                                          static_cast<uint64_t>(*max_tokens)) + " tokens (" +
                           std::to_string(prompt_tokens) + " in the input, " +
                           std::to_string(*max_tokens) + " in the completion). Please reduce the "
                           "length of the input or of max_tokens.",
                       "max_tokens");
  return max_tokens ? *max_tokens : max_model_len - prompt_tokens;
}

}  // namespace sparkserve
