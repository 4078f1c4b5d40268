#include "server/handlers.h"

#include <atomic>
#include <chrono>
#include <memory>

#include "server/api_error.h"
#include "server/api_key.h"
#include "server/openai_response.h"
#include "server/sse.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"

namespace sparkserve {
namespace {

using http::Responder;
using ResponderPtr = std::shared_ptr<Responder>;
std::atomic<uint64_t> g_next_request_id{1};

void send_error(Responder& res, const ApiError& e, std::vector<http::Header> extra = {}) {
  res.send(e.status, "application/json", serialize_json(error_json(e)), std::move(extra));
}

void send_json(Responder& res, const ResponseJson& j) { res.send(200, "application/json", serialize_json(j)); }

ChatDelta to_chat_delta(const Generation& g, const OutputDelta& d) {
  ChatDelta cd;
  if (!d.content.empty()) cd.content = d.content;
  if (!d.reasoning.empty() && g.include_reasoning) cd.reasoning = d.reasoning;
  for (const auto& c : d.tool_calls) cd.tool_calls.push_back(c.to_openai());
  return cd;
}

ApiError shutdown_error() { return engine_unavailable("the server is shutting down"); }
ApiError drained_error() {
  return engine_unavailable("the server shut down before this request finished; retry it elsewhere or later");
}


ApiError no_chat_template(const ServeContext& ctx) {
  if (!ctx.chat_template_error.empty())
    return ApiError{500, "InternalServerError", "the model's chat template cannot be used: " + ctx.chat_template_error, "messages"};
  return bad_request("this model folder has no chat template (chat_template.jinja or tokenizer_config.json); use /v1/completions", "messages");
}

// Text longer than this cannot fit in the context whatever it holds (each token covers at most
// ctx.max_token_bytes bytes, and NFC normalization shrinks UTF-8 at most 3x: three 3-byte Hangul
// jamo compose into one 3-byte syllable), so it is refused before tokenizing: the work and the
// memory of a request stay proportional to the context, not to the body.
std::optional<ApiError> over_context_bytes(const ServeContext& ctx, size_t bytes, const char* what, const char* param) {
  const uint64_t limit = static_cast<uint64_t>(ctx.info.max_model_len) * std::max<size_t>(ctx.max_token_bytes, 1) * 3;
  if (bytes <= limit) return std::nullopt;
  return bad_request(std::string(what) + " is " + std::to_string(bytes) + " bytes: more than the context can hold (max_model_len " +
                         std::to_string(ctx.info.max_model_len) + " tokens of at most " + std::to_string(ctx.max_token_bytes) +
                         " bytes each; requests over " + std::to_string(limit) + " bytes are refused before tokenizing)",
                     param);
}

// Plain text -> ids (BOS first when the tokenizer adds one and add_special is set).
ApiResult<std::vector<int32_t>> encode_text(const ServeContext& ctx, const std::string& text, bool add_special,
                                            const char* param) {
  if (auto e = over_context_bytes(ctx, text.size(), param, param)) return *e;
  auto enc = ctx.tokenizer->encode(text);
  if (!enc.ok()) return bad_request(enc.message(), param);
  std::vector<int32_t> ids;
  if (add_special && ctx.tokenizer->add_bos_token())
    if (auto bos = ctx.tokenizer->bos_token_id()) ids.push_back(*bos);
  ids.insert(ids.end(), enc->begin(), enc->end());
  return ids;
}

// A chat prompt: token ids (each image placeholder expanded to its image's token count) and the
// images with their M-RoPE positions (null for text).
struct ChatPrompt {
  std::vector<int32_t> ids;
  std::shared_ptr<MultimodalPrompt> mm;
};

// Chat messages rendered with the model's chat template (ctx.chat_template must be set), then
// tokenized; the messages' images decoded and their placeholders expanded. Errors are 400s on
// "messages" (or the image part at fault). generation_prompt_start (optional): where the template's
// generation prompt begins in the ids (-1 when there is none or it cannot be told), the point from
// which the next turn of the conversation renders this turn's reply differently.
ApiResult<ChatPrompt> encode_chat(const ServeContext& ctx, const RequestJson& messages,
                                  const RequestJson& tools, bool add_generation_prompt,
                                  const RequestJson& chat_template_kwargs,
                                  int64_t* generation_prompt_start = nullptr) {
  auto images = load_chat_images(messages, ctx.image_input);
  if (!images.ok()) return images.error();
  OrderedJson tmpl_req = OrderedJson::object();
  tmpl_req["messages"] = messages;
  if (!tools.is_null()) tmpl_req["tools"] = tools;
  tmpl_req["add_generation_prompt"] = add_generation_prompt;
  tmpl_req["chat_template_kwargs"] = chat_template_kwargs;
  auto rendered = render_chat_request(*ctx.chat_template, tmpl_req);
  if (!rendered.ok()) return bad_request("chat template " + ctx.chat_template->origin + ": " + rendered.message(), "messages");
  if (auto e = over_context_bytes(ctx, rendered->size(), "the rendered chat prompt", "messages")) return *e;
  auto ids = ctx.tokenizer->encode(*rendered);
  if (!ids.ok()) return bad_request(ids.message(), "messages");
  // Tokens of the generation prompt (the rendered suffix that add_generation_prompt appends).
  int64_t suffix_tokens = -1;
  if (generation_prompt_start) {
    tmpl_req["add_generation_prompt"] = false;
    auto bare = add_generation_prompt ? render_chat_request(*ctx.chat_template, tmpl_req) : rendered;
    // The suffix alone tokenizes as it does inside the prompt when it starts with a special token
    // (e.g. <|im_start|>); otherwise the count may be off by a merge, which only moves the hint.
    if (bare.ok() && rendered->size() > bare->size() && rendered->compare(0, bare->size(), *bare) == 0)
      if (auto suffix = ctx.tokenizer->encode(std::string_view(*rendered).substr(bare->size())); suffix.ok())
        suffix_tokens = static_cast<int64_t>(suffix->size());
  }
  ChatPrompt p;
  p.ids.assign(ids->begin(), ids->end());
  auto mm = expand_image_tokens(p.ids, std::move(*images), ctx.image_input);
  if (!mm.ok()) return mm.error();
  p.mm = std::move(*mm);
  // The suffix holds no image, so it ends the expanded ids too.
  if (generation_prompt_start)
    *generation_prompt_start = suffix_tokens >= 0 ? static_cast<int64_t>(p.ids.size()) - suffix_tokens : -1;
  return p;
}

struct Prepared {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Shared by chat and completions: context-length check, sampling parameters.
ApiResult<Prepared> prepare(const ServeContext& ctx, const GenerationRequest& r, std::vector<int32_t> prompt) {
  if (prompt.empty()) return bad_request("the prompt is empty (the chat template rendered no tokens)", "messages");
  auto budget = check_context_length(static_cast<int64_t>(prompt.size()), r.sampling.max_tokens, ctx.info.max_model_len);
  if (!budget.ok()) return budget.error();
  if (r.sampling.min_tokens && *r.sampling.min_tokens > *budget)
    return bad_request("min_tokens=" + std::to_string(*r.sampling.min_tokens) + " cannot be reached: the prompt has " +
                           std::to_string(prompt.size()) + " tokens and the context holds " +
                           std::to_string(ctx.info.max_model_len) + ", so at most " + std::to_string(*budget) +
                           " can be generated", "min_tokens");
  Prepared p;
  p.prompt = std::move(prompt);
  p.params = resolve_sampling_params(r.sampling, ctx.defaults, *budget);
  return p;
}

std::unique_ptr<Generation> start_generation(ServeContext& ctx, const GenerationRequest& r, Prepared p) {
  auto g = std::make_unique<Generation>();
  g->er = std::make_shared<EngineRequest>();
  g->er->id = g_next_request_id.fetch_add(1);
  g->er->prompt = std::move(p.prompt);
  g->er->params = std::move(p.params);
  g->num_logprobs = g->er->params.num_logprobs;
  DetokenizerOptions dopt;
  dopt.stop = r.stop;
  dopt.include_stop_str_in_output = r.include_stop_str_in_output;
  dopt.skip_special_tokens = r.skip_special_tokens;
  const Tokenizer* tok = ctx.tokenizer;
  g->detok = std::make_unique<StreamingDetokenizer>([tok](int id) { return tok->token_bytes(id); },
                                                    [tok](int id) { return tok->is_special(id); }, dopt);
  return g;
}

UsageInfo usage_of(const Generation& g) {
  UsageInfo u;
  u.prompt_tokens = static_cast<int64_t>(g.er->prompt.size());
  u.completion_tokens = static_cast<int64_t>(g.token_ids.size());
  // As OpenAI reports it (vLLM only with --enable-prompt-tokens-details): known once a token came.
  if (g.cached_tokens >= 0) u.cached_tokens = g.cached_tokens;
  return u;
}


// Overload: a bounded engine queue. Past it a new generation is refused at once (503 with
// Retry-After), never left waiting without bound.
std::optional<ApiError> overloaded(const ServeContext& ctx) {
  if (ctx.shutting_down.load()) return shutdown_error();
  if (ctx.max_waiting_requests <= 0) return std::nullopt;
  const int64_t waiting = ctx.engine->stats().waiting;
  if (waiting < ctx.max_waiting_requests) return std::nullopt;
  return engine_unavailable("the server is overloaded: " + std::to_string(waiting) +
                            " requests are waiting (--max-waiting-requests " +
                            std::to_string(ctx.max_waiting_requests) + "); retry later");
}

void send_overloaded(Responder& res, const ApiError& e) { send_error(res, e, {{"Retry-After", "1"}}); }

// Submits g and drives it to the end as one JSON response: `respond` builds it once g is done.
void run_to_json(ServeContext& ctx, std::shared_ptr<Generation> g, ResponderPtr res, std::function<void()> respond) {
  const Tokenizer* tok = ctx.tokenizer;
  auto wake = ctx.jobs->add(g->er->out, [&ctx, g, res, tok, respond = std::move(respond)] {
    if (res->gone()) return true;  // g's destructor cancels the engine request
    if (ctx.drain_expired.load()) {
      send_error(*res, drained_error());
      return true;
    }
    Piece p;
    pump(*g, *tok, ctx.request_timeout_s, p);
    if (!g->done) return false;
    if (g->error) send_error(*res, *g->error);
    else respond();
    return true;
  });
  res->on_wake(wake);
  ctx.engine->submit(g->er);
}

struct StreamFns {
  std::function<std::string(const Piece&)> chunk;  // one piece's event ("" when there is nothing to send)
  std::function<std::string()> closing;            // the final chunk, usage, [DONE]
};

// Submits g and streams it as SSE: one event per piece, then the closing events. A reader that
// falls behind (kStreamHighWater bytes unsent) pauses the stream; the engine's tokens wait in
// the request's channel. A generation error mid-stream ends it with an error event + [DONE].
void run_to_stream(ServeContext& ctx, std::shared_ptr<Generation> g, ResponderPtr res, StreamFns fns) {
  const Tokenizer* tok = ctx.tokenizer;
  res->start_stream("text/event-stream");
  auto wake = ctx.jobs->add(g->er->out, [&ctx, g, res, tok, fns = std::move(fns)] {
    if (res->gone()) return true;
    auto fail = [&](const ApiError& e) {
      res->write(sse_error_and_done(e));
      res->end();
      return true;
    };
    if (ctx.drain_expired.load()) return fail(drained_error());
    if (res->pending_bytes() > Responder::kStreamHighWater) return false;  // woken when it drains
    Piece p;
    pump(*g, *tok, ctx.request_timeout_s, p);
    if (g->error) return fail(*g->error);
    const std::string event = fns.chunk(p);
    if (!event.empty() && !res->write(event)) return true;
    if (!g->done) return false;
    res->write(fns.closing());
    res->end();
    return true;
  });
  res->on_wake(wake);
  ctx.engine->submit(g->er);
}

// tool_choice "required" / a named function: constrained decoding to qwen3_coder tool calls
// (text/tool_call_grammar.h). Null for none / auto.
ApiResult<std::shared_ptr<TokenConstraint>> tool_call_constraint(const ServeContext& ctx, const ChatRequest& r,
                                                                 const SamplingParams& params, bool thinking) {
  if (r.tool_choice != ToolChoice::kRequired && r.tool_choice != ToolChoice::kNamed)
    return std::shared_ptr<TokenConstraint>();
  if (!ctx.vocab_texts)
    return internal_error("constrained decoding is not set up (no vocabulary texts)");
  if (params.min_tokens > 0)
    return bad_request("min_tokens cannot be combined with tool_choice \"required\" or a named function "
                       "(the end of the tool call would be masked)", "min_tokens");
  ToolCallGrammarOptions gopt;
  gopt.thinking = thinking;
  gopt.parallel_tool_calls = r.parallel_tool_calls;
  if (r.tool_choice == ToolChoice::kNamed) gopt.only_function = r.tool_choice_name;
  auto grammar = ToolCallGrammar::build(OrderedJson(r.tools), gopt);
  if (!grammar.ok()) return bad_request("tool_choice: " + grammar.message(), "tools");
  std::vector<int32_t> end_ids = params.eos_token_ids;
  end_ids.insert(end_ids.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  return std::shared_ptr<TokenConstraint>(
      std::make_shared<ToolCallConstraint>(std::move(*grammar), ctx.vocab_texts, std::move(end_ids)));
}


void handle_chat(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_chat_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  ChatRequest& r = *parsed;
  if (r.continue_final_message)
    return send_error(*res, bad_request("continue_final_message is not supported yet", "continue_final_message"));
  if (!ctx.chat_template) return send_error(*res, no_chat_template(ctx));
  if (auto busy = overloaded(ctx)) return send_overloaded(*res, *busy);
  int64_t generation_prompt_start = -1;
  auto prompt = encode_chat(ctx, r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs,
                            &generation_prompt_start);
  if (!prompt.ok()) return send_error(*res, prompt.error());
  auto prep = prepare(ctx, r, std::move(prompt->ids));
  if (!prep.ok()) return send_error(*res, prep.error());

  auto et = r.chat_template_kwargs.find("enable_thinking");
  const bool thinking = !(et != r.chat_template_kwargs.end() && et->is_boolean() && !et->get<bool>());
  auto constraint = tool_call_constraint(ctx, r, prep->params, thinking);
  if (!constraint.ok()) return send_error(*res, constraint.error());

  std::shared_ptr<Generation> g = start_generation(ctx, r, std::move(*prep));
  g->er->constraint = std::move(*constraint);
  if (generation_prompt_start > 0) g->er->snapshot_hints.push_back(generation_prompt_start);
  g->er->mm = std::move(prompt->mm);
  OutputParserOptions popt;
  popt.thinking_enabled = thinking;
  popt.parse_tools = !r.tools.is_null() && r.tool_choice != ToolChoice::kNone;
  if (popt.parse_tools) popt.tool_schemas = ToolSchemas::from_openai_tools(r.tools);
  g->parser = std::make_unique<StreamingOutputParser>(std::move(popt));
  g->include_reasoning = r.include_reasoning;
  ResponseMeta meta{make_response_id("chatcmpl-"), unix_time_seconds(), ctx.info.names.front()};
  const bool want_logprobs = r.logprobs;
  const bool token_ids = r.return_token_ids;

  if (!r.stream) {
    return run_to_json(ctx, g, res, [g, res, meta, want_logprobs, token_ids] {
      const ParsedOutput& out = g->parser->result();
      ChatMessageOut msg;
      msg.content = out.content;
      if (g->include_reasoning) msg.reasoning = out.reasoning;
      for (const auto& c : out.tool_calls) msg.tool_calls.push_back(c.to_openai());
      ChoiceEnd end{out.finish_reason(g->finish_reason), g->stop_reason};
      ResponseJson lp;
      ChoiceExtras ex;
      if (want_logprobs) {
        lp = chat_logprobs_json(g->logprobs);
        ex.logprobs = &lp;
      }
      if (token_ids) ex.token_ids = &g->token_ids;
      send_json(*res, chat_completion_json(meta, msg, end, usage_of(*g), ex, token_ids ? &g->er->prompt : nullptr));
    });
  }

  const bool include_usage = r.include_usage;
  auto first = std::make_shared<bool>(true);
  auto any_tool_call = std::make_shared<bool>(false);
  // The role chunk goes out with the first generated piece, not before the prefill (as vLLM
  // does): clients such as llama-benchy time the prefill up to the first chunk.
  auto with_role = [g, meta, first, token_ids](std::string event) {
    if (!*first) return event;
    *first = false;
    ChatDelta role;
    role.role = true;
    role.content = "";
    return sse_event(chat_chunk_json(meta, role, std::nullopt, {}, nullptr, token_ids ? &g->er->prompt : nullptr)) +
           event;
  };
  StreamFns fns;
  fns.chunk = [g, meta, with_role, any_tool_call, want_logprobs, token_ids](const Piece& p) {
    ChatDelta d = to_chat_delta(*g, p.delta);
    if (!d.tool_calls.empty()) *any_tool_call = true;
    const bool has_delta = d.content || d.reasoning || !d.tool_calls.empty();
    if (!has_delta && (p.token_ids.empty() || (!token_ids && !want_logprobs))) return std::string();
    ResponseJson lp;
    ChoiceExtras ex;
    if (want_logprobs) {
      lp = chat_logprobs_json(p.logprobs);
      ex.logprobs = &lp;
    }
    if (token_ids) ex.token_ids = &p.token_ids;
    return with_role(sse_event(chat_chunk_json(meta, d, std::nullopt, ex)));
  };
  fns.closing = [g, meta, with_role, any_tool_call, include_usage] {
    std::string out = with_role(std::string());
    ChoiceEnd end{*any_tool_call ? std::string("tool_calls") : g->finish_reason, g->stop_reason};
    out += sse_event(chat_chunk_json(meta, ChatDelta{}, end));
    if (include_usage) out += sse_event(chat_usage_chunk_json(meta, usage_of(*g)));
    return out + std::string(kSseDone);
  };
  run_to_stream(ctx, g, res, std::move(fns));
}

// ---- /v1/completions -----------------------------------------------------------------------

void handle_completion(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_completion_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  CompletionRequest& r = *parsed;
  if (r.echo) return send_error(*res, bad_request("echo is not supported yet", "echo"));
  if (auto busy = overloaded(ctx)) return send_overloaded(*res, *busy);
  std::vector<int32_t> prompt;
  if (r.prompt_tokens) {
    prompt = *r.prompt_tokens;
  } else {
    auto ids = encode_text(ctx, *r.prompt_text, r.add_special_tokens, "prompt");
    if (!ids.ok()) return send_error(*res, ids.error());
    prompt = std::move(*ids);
  }
  if (prompt.empty()) return send_error(*res, bad_request("prompt is empty", "prompt"));
  auto prep = prepare(ctx, r, std::move(prompt));
  if (!prep.ok()) return send_error(*res, prep.error());
  std::shared_ptr<Generation> g = start_generation(ctx, r, std::move(*prep));
  ResponseMeta meta{make_response_id("cmpl-"), unix_time_seconds(), ctx.info.names.front()};
  const bool token_ids = r.return_token_ids;

  if (!r.stream) {
    return run_to_json(ctx, g, res, [g, res, meta, token_ids] {
      ResponseJson lp;
      ChoiceExtras ex;
      if (g->num_logprobs >= 0) {
        lp = completion_logprobs_json(g->logprobs);
        ex.logprobs = &lp;
      }
      if (token_ids) ex.token_ids = &g->token_ids;
      send_json(*res, text_completion_json(meta, g->text, ChoiceEnd{g->finish_reason, g->stop_reason}, usage_of(*g),
                                           ex, token_ids ? &g->er->prompt : nullptr));
    });
  }
  const bool include_usage = r.include_usage;
  auto first = std::make_shared<bool>(true);
  auto offset = std::make_shared<int64_t>(0);
  StreamFns fns;
  fns.chunk = [g, meta, first, offset, token_ids](const Piece& p) {
    if (p.text.empty() && (p.token_ids.empty() || (!token_ids && g->num_logprobs < 0))) return std::string();
    ResponseJson lp;
    ChoiceExtras ex;
    if (g->num_logprobs >= 0) {
      lp = completion_logprobs_json(p.logprobs, *offset);
      ex.logprobs = &lp;
    }
    if (token_ids) ex.token_ids = &p.token_ids;
    const bool is_first = *first;
    *first = false;
    *offset += static_cast<int64_t>(p.text.size());
    return sse_event(text_completion_chunk_json(meta, p.text, std::nullopt, ex, nullptr,
                                                is_first && token_ids ? &g->er->prompt : nullptr));
  };
  fns.closing = [g, meta, include_usage] {
    std::string out = sse_event(text_completion_chunk_json(meta, "", ChoiceEnd{g->finish_reason, g->stop_reason}));
    if (include_usage) out += sse_event(text_completion_usage_chunk_json(meta, usage_of(*g)));
    return out + std::string(kSseDone);
  };
  run_to_stream(ctx, g, res, std::move(fns));
}

// ---- /tokenize, /detokenize ----------------------------------------------------------------

void handle_tokenize(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_tokenize_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  TokenizeRequest& r = *parsed;
  std::vector<int32_t> ids;
  if (!r.messages.is_null()) {
    if (!ctx.chat_template) return send_error(*res, no_chat_template(ctx));
    auto enc = encode_chat(ctx, r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
    if (!enc.ok()) return send_error(*res, enc.error());
    ids = std::move(enc->ids);
  } else {
    auto enc = encode_text(ctx, r.prompt.value_or(""), r.add_special_tokens, "prompt");
    if (!enc.ok()) return send_error(*res, enc.error());
    ids = std::move(*enc);
  }
  if (static_cast<int64_t>(ids.size()) > ctx.info.max_model_len)
    return send_error(*res, bad_request("the prompt has " + std::to_string(ids.size()) +
                                            " tokens, more than max_model_len (" + std::to_string(ctx.info.max_model_len) +
                                            "); /tokenize returns at most that many", r.messages.is_null() ? "prompt" : "messages"));
  std::vector<std::string> strs;
  if (r.return_token_strs)
    for (int32_t id : ids) strs.push_back(ctx.tokenizer->id_to_token(id).value_or(""));
  send_json(*res, tokenize_response_json(ids, ctx.info.max_model_len, r.return_token_strs ? &strs : nullptr));
}

void handle_detokenize(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_detokenize_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  std::string bytes = ctx.tokenizer->decode(parsed->tokens);
  send_json(*res, detokenize_response_json(decode_utf8_replace(bytes, true)));
}

}  // namespace

std::string transport_error_body(int status, std::string_view message) {
  std::string type = status == 413 ? "RequestEntityTooLargeError"
                     : status == 503 ? "ServiceUnavailableError"
                     : status >= 500 ? "InternalServerError"
                                     : "BadRequestError";
  return serialize_json(error_json(ApiError{status, std::move(type), std::string(message), std::nullopt}));
}

http::Router make_router(ServeContext& ctx) {
  http::Router router;
  router.set_filter([&ctx](const http::Request& req, Responder& res) {
    const bool open_route = req.path == "/health" || req.path == "/metrics";
    if (!ctx.api_key.empty() && !open_route && !api_key_matches(req.header("Authorization"), ctx.api_key)) {
      send_error(res, ApiError{401, "AuthenticationError",
                               "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                               std::nullopt});
      return true;
    }
    if (ctx.shutting_down.load() && req.path != "/metrics") {
      send_error(res, shutdown_error());
      return true;
    }
    return false;
  });
  router.set_not_found([](const http::Request& req, Responder& res, int status, std::string_view allowed) {
    if (status == 404)
      return send_error(res, ApiError{404, "NotFoundError", "no route for " + req.method + " " + req.path, std::nullopt});
    send_error(res, ApiError{405, "MethodNotAllowed", "method " + req.method + " not allowed on " + req.path, std::nullopt},
               {{"Allow", std::string(allowed)}});
  });
  using http::Run;
  router.add("GET", "/health", [](const http::Request&, ResponderPtr res) { res->send(200, "", ""); }, Run::kInline);
  router.add("GET", "/metrics", [&ctx](const http::Request&, ResponderPtr res) {
    res->send(200, "text/plain; version=0.0.4; charset=utf-8", ctx.metrics->render());
  }, Run::kInline);
  router.add("GET", "/v1/models", [&ctx](const http::Request&, ResponderPtr res) {
    send_json(*res, models_list_json(ctx.info.names, ctx.model_root, ctx.info.max_model_len, unix_time_seconds()));
  }, Run::kInline);
  router.add("POST", "/v1/chat/completions", [&ctx](const http::Request& req, ResponderPtr res) { handle_chat(ctx, req, std::move(res)); });
  router.add("POST", "/v1/completions", [&ctx](const http::Request& req, ResponderPtr res) { handle_completion(ctx, req, std::move(res)); });
  router.add("POST", "/tokenize", [&ctx](const http::Request& req, ResponderPtr res) { handle_tokenize(ctx, req, std::move(res)); });
  router.add("POST", "/detokenize", [&ctx](const http::Request& req, ResponderPtr res) { handle_detokenize(ctx, req, std::move(res)); });
  return router;
}

}  // namespace sparkserve
