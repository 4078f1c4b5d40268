#include "server/openai_response.h"

#include <chrono>
#include <cmath>
#include <random>

namespace sparkserve {
namespace {

double finite_logprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

ResponseJson utf8_bytes(const std::string& s) {
  ResponseJson b = ResponseJson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

ResponseJson token_ids_json(const std::vector<int32_t>& ids) { return ResponseJson(ids); }

ResponseJson base(const ResponseMeta& meta, const char* object) {
  ResponseJson j = ResponseJson::object();
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

void put_end(ResponseJson& choice, const std::optional<ChoiceEnd>& end) {
  if (end) {
    choice["finish_reason"] = end->finish_reason;
    choice["stop_reason"] = end->stop_reason;
  } else {
    choice["finish_reason"] = nullptr;
    choice["stop_reason"] = nullptr;
  }
}

void put_extras(ResponseJson& choice, const ChoiceExtras& extras) {
  choice["logprobs"] = extras.logprobs ? *extras.logprobs : ResponseJson(nullptr);
}

void put_token_ids(ResponseJson& choice, const ChoiceExtras& extras) {
  if (extras.token_ids) choice["token_ids"] = token_ids_json(*extras.token_ids);
}

void put_reasoning(ResponseJson& obj, const std::optional<std::string>& reasoning) {
  if (!reasoning) return;
  obj["reasoning"] = *reasoning;
  obj["reasoning_content"] = *reasoning;
}

}  // namespace

std::string make_response_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 2; ++i) {
    uint64_t r = rng();
    for (int k = 0; k < 16; ++k) id.push_back(kHex[(r >> (4 * k)) & 15]);
  }
  return id;
}

int64_t unix_time_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string serialize_json(const ResponseJson& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ResponseJson usage_json(const UsageInfo& u) {
  ResponseJson j = ResponseJson::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["completion_tokens"] = u.completion_tokens;
  if (u.cached_tokens) j["prompt_tokens_details"] = {{"cached_tokens", *u.cached_tokens}};
  return j;
}

ResponseJson chat_logprobs_json(const std::vector<TokenLogprobs>& tokens) {
  ResponseJson content = ResponseJson::array();
  for (const TokenLogprobs& t : tokens) {
    ResponseJson e = ResponseJson::object();
    e["token"] = t.chosen.text;
    e["logprob"] = finite_logprob(t.chosen.logprob);
    e["bytes"] = utf8_bytes(t.chosen.text);
    ResponseJson top = ResponseJson::array();
    for (const LogprobToken& x : t.top)
      top.push_back({{"token", x.text}, {"logprob", finite_logprob(x.logprob)}, {"bytes", utf8_bytes(x.text)}});
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

namespace {

// Completions' logprobs object, built one token at a time.
struct CompletionLogprobs {
  ResponseJson offsets = ResponseJson::array(), lps = ResponseJson::array(), toks = ResponseJson::array(),
               tops = ResponseJson::array();
  int64_t offset = 0;

  // lp null: a token without a logprob (the first of an echoed prompt). with_chosen: the top
  // dict also holds the token itself (vLLM's prompt logprobs).
  void add(const std::string& text, const TokenLogprobs* lp, bool with_chosen) {
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
    toks.push_back(text);
    if (!lp) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      return;
    }
    lps.push_back(finite_logprob(lp->chosen.logprob));
    ResponseJson top = ResponseJson::object();
    for (const LogprobToken& x : lp->top) top[x.text] = finite_logprob(x.logprob);
    if (with_chosen) top[lp->chosen.text] = finite_logprob(lp->chosen.logprob);
    tops.push_back(std::move(top));
  }
  ResponseJson json() {
    ResponseJson j = ResponseJson::object();
    j["text_offset"] = std::move(offsets);
    j["token_logprobs"] = std::move(lps);
    j["tokens"] = std::move(toks);
    j["top_logprobs"] = std::move(tops);
    return j;
  }
};

}  // namespace

ResponseJson completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                                      int64_t text_offset_start) {
  CompletionLogprobs c;
  c.offset = text_offset_start;
  for (const TokenLogprobs& t : tokens) c.add(t.chosen.text, &t, false);
  return c.json();
}

ResponseJson echo_logprobs_json(const std::vector<std::string>& prompt_tokens,
                                const std::vector<TokenLogprobs>& prompt_lps,
                                const std::vector<TokenLogprobs>& generated, int64_t text_offset_start) {
  CompletionLogprobs c;
  c.offset = text_offset_start;
  for (size_t i = 0; i < prompt_tokens.size(); ++i)
    c.add(prompt_tokens[i], i == 0 || i - 1 >= prompt_lps.size() ? nullptr : &prompt_lps[i - 1], true);
  for (const TokenLogprobs& t : generated) c.add(t.chosen.text, &t, false);
  return c.json();
}

ResponseJson merge_choices(std::vector<ResponseJson> responses, const UsageInfo& usage) {
  ResponseJson out = std::move(responses.front());
  ResponseJson choices = ResponseJson::array();
  for (size_t i = 0; i < responses.size(); ++i) {
    ResponseJson& r = i == 0 ? out : responses[i];
    ResponseJson c = std::move(r["choices"][0]);
    c["index"] = i;
    choices.push_back(std::move(c));
  }
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  return out;
}

ResponseJson with_choice_index(ResponseJson chunk, size_t index) {
  if (chunk.contains("choices") && !chunk["choices"].empty()) chunk["choices"][0]["index"] = index;
  return chunk;
}

namespace {

// {"index": 0, <key>: body, "logprobs", "finish_reason", "stop_reason", ["prompt_token_ids"],
// ["token_ids"]}: one choice, in vLLM's key order (text completions carry prompt_token_ids here).
ResponseJson choice_json(const char* key, ResponseJson body, const std::optional<ChoiceEnd>& end,
                         const ChoiceExtras& extras, const std::vector<int32_t>* prompt_token_ids = nullptr) {
  ResponseJson choice = ResponseJson::object();
  choice["index"] = 0;
  choice[key] = std::move(body);
  put_extras(choice, extras);
  put_end(choice, end);
  if (prompt_token_ids) choice["prompt_token_ids"] = token_ids_json(*prompt_token_ids);
  put_token_ids(choice, extras);
  return choice;
}

// The response object around one choice, with usage when given.
ResponseJson one_choice_response(const ResponseMeta& meta, const char* object, ResponseJson choice,
                                 const UsageInfo* usage) {
  ResponseJson j = base(meta, object);
  j["choices"] = ResponseJson::array({std::move(choice)});
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

// The last chunk of a stream with include_usage: no choices, only usage.
ResponseJson usage_only_chunk(const ResponseMeta& meta, const char* object, const UsageInfo& usage) {
  ResponseJson j = base(meta, object);
  j["choices"] = ResponseJson::array();
  j["usage"] = usage_json(usage);
  return j;
}

}  // namespace

ResponseJson chat_completion_json(const ResponseMeta& meta, const ChatMessageOut& message,
                                  const ChoiceEnd& end, const UsageInfo& usage, ChoiceExtras extras,
                                  const std::vector<int32_t>* prompt_token_ids) {
  ResponseJson msg = ResponseJson::object();
  msg["role"] = "assistant";
  msg["content"] = message.content ? ResponseJson(*message.content) : ResponseJson(nullptr);
  put_reasoning(msg, message.reasoning);
  if (!message.tool_calls.empty()) msg["tool_calls"] = message.tool_calls;
  ResponseJson j = one_choice_response(meta, "chat.completion", choice_json("message", std::move(msg), end, extras), &usage);
  if (prompt_token_ids) j["prompt_token_ids"] = token_ids_json(*prompt_token_ids);
  return j;
}

ResponseJson chat_chunk_json(const ResponseMeta& meta, const ChatDelta& delta,
                             const std::optional<ChoiceEnd>& end, ChoiceExtras extras,
                             const UsageInfo* usage, const std::vector<int32_t>* prompt_token_ids) {
  ResponseJson d = ResponseJson::object();
  if (delta.role) d["role"] = "assistant";
  if (delta.content) d["content"] = *delta.content;
  put_reasoning(d, delta.reasoning);
  if (!delta.tool_calls.empty()) d["tool_calls"] = delta.tool_calls;
  ResponseJson j = one_choice_response(meta, "chat.completion.chunk", choice_json("delta", std::move(d), end, extras), usage);
  if (prompt_token_ids) j["prompt_token_ids"] = token_ids_json(*prompt_token_ids);
  return j;
}

ResponseJson chat_usage_chunk_json(const ResponseMeta& meta, const UsageInfo& usage) {
  return usage_only_chunk(meta, "chat.completion.chunk", usage);
}

ResponseJson text_completion_json(const ResponseMeta& meta, const std::string& text,
                                  const ChoiceEnd& end, const UsageInfo& usage, ChoiceExtras extras,
                                  const std::vector<int32_t>* prompt_token_ids) {
  return one_choice_response(meta, "text_completion", choice_json("text", text, end, extras, prompt_token_ids), &usage);
}

ResponseJson text_completion_chunk_json(const ResponseMeta& meta, const std::string& text,
                                        const std::optional<ChoiceEnd>& end, ChoiceExtras extras,
                                        const UsageInfo* usage,
                                        const std::vector<int32_t>* prompt_token_ids) {
  return one_choice_response(meta, "text_completion", choice_json("text", text, end, extras, prompt_token_ids), usage);
}

ResponseJson text_completion_usage_chunk_json(const ResponseMeta& meta, const UsageInfo& usage) {
  return usage_only_chunk(meta, "text_completion", usage);
}

ResponseJson models_list_json(const std::vector<std::string>& served_names, const std::string& root,
                              int64_t max_model_len, int64_t created) {
  ResponseJson data = ResponseJson::array();
  for (const std::string& name : served_names) {
    ResponseJson m = ResponseJson::object();
    m["id"] = name;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "sparkserve";
    m["root"] = root;
    m["parent"] = nullptr;
    m["max_model_len"] = max_model_len;
    m["permission"] = ResponseJson::array();
    data.push_back(std::move(m));
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

ResponseJson tokenize_response_json(const std::vector<int32_t>& tokens, int64_t max_model_len,
                                    const std::vector<std::string>* token_strs) {
  ResponseJson j = ResponseJson::object();
  j["count"] = tokens.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = token_ids_json(tokens);
  if (token_strs) j["token_strs"] = *token_strs;
  return j;
}

ResponseJson detokenize_response_json(const std::string& prompt) { return {{"prompt", prompt}}; }

ResponseJson error_json(const ApiError& e) {
  ResponseJson inner = ResponseJson::object();
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param ? ResponseJson(*e.param) : ResponseJson(nullptr);
  inner["code"] = e.status;
  return {{"error", std::move(inner)}};
}

}  // namespace sparkserve
