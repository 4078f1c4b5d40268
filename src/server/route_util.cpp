#include "server/route_util.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "runtime/structured_constraint.h"
#include "server/request_log.h"
#include "server/sse.h"

namespace sparkserve {
namespace {

std::atomic<uint64_t> g_next_request_id{1};

struct Prepared {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Context-length check and sampling parameters, shared by every route.
ApiResult<Prepared> prepare(const ServeContext& ctx, const GenerationRequest& r, std::vector<int32_t> prompt) {
  if (prompt.empty()) return bad_request("the prompt is empty (the chat template rendered no tokens)", "messages");
  std::optional<int64_t> max_tokens = r.sampling.max_tokens;
  const int64_t left = ctx.info.max_model_len - static_cast<int64_t>(prompt.size());
  if (r.clamp_max_tokens && max_tokens && left >= 1 && *max_tokens > left) max_tokens = left;
  auto budget = check_context_length(static_cast<int64_t>(prompt.size()), max_tokens, ctx.info.max_model_len);
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

// Choice i of n: choice 0 as requested; the others of a seeded request with seed + i (an
// unseeded request draws a fresh seed per choice).
SamplingParams choice_params(const ServeContext& ctx, const GenerationRequest& r, const Prepared& p, int64_t i) {
  if (i == 0) return p.params;
  SamplingParams sp = p.params;
  if (r.sampling.seed) sp.seed = static_cast<uint64_t>(*r.sampling.seed) + static_cast<uint64_t>(i);
  else sp.seed = resolve_sampling_params(r.sampling, ctx.defaults, sp.max_tokens).seed;
  return sp;
}

GenerationPtr new_generation(ServeContext& ctx, const GenerationRequest& r, std::vector<int32_t> prompt,
                             SamplingParams params) {
  auto g = std::make_shared<Generation>();
  g->er = std::make_shared<EngineRequest>();
  g->er->id = g_next_request_id.fetch_add(1);
  g->er->prompt = std::move(prompt);
  g->er->params = std::move(params);
  if (r.num_speculative_tokens) g->er->num_speculative_tokens = *r.num_speculative_tokens;
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

std::vector<int32_t> end_ids_of(const SamplingParams& params) {
  std::vector<int32_t> end_ids = params.eos_token_ids;
  end_ids.insert(end_ids.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  return end_ids;
}

// The constraint of a request: tool_choice "required" / a named function (qwen3_coder tool
// calls, text/tool_call_grammar.h) or structured outputs; null when the output is free.
ApiResult<std::shared_ptr<TokenConstraint>> request_constraint(const ServeContext& ctx, const GenerationRequest& r,
                                                               const ChatRequest* chat, const SamplingParams& params,
                                                               bool thinking) {
  const bool tool_grammar = chat && (chat->tool_choice == ToolChoice::kRequired || chat->tool_choice == ToolChoice::kNamed);
  if (!tool_grammar && !r.structured.grammar) return std::shared_ptr<TokenConstraint>();
  if (tool_grammar && r.structured.grammar)
    return bad_request("`" + r.structured.param +
                           "` cannot be combined with tool_choice \"required\" or a named function: both constrain the "
                           "whole output.", r.structured.param);
  if (!ctx.vocab_texts) return internal_error("constrained decoding is not set up (no vocabulary texts)");
  if (params.min_tokens > 0)
    return bad_request(std::string("min_tokens cannot be combined with ") +
                           (tool_grammar ? "tool_choice \"required\" or a named function" : "structured outputs") +
                           " (the end of the constrained output would be masked)", "min_tokens");
  if (r.structured.grammar)
    return std::shared_ptr<TokenConstraint>(
        std::make_shared<StructuredConstraint>(r.structured.grammar, thinking, ctx.vocab_texts, end_ids_of(params)));
  ToolCallGrammarOptions gopt;
  gopt.thinking = thinking;
  gopt.parallel_tool_calls = chat->parallel_tool_calls;
  if (chat->tool_choice == ToolChoice::kNamed) gopt.only_function = chat->tool_choice_name;
  auto grammar = ToolCallGrammar::build(OrderedJson(chat->tools), gopt);
  if (!grammar.ok()) return bad_request("tool_choice: " + grammar.message(), "tools");
  return std::shared_ptr<TokenConstraint>(
      std::make_shared<ToolCallConstraint>(std::move(*grammar), ctx.vocab_texts, end_ids_of(params)));
}

// The log record of a finished run: tokens, first-token time, finish reason.
void record_run(http::Responder& res, const std::vector<GenerationPtr>& gens) {
  LoggedResponder* log = request_log(res);
  if (!log || gens.empty()) return;
  const UsageInfo u = usage_of(gens);
  std::optional<double> ttft;
  for (const auto& g : gens)
    if (g->first_token) {
      const double t = std::chrono::duration<double>(*g->first_token - g->start).count();
      if (!ttft || t < *ttft) ttft = t;
    }
  log->update([&](RequestRecord& r) {
    r.prompt_tokens = u.prompt_tokens;
    r.cached_tokens = u.cached_tokens.value_or(0);
    r.generated_tokens = u.completion_tokens;
    r.ttft_s = ttft;
    r.finish_reason = gens.front()->finish_reason;
  });
}

// One step of a set of generations: pumps each, collecting pieces. Returns the first error.
std::optional<ApiError> pump_all(ServeContext& ctx, std::vector<GenerationPtr>& gens, std::vector<Piece>* pieces) {
  for (size_t i = 0; i < gens.size(); ++i) {
    Piece p;
    pump(*gens[i], *ctx.tokenizer, ctx.request_timeout_s, p);
    if (gens[i]->error) return gens[i]->error;
    if (pieces) (*pieces)[i] = std::move(p);
  }
  return std::nullopt;
}

bool all_done(const std::vector<GenerationPtr>& gens) {
  for (const auto& g : gens)
    if (!g->done) return false;
  return true;
}

// Registers the job and wakes it on every generation's channel, then submits.
// The engine gets the requests before anything else is set up for them: it admits them and starts
// their prompts while this thread sends the stream head and registers the job.
void submit_to_engine(ServeContext& ctx, std::vector<GenerationPtr>& gens) {
  for (auto& g : gens) ctx.engine->submit(g->er);
}

// The job that steps `gens`, woken by every push to their channels. Its first step runs at once and
// takes what the engine pushed before the job existed; with several channels, one more runs after
// all of them wake it (a push between the first step and their set_on_push would wake nothing).
void add_job(ServeContext& ctx, std::vector<GenerationPtr>& gens, ResponderPtr res, std::function<bool()> step) {
  auto wake = ctx.jobs->add(gens.front()->er->out, std::move(step));
  for (size_t i = 1; i < gens.size(); ++i) gens[i]->er->out.set_on_push(wake);
  res->on_wake(wake);
  if (gens.size() > 1) wake();
}

}  // namespace

void send_error(http::Responder& res, const ApiError& e, std::vector<http::Header> extra) {
  res.send(e.status, "application/json", serialize_json(error_json(e)), std::move(extra));
}

std::vector<http::Header> error_headers(const ApiError& e) {
  if (e.status == 503) return {{"Retry-After", "1"}};
  return {};
}

void send_json(http::Responder& res, const ResponseJson& j) { res.send(200, "application/json", serialize_json(j)); }

ApiError shutdown_error() { return engine_unavailable("the server is shutting down"); }
ApiError drained_error() {
  return engine_unavailable("the server shut down before this request finished; retry it elsewhere or later");
}

ApiError no_chat_template(const ServeContext& ctx) {
  if (!ctx.chat_template_error.empty())
    return ApiError{500, "InternalServerError", "the model's chat template cannot be used: " + ctx.chat_template_error, "messages"};
  return bad_request("this model folder has no chat template (chat_template.jinja or tokenizer_config.json); use /v1/completions", "messages");
}

std::optional<ApiError> overloaded(const ServeContext& ctx) {
  if (ctx.shutting_down.load()) return shutdown_error();
  if (ctx.max_waiting_requests <= 0) return std::nullopt;
  const int64_t waiting = ctx.engine->stats().waiting;
  if (waiting < ctx.max_waiting_requests) return std::nullopt;
  return engine_unavailable("the server is overloaded: " + std::to_string(waiting) +
                            " requests are waiting (--max-waiting-requests " +
                            std::to_string(ctx.max_waiting_requests) + "); retry later");
}

std::optional<ApiError> over_context_bytes(const ServeContext& ctx, size_t bytes, const char* what, const char* param) {
  const uint64_t limit = static_cast<uint64_t>(ctx.info.max_model_len) * std::max<size_t>(ctx.max_token_bytes, 1) * 3;
  if (bytes <= limit) return std::nullopt;
  return bad_request(std::string(what) + " is " + std::to_string(bytes) + " bytes: more than the context can hold (max_model_len " +
                         std::to_string(ctx.info.max_model_len) + " tokens of at most " + std::to_string(ctx.max_token_bytes) +
                         " bytes each; requests over " + std::to_string(limit) + " bytes are refused before tokenizing)",
                     param);
}

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

ApiResult<ChatPrompt> encode_chat(const ServeContext& ctx, const RequestJson& messages, const RequestJson& tools,
                                  bool add_generation_prompt, const RequestJson& chat_template_kwargs,
                                  int64_t* generation_prompt_start) {
  auto images = load_chat_images(messages, ctx.image_input);
  if (!images.ok()) return images.error();
  // The template request, built for each render: the render takes its messages and tools.
  auto template_request = [&](bool with_generation_prompt) {
    OrderedJson r = OrderedJson::object();
    r["messages"] = messages;
    if (!tools.is_null()) r["tools"] = tools;
    r["add_generation_prompt"] = with_generation_prompt;
    r["chat_template_kwargs"] = chat_template_kwargs;
    return r;
  };
  auto rendered = render_chat_request(*ctx.chat_template, template_request(add_generation_prompt));
  if (!rendered.ok()) return bad_request("chat template " + ctx.chat_template->origin + ": " + rendered.message(), "messages");
  if (auto e = over_context_bytes(ctx, rendered->size(), "the rendered chat prompt", "messages")) return *e;
  auto ids = ctx.tokenizer->encode(*rendered);
  if (!ids.ok()) return bad_request(ids.message(), "messages");
  // Tokens of the generation prompt (the rendered suffix that add_generation_prompt appends):
  // remembered per request shape (generation_prompt_suffixes.h), else found by a second render.
  int64_t suffix_tokens = -1;
  if (generation_prompt_start && add_generation_prompt) {
    const std::string key = chat_template_kwargs.dump() + (tools.is_null() ? "|no tools" : "|tools");
    const std::string_view text(*rendered);
    if (auto known = ctx.generation_prompts.find(key);
        known && text.size() > known->text.size() && text.ends_with(known->text)) {
      suffix_tokens = known->tokens;
    } else {
      auto bare = render_chat_request(*ctx.chat_template, template_request(false));
      // The suffix alone tokenizes as it does inside the prompt when it starts with a special token
      // (e.g. <|im_start|>); otherwise the count may be off by a merge, which only moves the hint.
      if (bare.ok() && text.size() > bare->size() && text.compare(0, bare->size(), *bare) == 0)
        if (auto suffix = ctx.tokenizer->encode(text.substr(bare->size())); suffix.ok()) {
          suffix_tokens = static_cast<int64_t>(suffix->size());
          ctx.generation_prompts.put(key, {std::string(text.substr(bare->size())), suffix_tokens});
        }
    }
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

bool thinking_enabled(const RequestJson& kwargs) {
  auto et = kwargs.find("enable_thinking");
  return !(et != kwargs.end() && et->is_boolean() && !et->get<bool>());
}

ApiResult<std::vector<GenerationPtr>> start_chat(ServeContext& ctx, const ChatRequest& r) {
  if (r.continue_final_message)
    return bad_request("continue_final_message is not supported yet", "continue_final_message");
  if (!ctx.chat_template) return no_chat_template(ctx);
  int64_t generation_prompt_start = -1;
  auto prompt = encode_chat(ctx, r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs,
                            &generation_prompt_start);
  if (!prompt.ok()) return prompt.error();
  auto prep = prepare(ctx, r, std::move(prompt->ids));
  if (!prep.ok()) return prep.error();
  const bool thinking = thinking_enabled(r.chat_template_kwargs);
  std::vector<GenerationPtr> gens;
  for (int64_t i = 0; i < r.n; ++i) {
    SamplingParams sp = choice_params(ctx, r, *prep, i);
    auto constraint = request_constraint(ctx, r, &r, sp, thinking);
    if (!constraint.ok()) return constraint.error();
    GenerationPtr g = new_generation(ctx, r, prep->prompt, std::move(sp));
    g->er->constraint = std::move(*constraint);
    if (generation_prompt_start > 0) g->er->snapshot_hints.push_back(generation_prompt_start);
    g->er->mm = prompt->mm;
    OutputParserOptions popt;
    popt.thinking_enabled = thinking;
    popt.parse_tools = !r.tools.is_null() && r.tool_choice != ToolChoice::kNone;
    if (popt.parse_tools) popt.tool_schemas = ToolSchemas::from_openai_tools(r.tools);
    g->parser = std::make_unique<StreamingOutputParser>(std::move(popt));
    g->include_reasoning = r.include_reasoning;
    gens.push_back(std::move(g));
  }
  return gens;
}

ApiResult<std::vector<GenerationPtr>> start_completion(ServeContext& ctx, const CompletionRequest& r) {
  std::vector<GenerationPtr> gens;
  for (size_t k = 0; k < r.prompts.size(); ++k) {
    const auto& p = r.prompts[k];
    const std::string param = r.prompts.size() > 1 ? "prompt[" + std::to_string(k) + "]" : "prompt";
    std::vector<int32_t> prompt = p.tokens;
    if (p.text) {
      auto ids = encode_text(ctx, *p.text, r.add_special_tokens, param.c_str());
      if (!ids.ok()) return ids.error();
      prompt = std::move(*ids);
    }
    if (prompt.empty()) return bad_request(param + " is empty", param);
    auto prep = prepare(ctx, r, std::move(prompt));
    if (!prep.ok()) return prep.error();
    for (int64_t i = 0; i < r.n; ++i) {
      SamplingParams sp = choice_params(ctx, r, *prep, i);
      auto constraint = request_constraint(ctx, r, nullptr, sp, false);
      if (!constraint.ok()) return constraint.error();
      GenerationPtr g = new_generation(ctx, r, prep->prompt, std::move(sp));
      g->er->constraint = std::move(*constraint);
      if (r.echo && g->num_logprobs >= 0) g->er->prompt_logprobs = g->num_logprobs;
      g->er->prompt_only = r.prompt_only;
      gens.push_back(std::move(g));
    }
  }
  return gens;
}

UsageInfo usage_of(const std::vector<GenerationPtr>& gens, size_t choices_per_prompt) {
  UsageInfo u;
  const size_t per = choices_per_prompt == 0 ? gens.size() : choices_per_prompt;
  for (size_t i = 0; i < gens.size(); ++i) {
    if (i % per == 0) {
      u.prompt_tokens += static_cast<int64_t>(gens[i]->er->prompt.size());
      // As OpenAI reports it (vLLM only with --enable-prompt-tokens-details): known once a token came.
      if (gens[i]->cached_tokens >= 0) u.cached_tokens = u.cached_tokens.value_or(0) + gens[i]->cached_tokens;
    }
    u.completion_tokens += static_cast<int64_t>(gens[i]->token_ids.size());
  }
  return u;
}

void run_to_json(ServeContext& ctx, std::vector<GenerationPtr> gens, ResponderPtr res, std::function<void()> respond,
                 ErrorSender fail) {
  if (!fail) fail = [](http::Responder& r, const ApiError& e) { send_error(r, e); };
  submit_to_engine(ctx, gens);
  auto step = [&ctx, gens, res, respond = std::move(respond), fail = std::move(fail)]() mutable {
    if (res->gone()) {
      record_run(*res, gens);
      return true;  // the generations' destructors cancel the engine requests
    }
    if (ctx.drain_expired.load()) {
      fail(*res, drained_error());
      return true;
    }
    if (auto e = pump_all(ctx, gens, nullptr)) {
      record_run(*res, gens);
      fail(*res, *e);
      return true;
    }
    if (!all_done(gens)) return false;
    record_run(*res, gens);
    respond();
    return true;
  };
  add_job(ctx, gens, res, std::move(step));
}

void run_to_stream(ServeContext& ctx, std::vector<GenerationPtr> gens, ResponderPtr res, StreamFns fns) {
  if (!fns.error) fns.error = [](const ApiError& e) { return sse_error_and_done(e); };
  submit_to_engine(ctx, gens);
  res->start_stream("text/event-stream");
  if (fns.opening) {
    const std::string open = fns.opening();
    if (!open.empty()) res->write(open);
  }
  auto step = [&ctx, gens, res, fns = std::move(fns)]() mutable {
    if (res->gone()) {
      record_run(*res, gens);
      return true;
    }
    auto fail = [&](const ApiError& e) {
      record_run(*res, gens);
      res->write(fns.error(e));
      res->end();
      return true;
    };
    if (ctx.drain_expired.load()) return fail(drained_error());
    if (res->pending_bytes() > http::Responder::kStreamHighWater) return false;  // woken when it drains
    std::vector<Piece> pieces(gens.size());
    if (auto e = pump_all(ctx, gens, &pieces)) return fail(*e);
    std::string events;
    for (size_t i = 0; i < gens.size(); ++i) events += fns.chunk(i, pieces[i]);
    if (!events.empty() && !res->write(std::move(events))) return true;
    if (!all_done(gens)) return false;
    record_run(*res, gens);
    res->write(fns.closing());
    res->end();
    return true;
  };
  add_job(ctx, gens, res, std::move(step));
}

}  // namespace sparkserve
