#include "server/handlers.h"

#include <atomic>
#include <chrono>
#include <memory>

#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/peer_socket.h"
#include "server/sse.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"

namespace sparkserve {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<uint64_t> g_next_request_id{1};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(serialize_json(error_json(e)), "application/json");
}

void send_json(httplib::Response& res, const ResponseJson& j) {
  res.status = 200;
  res.set_content(serialize_json(j), "application/json");
}

std::string token_text(const Tokenizer& tok, int32_t id) {
  return decode_utf8_replace(tok.token_bytes(id), true);
}

// Everything one generation needs on the HTTP side: the engine request and the text pipeline
// its tokens go through. Destroying it cancels the engine request (a client that went away
// frees its slot and blocks at the engine's next step).
struct Generation {
  std::shared_ptr<EngineRequest> er;
  std::unique_ptr<StreamingDetokenizer> detok;
  std::unique_ptr<StreamingOutputParser> parser;  // chat only
  bool include_reasoning = true;
  int num_logprobs = -1;
  std::vector<int32_t> token_ids;    // generated
  int64_t cached_tokens = -1;        // prompt tokens the prefix cache supplied (engine's first token)
  std::string text;                  // detokenized (completions)
  std::vector<TokenLogprobs> logprobs;
  bool done = false;
  std::string finish_reason;
  ResponseJson stop_reason = nullptr;
  std::optional<ApiError> error;
  Clock::time_point start = Clock::now();

  ~Generation() {
    if (er) er->cancelled.store(true);
  }
};

// New text / token pieces since the last call, for one chunk.
struct Piece {
  std::string text;
  OutputDelta delta;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;
};

void add_text(Generation& g, const std::string& t, Piece& p) {
  if (t.empty()) return;
  p.text += t;
  g.text += t;
  if (g.parser) {
    OutputDelta d = g.parser->feed(t);
    p.delta.reasoning += d.reasoning;
    p.delta.content += d.content;
    for (auto& c : d.tool_calls) p.delta.tool_calls.push_back(std::move(c));
  }
}

void end_text(Generation& g, Piece& p) {
  add_text(g, g.detok->finish().text, p);
  if (g.parser) {
    OutputDelta d = g.parser->finish();
    p.delta.reasoning += d.reasoning;
    p.delta.content += d.content;
    for (auto& c : d.tool_calls) p.delta.tool_calls.push_back(std::move(c));
  }
}

// Drains engine events into `p` until something arrived or `wait` passed. Sets g.done at the end.
void pump(Generation& g, const Tokenizer& tok, double timeout_s, std::chrono::milliseconds wait, Piece& p) {
  if (g.done) return;
  auto events = g.er->out.pop_all(wait);
  for (auto& ev : events) {
    if (g.done) break;
    if (!ev.finished) {
      if (ev.num_cached_tokens >= 0) g.cached_tokens = ev.num_cached_tokens;
      g.token_ids.push_back(ev.token);
      p.token_ids.push_back(ev.token);
      if (g.num_logprobs >= 0 && ev.sample.logprob) {
        TokenLogprobs lp;
        lp.chosen = {token_text(tok, ev.token), *ev.sample.logprob};
        for (const auto& t : ev.sample.top) lp.top.push_back({token_text(tok, t.token), t.logprob});
        g.logprobs.push_back(lp);
        p.logprobs.push_back(std::move(lp));
      }
      DetokenizerStep st = g.detok->push(ev.token);
      add_text(g, st.text, p);
      if (st.stopped) {
        g.er->stopped_by_string.store(true);
        g.er->cancelled.store(true);  // the engine frees it; its final event is ignored
        g.finish_reason = "stop";
        g.stop_reason = st.stop_string;
        end_text(g, p);
        g.done = true;
      }
      continue;
    }
    if (ev.finish_reason == "error") g.error = internal_error("generation failed: " + ev.error);
    g.finish_reason = ev.finish_reason;
    if (ev.stop_token) g.stop_reason = *ev.stop_token;
    end_text(g, p);
    g.done = true;
  }
  if (!g.done && timeout_s > 0 &&
      std::chrono::duration<double>(Clock::now() - g.start).count() > timeout_s) {
    g.er->cancelled.store(true);
    g.finish_reason = "abort";
    end_text(g, p);
    g.done = true;
  }
}

ChatDelta to_chat_delta(const Generation& g, const OutputDelta& d) {
  ChatDelta cd;
  if (!d.content.empty()) cd.content = d.content;
  if (!d.reasoning.empty() && g.include_reasoning) cd.reasoning = d.reasoning;
  for (const auto& c : d.tool_calls) cd.tool_calls.push_back(c.to_openai());
  return cd;
}

bool authorized(const ServeContext& ctx, const httplib::Request& req) {
  if (ctx.api_key.empty()) return true;
  if (req.path == "/health" || req.path == "/metrics") return true;
  return req.get_header_value("Authorization") == "Bearer " + ctx.api_key;
}

// Chat messages rendered with the model's chat template (ctx.chat_template must be set), then
// tokenized. Errors are 400s on "messages". generation_prompt_start (optional): where the
// template's generation prompt begins in the ids (-1 when there is none or it cannot be told), the
// point from which the next turn of the conversation renders this turn's reply differently.
ApiResult<std::vector<int32_t>> encode_chat(const ServeContext& ctx, const RequestJson& messages,
                                            const RequestJson& tools, bool add_generation_prompt,
                                            const RequestJson& chat_template_kwargs,
                                            int64_t* generation_prompt_start = nullptr) {
  OrderedJson tmpl_req = OrderedJson::object();
  tmpl_req["messages"] = messages;
  if (!tools.is_null()) tmpl_req["tools"] = tools;
  tmpl_req["add_generation_prompt"] = add_generation_prompt;
  tmpl_req["chat_template_kwargs"] = chat_template_kwargs;
  auto rendered = render_chat_request(*ctx.chat_template, tmpl_req);
  if (!rendered.ok()) return bad_request("chat template: " + rendered.message(), "messages");
  auto ids = ctx.tokenizer->encode(*rendered);
  if (!ids.ok()) return bad_request(ids.message(), "messages");
  if (generation_prompt_start) {
    *generation_prompt_start = -1;
    tmpl_req["add_generation_prompt"] = false;
    auto bare = add_generation_prompt ? render_chat_request(*ctx.chat_template, tmpl_req) : rendered;
    // The suffix alone tokenizes as it does inside the prompt when it starts with a special token
    // (e.g. <|im_start|>); otherwise the count may be off by a merge, which only moves the hint.
    if (bare.ok() && rendered->size() > bare->size() && rendered->compare(0, bare->size(), *bare) == 0)
      if (auto suffix = ctx.tokenizer->encode(std::string_view(*rendered).substr(bare->size())); suffix.ok())
        *generation_prompt_start = static_cast<int64_t>(ids->size()) - static_cast<int64_t>(suffix->size());
  }
  return std::vector<int32_t>(ids->begin(), ids->end());
}

struct Prepared {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Shared by chat and completions: context-length check, sampling parameters.
ApiResult<Prepared> prepare(const ServeContext& ctx, const GenerationRequest& r, std::vector<int32_t> prompt) {
  auto budget = check_context_length(static_cast<int64_t>(prompt.size()), r.sampling.max_tokens, ctx.info.max_model_len);
  if (!budget.ok()) return budget.error();
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

constexpr auto kPoll = std::chrono::milliseconds(100);

// Non-streaming: wait for the whole output on this HTTP thread. A client that closed its
// connection meanwhile cancels the request (its slot and blocks are freed at the next step).
// False when the generation failed; the error response is then already set.
bool wait_all(ServeContext& ctx, const httplib::Request& req, Generation& g, httplib::Response& res) {
  const int fd = find_connection_socket(req.local_port, req.remote_addr, req.remote_port);
  Piece all;
  while (!g.done) {
    if (ctx.shutting_down.load()) g.er->cancelled.store(true);
    if (peer_closed(fd)) {
      g.er->cancelled.store(true);
      g.finish_reason = "abort";
      g.done = true;
      return true;  // nobody reads the response
    }
    pump(g, *ctx.tokenizer, ctx.request_timeout_s, kPoll, all);
  }
  if (!g.error) return true;
  send_error(res, *g.error);
  return false;
}

// Writes SSE text; a failed write means the client is gone, which cancels the request.
bool sse_write(Generation& g, httplib::DataSink& sink, const std::string& s) {
  if (sink.write(s.data(), s.size())) return true;
  g.er->cancelled.store(true);
  return false;
}

enum class Streamed { kEnded, kFailed, kGone };

// Drains a generation into SSE events until it ends: `chunk(piece)` gives one piece's event
// ("" when there is nothing to send). kFailed: a generation error was sent as an SSE error
// plus [DONE]; kGone: the client went away (the request is cancelled).
template <class ChunkFn>
Streamed stream_pieces(ServeContext& ctx, Generation& g, httplib::DataSink& sink, ChunkFn chunk) {
  while (!g.done) {
    if (ctx.shutting_down.load()) g.er->cancelled.store(true);
    Piece p;
    pump(g, *ctx.tokenizer, ctx.request_timeout_s, kPoll, p);
    if (g.error) {
      sse_write(g, sink, sse_error_and_done(*g.error));
      sink.done();
      return Streamed::kFailed;
    }
    const std::string event = chunk(p);
    if (!event.empty()) {
      if (!sse_write(g, sink, event)) return Streamed::kGone;
    } else if (!sink.is_writable()) {
      g.er->cancelled.store(true);
      return Streamed::kGone;
    }
  }
  return Streamed::kEnded;
}

// The closing events of a stream: the finishing chunk, the usage chunk when asked, [DONE].
bool end_stream(Generation& g, httplib::DataSink& sink, const ResponseJson& last,
                const std::optional<ResponseJson>& usage) {
  if (!sse_write(g, sink, sse_event(last))) return false;
  if (usage && !sse_write(g, sink, sse_event(*usage))) return false;
  if (!sse_write(g, sink, std::string(kSseDone))) return false;
  sink.done();
  return true;
}

// ---- /v1/chat/completions ------------------------------------------------------------------

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

void handle_chat(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto parsed = parse_chat_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(res, parsed.error());
  ChatRequest& r = *parsed;
  if (r.continue_final_message)
    return send_error(res, bad_request("continue_final_message is not supported yet", "continue_final_message"));
  if (!ctx.chat_template)
    return send_error(res, bad_request("this model folder has no chat template (chat_template.jinja or tokenizer_config.json); use /v1/completions", "messages"));
  int64_t generation_prompt_start = -1;
  auto prompt = encode_chat(ctx, r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs,
                            &generation_prompt_start);
  if (!prompt.ok()) return send_error(res, prompt.error());
  auto prep = prepare(ctx, r, std::move(*prompt));
  if (!prep.ok()) return send_error(res, prep.error());

  auto et = r.chat_template_kwargs.find("enable_thinking");
  const bool thinking = !(et != r.chat_template_kwargs.end() && et->is_boolean() && !et->get<bool>());
  auto constraint = tool_call_constraint(ctx, r, prep->params, thinking);
  if (!constraint.ok()) return send_error(res, constraint.error());

  std::shared_ptr<Generation> g = start_generation(ctx, r, std::move(*prep));
  g->er->constraint = std::move(*constraint);
  if (generation_prompt_start > 0) g->er->snapshot_hints.push_back(generation_prompt_start);
  OutputParserOptions popt;
  popt.thinking_enabled = thinking;
  popt.parse_tools = !r.tools.is_null() && r.tool_choice != ToolChoice::kNone;
  if (popt.parse_tools) popt.tool_schemas = ToolSchemas::from_openai_tools(r.tools);
  g->parser = std::make_unique<StreamingOutputParser>(std::move(popt));
  g->include_reasoning = r.include_reasoning;
  ResponseMeta meta{make_response_id("chatcmpl-"), unix_time_seconds(), ctx.info.names.front()};
  const bool want_logprobs = r.logprobs;
  const bool token_ids = r.return_token_ids;
  ctx.engine->submit(g->er);

  if (!r.stream) {
    if (!wait_all(ctx, req, *g, res)) return;
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
    return send_json(res, chat_completion_json(meta, msg, end, usage_of(*g), ex,
                                               token_ids ? &g->er->prompt : nullptr));
  }

  const bool include_usage = r.include_usage;
  auto first = std::make_shared<bool>(true);
  auto any_tool_call = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, g, meta, first, any_tool_call, want_logprobs, token_ids, include_usage](size_t, httplib::DataSink& sink) {
        // The role chunk goes out with the first generated piece, not before the prefill (as vLLM
        // does): clients such as llama-benchy time the prefill up to the first chunk.
        auto with_role = [&](std::string event) {
          if (!*first) return event;
          *first = false;
          ChatDelta role;
          role.role = true;
          role.content = "";
          return sse_event(chat_chunk_json(meta, role, std::nullopt, {}, nullptr,
                                           token_ids ? &g->er->prompt : nullptr)) + event;
        };
        const Streamed st = stream_pieces(ctx, *g, sink, [&](const Piece& p) {
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
        });
        if (st != Streamed::kEnded) return st == Streamed::kFailed;
        if (*first && !sse_write(*g, sink, with_role(std::string()))) return false;
        ChoiceEnd end{*any_tool_call ? std::string("tool_calls") : g->finish_reason, g->stop_reason};
        return end_stream(*g, sink, chat_chunk_json(meta, ChatDelta{}, end),
                          include_usage ? std::optional(chat_usage_chunk_json(meta, usage_of(*g))) : std::nullopt);
      },
      [g](bool) { g->er->cancelled.store(true); });
}

// ---- /v1/completions -----------------------------------------------------------------------

void handle_completion(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto parsed = parse_completion_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(res, parsed.error());
  CompletionRequest& r = *parsed;
  if (r.echo) return send_error(res, bad_request("echo is not supported yet", "echo"));
  std::vector<int32_t> prompt;
  if (r.prompt_tokens) {
    prompt = *r.prompt_tokens;
  } else {
    auto ids = ctx.tokenizer->encode(*r.prompt_text);
    if (!ids.ok()) return send_error(res, bad_request(ids.message(), "prompt"));
    if (r.add_special_tokens && ctx.tokenizer->add_bos_token())
      if (auto bos = ctx.tokenizer->bos_token_id()) prompt.push_back(*bos);
    prompt.insert(prompt.end(), ids->begin(), ids->end());
  }
  if (prompt.empty()) return send_error(res, bad_request("prompt is empty", "prompt"));
  auto prep = prepare(ctx, r, std::move(prompt));
  if (!prep.ok()) return send_error(res, prep.error());
  std::shared_ptr<Generation> g = start_generation(ctx, r, std::move(*prep));
  ResponseMeta meta{make_response_id("cmpl-"), unix_time_seconds(), ctx.info.names.front()};
  const bool token_ids = r.return_token_ids;
  ctx.engine->submit(g->er);

  if (!r.stream) {
    if (!wait_all(ctx, req, *g, res)) return;
    ResponseJson lp;
    ChoiceExtras ex;
    if (g->num_logprobs >= 0) {
      lp = completion_logprobs_json(g->logprobs);
      ex.logprobs = &lp;
    }
    if (token_ids) ex.token_ids = &g->token_ids;
    return send_json(res, text_completion_json(meta, g->text, ChoiceEnd{g->finish_reason, g->stop_reason},
                                               usage_of(*g), ex, token_ids ? &g->er->prompt : nullptr));
  }
  const bool include_usage = r.include_usage;
  auto first = std::make_shared<bool>(true);
  auto offset = std::make_shared<int64_t>(0);
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, g, meta, first, offset, token_ids, include_usage](size_t, httplib::DataSink& sink) {
        const Streamed st = stream_pieces(ctx, *g, sink, [&](const Piece& p) {
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
        });
        if (st != Streamed::kEnded) return st == Streamed::kFailed;
        return end_stream(*g, sink, text_completion_chunk_json(meta, "", ChoiceEnd{g->finish_reason, g->stop_reason}),
                          include_usage ? std::optional(text_completion_usage_chunk_json(meta, usage_of(*g)))
                                        : std::nullopt);
      },
      [g](bool) { g->er->cancelled.store(true); });
}

// ---- /tokenize, /detokenize ----------------------------------------------------------------

void handle_tokenize(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto parsed = parse_tokenize_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(res, parsed.error());
  TokenizeRequest& r = *parsed;
  std::vector<int32_t> ids;
  if (!r.messages.is_null()) {
    if (!ctx.chat_template)
      return send_error(res, bad_request("this model folder has no chat template", "messages"));
    auto enc = encode_chat(ctx, r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs);
    if (!enc.ok()) return send_error(res, enc.error());
    ids = std::move(*enc);
  } else {
    auto enc = ctx.tokenizer->encode(r.prompt.value_or(""));
    if (!enc.ok()) return send_error(res, bad_request(enc.message(), "prompt"));
    if (r.add_special_tokens && ctx.tokenizer->add_bos_token())
      if (auto bos = ctx.tokenizer->bos_token_id()) ids.push_back(*bos);
    ids.insert(ids.end(), enc->begin(), enc->end());
  }
  std::vector<std::string> strs;
  if (r.return_token_strs)
    for (int32_t id : ids) strs.push_back(ctx.tokenizer->id_to_token(id).value_or(""));
  send_json(res, tokenize_response_json(ids, ctx.info.max_model_len, r.return_token_strs ? &strs : nullptr));
}

void handle_detokenize(ServeContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto parsed = parse_detokenize_request(req.body, ctx.info);
  if (!parsed.ok()) return send_error(res, parsed.error());
  std::string bytes = ctx.tokenizer->decode(parsed->tokens);
  send_json(res, detokenize_response_json(decode_utf8_replace(bytes, true)));
}

}  // namespace

void install_handlers(httplib::Server& svr, ServeContext& ctx) {
  svr.set_payload_max_length(ctx.max_body_bytes);
  svr.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(ctx, req)) {
      send_error(res, ApiError{401, "AuthenticationError",
                               "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                               std::nullopt});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (ctx.shutting_down.load() && req.path != "/health" && req.path != "/metrics") {
      send_error(res, engine_unavailable("the server is shutting down"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib answers some errors itself (413 over the body limit, 404 unknown path, 400 bad
  // framing) with an empty body: give them OpenAI error objects.
  svr.set_error_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      uint64_t n = 0;
      try {
        n = std::stoull(req.get_header_value("Content-Length"));
      } catch (...) {
      }
      return send_error(res, body_too_large(n, ctx.max_body_bytes));
    }
    if (res.status == 404)
      return send_error(res, ApiError{404, "NotFoundError", "no route for " + req.method + " " + req.path, std::nullopt});
    if (res.status == 405)
      return send_error(res, ApiError{405, "MethodNotAllowed", "method " + req.method + " not allowed on " + req.path, std::nullopt});
    const int status = res.status;
    send_error(res, ApiError{status, status >= 500 ? "InternalServerError" : "BadRequestError",
                             "HTTP " + std::to_string(status), std::nullopt});
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, internal_error(what));
  });

  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  svr.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ctx.metrics->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  svr.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    send_json(res, models_list_json(ctx.info.names, ctx.model_root, ctx.info.max_model_len, unix_time_seconds()));
  });
  svr.Post("/v1/chat/completions",
           [&ctx](const httplib::Request& req, httplib::Response& res) { handle_chat(ctx, req, res); });
  svr.Post("/v1/completions",
           [&ctx](const httplib::Request& req, httplib::Response& res) { handle_completion(ctx, req, res); });
  svr.Post("/tokenize", [&ctx](const httplib::Request& req, httplib::Response& res) { handle_tokenize(ctx, req, res); });
  svr.Post("/detokenize",
           [&ctx](const httplib::Request& req, httplib::Response& res) { handle_detokenize(ctx, req, res); });
}

}  // namespace sparkserve
