#include <memory>

#include "core/log.h"
#include "server/request_log.h"
#include "server/responses_api.h"
#include "server/route_util.h"
#include "server/routes.h"

namespace sparkserve {
namespace {

void send_responses_error(http::Responder& res, const ApiError& e) { send_error(res, e, error_headers(e)); }

// Reasoning tokens: the reasoning text re-encoded (the tokens the model spent before </think>,
// give or take a token at the boundary).
int64_t reasoning_tokens(const ServeContext& ctx, const Generation& g) {
  const ParsedOutput& out = g.parser->result();
  if (!out.reasoning) return 0;
  auto ids = ctx.tokenizer->encode(*out.reasoning);
  return ids.ok() ? static_cast<int64_t>(ids->size()) : 0;
}

void handle_responses(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse_responses_request(req.body, ctx.info);
  if (!parsed.ok()) return send_responses_error(*res, parsed.error());
  for (const auto& n : parsed->notes) log_line(LogLevel::kInfo, "/v1/responses: " + n);
  if (auto busy = overloaded(ctx)) return send_responses_error(*res, *busy);
  const ChatRequest& chat = parsed->chat;
  auto started = start_chat(ctx, chat);
  if (!started.ok()) return send_responses_error(*res, started.error());
  std::vector<GenerationPtr> gens = std::move(*started);
  const std::string id = make_response_id("resp_");
  const int64_t created = unix_time_seconds();
  const std::string model = chat.model.value_or(ctx.info.names.front());
  if (auto* log = request_log(*res)) log->update([&](RequestRecord& r) { r.id = id; });
  const bool reasoning = chat.include_reasoning;
  const ServeContext* cp = &ctx;
  auto usage = [cp, gens] {
    const UsageInfo u = usage_of(gens);
    return ResponsesUsage{u.prompt_tokens, u.cached_tokens.value_or(0), u.completion_tokens,
                          reasoning_tokens(*cp, *gens.front())};
  };
  auto status = [gens] { return gens.front()->finish_reason == "length" ? "incomplete" : "completed"; };
  RequestJson echo = parsed->echo;

  if (!chat.stream) {
    return run_to_json(ctx, gens, res, [gens, res, id, created, model, echo, reasoning, usage, status] {
      const ResponsesUsage u = usage();
      send_json(*res, responses_object_json(id, created, model, echo, status(),
                                            responses_output_items(id, gens.front()->parser->result(), reasoning), &u));
    }, send_responses_error);
  }
  auto stream = std::make_shared<ResponsesStream>(id, created, model, echo, reasoning);
  StreamFns fns;
  fns.opening = [stream] { return stream->start(); };
  fns.chunk = [stream](size_t, const Piece& p) { return stream->delta(p.delta); };
  fns.closing = [stream, usage, status] { return stream->finish(status(), usage()); };
  fns.error = [stream](const ApiError& e) { return stream->error(e); };
  run_to_stream(ctx, gens, res, std::move(fns));
}

}  // namespace

void add_responses_routes(ServeContext& ctx, const AddRoute& add) {
  add("POST", "/v1/responses", [&ctx](const http::Request& req, ResponderPtr res) { handle_responses(ctx, req, std::move(res)); },
      http::Run::kWorker);
}

}  // namespace sparkserve
