#include "server/handlers.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "server/api_error.h"
#include "server/anthropic_api.h"
#include "server/api_key.h"
#include "server/openai_response.h"
#include "server/request_log.h"
#include "server/route_util.h"
#include "server/routes.h"
#include "server/sse.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"

namespace sparkserve {
namespace {

using http::Responder;

std::string token_text(const Tokenizer& tok, int32_t id) { return decode_utf8_replace(tok.token_bytes(id), true); }

ChatDelta to_chat_delta(const Generation& g, const OutputDelta& d) {
  ChatDelta cd;
  if (!d.content.empty()) cd.content = d.content;
  if (!d.reasoning.empty() && g.include_reasoning) cd.reasoning = d.reasoning;
  for (const auto& c : d.tool_calls) cd.tool_calls.push_back(c.to_openai());
  return cd;
}

void send_overloaded(Responder& res, const ApiError& e) { send_error(res, e, error_headers(e)); }

void note_id(Responder& res, const std::string& id) {
  if (auto* log = request_log(res)) log->update([&](RequestRecord& r) { r.id = id; });
}

// ---- /v1/chat/completions ------------------------------------------------------------------

void handle_chat(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_chat_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  ChatRequest& r = *parsed;
  if (auto busy = overloaded(ctx)) return send_overloaded(*res, *busy);
  auto started = start_chat(ctx, r);
  if (!started.ok()) return send_error(*res, started.error());
  std::vector<GenerationPtr> gens = std::move(*started);
  ResponseMeta meta{make_response_id("chatcmpl-"), unix_time_seconds(), ctx.info.names.front()};
  note_id(*res, meta.id);
  const bool want_logprobs = r.logprobs;
  const bool token_ids = r.return_token_ids;

  if (!r.stream) {
    return run_to_json(ctx, gens, res, [gens, res, meta, want_logprobs, token_ids] {
      std::vector<ResponseJson> choices;
      for (const auto& g : gens) {
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
        choices.push_back(chat_completion_json(meta, msg, end, UsageInfo{}, ex, token_ids ? &g->er->prompt : nullptr));
      }
      send_json(*res, merge_choices(std::move(choices), usage_of(gens)));
    });
  }

  const bool include_usage = r.include_usage;
  struct ChoiceState {
    std::once_flag role_built;
    std::string role_event;
    bool first = true;
    bool any_tool_call = false;
  };
  auto states = std::make_shared<std::vector<ChoiceState>>(gens.size());
  // The role chunk of a choice goes out with its first generated piece, not before the prefill
  // (as vLLM does): clients such as llama-benchy time the prefill up to the first chunk. It is
  // built while the engine runs the prompt (below, after run_to_stream submitted it): with
  // return_token_ids it holds every prompt id (~80 KB of JSON for a 12K-token prompt, ~0.3 ms).
  auto role_event = [gens, meta, states, token_ids](size_t i) -> std::string& {
    ChoiceState& st = (*states)[i];
    std::call_once(st.role_built, [&] {
      ChatDelta role;
      role.role = true;
      role.content = "";
      st.role_event = sse_event(with_choice_index(
          chat_chunk_json(meta, role, std::nullopt, {}, nullptr, token_ids ? &gens[i]->er->prompt : nullptr), i));
    });
    return st.role_event;
  };
  auto with_role = [states, role_event](size_t i, std::string event) {
    ChoiceState& st = (*states)[i];
    if (!st.first) return event;
    st.first = false;
    return std::move(role_event(i)) + event;
  };
  StreamFns fns;
  fns.chunk = [gens, meta, with_role, states, want_logprobs, token_ids](size_t i, const Piece& p) {
    ChatDelta d = to_chat_delta(*gens[i], p.delta);
    if (!d.tool_calls.empty()) (*states)[i].any_tool_call = true;
    const bool has_delta = d.content || d.reasoning || !d.tool_calls.empty();
    if (!has_delta && (p.token_ids.empty() || (!token_ids && !want_logprobs))) return std::string();
    ResponseJson lp;
    ChoiceExtras ex;
    if (want_logprobs) {
      lp = chat_logprobs_json(p.logprobs);
      ex.logprobs = &lp;
    }
    if (token_ids) ex.token_ids = &p.token_ids;
    return with_role(i, sse_event(with_choice_index(chat_chunk_json(meta, d, std::nullopt, ex), i)));
  };
  fns.closing = [gens, meta, with_role, states, include_usage] {
    std::string out;
    for (size_t i = 0; i < gens.size(); ++i) {
      out += with_role(i, std::string());
      ChoiceEnd end{(*states)[i].any_tool_call ? std::string("tool_calls") : gens[i]->finish_reason, gens[i]->stop_reason};
      out += sse_event(with_choice_index(chat_chunk_json(meta, ChatDelta{}, end), i));
    }
    if (include_usage) out += sse_event(chat_usage_chunk_json(meta, usage_of(gens)));
    return out + std::string(kSseDone);
  };
  run_to_stream(ctx, gens, res, std::move(fns));
  for (size_t i = 0; i < gens.size(); ++i) role_event(i);
}

// ---- /v1/completions -----------------------------------------------------------------------

// The echoed prompt of a completion: its text and token texts.
struct Echo {
  std::string text;
  std::vector<std::string> tokens;
};

Echo echo_of(const ServeContext& ctx, const CompletionRequest::Prompt& p, const std::vector<int32_t>& ids) {
  Echo e;
  e.text = p.text ? *p.text : decode_utf8_replace(ctx.tokenizer->decode(ids), true);
  for (int32_t id : ids) e.tokens.push_back(token_text(*ctx.tokenizer, id));
  return e;
}

std::vector<TokenLogprobs> prompt_logprobs_of(const ServeContext& ctx, const Generation& g) {
  std::vector<TokenLogprobs> out;
  for (const PromptLogprob& p : g.prompt_logprobs) {
    TokenLogprobs t;
    t.chosen = {token_text(*ctx.tokenizer, p.lp.token), p.lp.logprob.value_or(0.0f)};
    for (const auto& x : p.lp.top) t.top.push_back({token_text(*ctx.tokenizer, x.token), x.logprob});
    out.push_back(std::move(t));
  }
  return out;
}

void handle_completion(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_completion_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(*res, parsed.error());
  CompletionRequest& r = *parsed;
  if (auto busy = overloaded(ctx)) return send_overloaded(*res, *busy);
  auto started = start_completion(ctx, r);
  if (!started.ok()) return send_error(*res, started.error());
  std::vector<GenerationPtr> gens = std::move(*started);
  const auto per_prompt = static_cast<size_t>(r.n);
  auto echoes = std::make_shared<std::vector<Echo>>();
  if (r.echo)
    for (size_t i = 0; i < gens.size(); ++i)
      echoes->push_back(echo_of(ctx, r.prompts[i / per_prompt], gens[i]->er->prompt));
  ResponseMeta meta{make_response_id("cmpl-"), unix_time_seconds(), ctx.info.names.front()};
  note_id(*res, meta.id);
  const bool token_ids = r.return_token_ids;
  const bool echo = r.echo;
  const ServeContext* cp = &ctx;

  if (!r.stream) {
    return run_to_json(ctx, gens, res, [cp, gens, res, meta, token_ids, echo, echoes, per_prompt] {
      std::vector<ResponseJson> choices;
      for (size_t i = 0; i < gens.size(); ++i) {
        const Generation& g = *gens[i];
        ResponseJson lp;
        ChoiceExtras ex;
        if (g.num_logprobs >= 0) {
          lp = echo ? echo_logprobs_json((*echoes)[i].tokens, prompt_logprobs_of(*cp, g), g.logprobs)
                    : completion_logprobs_json(g.logprobs);
          ex.logprobs = &lp;
        }
        if (token_ids) ex.token_ids = &g.token_ids;
        const std::string text = echo ? (*echoes)[i].text + g.text : g.text;
        choices.push_back(text_completion_json(meta, text, ChoiceEnd{g.finish_reason, g.stop_reason}, UsageInfo{}, ex,
                                               token_ids ? &g.er->prompt : nullptr));
      }
      send_json(*res, merge_choices(std::move(choices), usage_of(gens, per_prompt)));
    });
  }
  const bool include_usage = r.include_usage;
  struct ChoiceState {
    bool first = true;
    int64_t offset = 0;
  };
  auto states = std::make_shared<std::vector<ChoiceState>>(gens.size());
  StreamFns fns;
  fns.chunk = [cp, gens, meta, states, token_ids, echo, echoes](size_t i, const Piece& p) {
    const Generation& g = *gens[i];
    ChoiceState& st = (*states)[i];
    std::string out;
    // The echoed prompt goes first, once its logprobs are complete (they all arrive before the
    // first generated token).
    if (echo && st.first && !(g.first_token || g.done)) return out;
    if (p.text.empty() && !(echo && st.first) && (p.token_ids.empty() || (!token_ids && g.num_logprobs < 0)))
      return out;
    ResponseJson lp;
    ChoiceExtras ex;
    std::string text = p.text;
    if (g.num_logprobs >= 0) {
      lp = echo && st.first ? echo_logprobs_json((*echoes)[i].tokens, prompt_logprobs_of(*cp, g), p.logprobs)
                            : completion_logprobs_json(p.logprobs, st.offset);
      ex.logprobs = &lp;
    }
    if (echo && st.first) text = (*echoes)[i].text + text;
    if (token_ids) ex.token_ids = &p.token_ids;
    const bool is_first = st.first;
    st.first = false;
    st.offset += static_cast<int64_t>(text.size());
    return sse_event(with_choice_index(text_completion_chunk_json(meta, text, std::nullopt, ex, nullptr,
                                                                  is_first && token_ids ? &g.er->prompt : nullptr),
                                       i));
  };
  fns.closing = [gens, meta, include_usage, per_prompt] {
    std::string out;
    for (size_t i = 0; i < gens.size(); ++i)
      out += sse_event(with_choice_index(
          text_completion_chunk_json(meta, "", ChoiceEnd{gens[i]->finish_reason, gens[i]->stop_reason}), i));
    if (include_usage) out += sse_event(text_completion_usage_chunk_json(meta, usage_of(gens, per_prompt)));
    return out + std::string(kSseDone);
  };
  run_to_stream(ctx, gens, res, std::move(fns));
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
    if (apply_cors(ctx.cors, req, res)) return true;  // a preflight, answered
    const bool open_route = req.path == "/health" || req.path == "/metrics" || req.path == "/";
    if (!ctx.api_key.empty() && !open_route && !api_key_matches(req.header("Authorization"), ctx.api_key)) {
      // Anthropic clients send the key as x-api-key.
      const auto x = req.header("x-api-key");
      if (!x || !constant_time_equals(*x, ctx.api_key)) {
        const ApiError e{401, "AuthenticationError",
                         "missing or invalid API key: send the header 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                         std::nullopt};
        if (req.path.rfind("/v1/messages", 0) == 0)
          res.send(401, "application/json", serialize_json(anthropic_error_json(e)));
        else
          send_error(res, e);
        return true;
      }
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
  // Every API route logs one line when it is answered (logged_handler).
  auto add = [&router](const char* method, const char* path, http::Handler h, Run run = Run::kWorker) {
    router.add(method, path, logged_handler(method, path, std::move(h)), run);
  };
  add("GET", "/v1/models", [&ctx](const http::Request&, ResponderPtr res) {
    send_json(*res, models_list_json(ctx.info.names, ctx.model_root, ctx.info.max_model_len, unix_time_seconds()));
  }, Run::kInline);
  add("POST", "/v1/chat/completions", [&ctx](const http::Request& req, ResponderPtr res) { handle_chat(ctx, req, std::move(res)); });
  add("POST", "/v1/completions", [&ctx](const http::Request& req, ResponderPtr res) { handle_completion(ctx, req, std::move(res)); });
  add("POST", "/tokenize", [&ctx](const http::Request& req, ResponderPtr res) { handle_tokenize(ctx, req, std::move(res)); });
  add("POST", "/detokenize", [&ctx](const http::Request& req, ResponderPtr res) { handle_detokenize(ctx, req, std::move(res)); });
  const AddRoute add_route = [&add](const char* method, const char* path, http::Handler h, Run run) {
    add(method, path, std::move(h), run);
  };
  add_anthropic_routes(ctx, add_route);
  add_responses_routes(ctx, add_route);
  add_browser_routes(ctx, add_route);
  return router;
}

}  // namespace sparkserve
