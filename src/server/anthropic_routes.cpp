#include <memory>

#include "core/log.h"
#include "server/anthropic_api.h"
#include "server/request_log.h"
#include "server/route_util.h"
#include "server/routes.h"

namespace sparkserve {
namespace {

void send_anthropic_error(http::Responder& res, const ApiError& e) {
  res.send(e.status, "application/json", serialize_json(anthropic_error_json(e)), error_headers(e));
}

ApiResult<AnthropicRequest> parse(const ServeContext& ctx, const http::Request& req, bool count_tokens) {
  auto parsed = parse_anthropic_request(req.body, ctx.info, count_tokens);
  if (parsed.ok())
    for (const auto& n : parsed->notes) log_line(LogLevel::kInfo, std::string(req.path) + ": " + n);
  return parsed;
}

void handle_messages(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse(ctx, req, false);
  if (!parsed.ok()) return send_anthropic_error(*res, parsed.error());
  if (auto busy = overloaded(ctx)) return send_anthropic_error(*res, *busy);
  const ChatRequest& chat = parsed->chat;
  auto started = start_chat(ctx, chat);
  if (!started.ok()) return send_anthropic_error(*res, started.error());
  std::vector<GenerationPtr> gens = std::move(*started);
  const std::string id = make_response_id("msg_");
  const std::string model = chat.model.value_or(ctx.info.names.front());
  if (auto* log = request_log(*res)) log->update([&](RequestRecord& r) { r.id = id; });
  const bool thinking = parsed->thinking && !parsed->omit_thinking;
  auto usage = [gens] {
    const UsageInfo u = usage_of(gens);
    // Anthropic counts input_tokens after the cache: the prompt is input + cache_read_input_tokens.
    const int64_t cached = u.cached_tokens.value_or(0);
    return AnthropicUsage{u.prompt_tokens - cached, u.completion_tokens, cached};
  };

  if (!chat.stream) {
    return run_to_json(ctx, gens, res, [gens, res, id, model, thinking, usage] {
      const Generation& g = *gens.front();
      const ParsedOutput& out = g.parser->result();
      const std::string stop = anthropic_stop_reason(!out.tool_calls.empty(), g.finish_reason, g.stop_reason);
      send_json(*res, anthropic_message_json(id, model, out, thinking, stop, g.stop_reason, usage()));
    }, send_anthropic_error);
  }
  auto stream = std::make_shared<AnthropicStream>(id, model, thinking);
  auto any_tool = std::make_shared<bool>(false);
  StreamFns fns;
  fns.opening = [stream, usage] {
    AnthropicUsage u = usage();
    u.output_tokens = 0;
    return stream->start(u);
  };
  fns.chunk = [stream, any_tool](size_t, const Piece& p) {
    if (!p.delta.tool_calls.empty()) *any_tool = true;
    return stream->delta(p.delta);
  };
  fns.closing = [stream, gens, any_tool, usage] {
    const Generation& g = *gens.front();
    return stream->finish(anthropic_stop_reason(*any_tool, g.finish_reason, g.stop_reason), g.stop_reason, usage());
  };
  fns.error = [](const ApiError& e) { return AnthropicStream::error(e); };
  run_to_stream(ctx, gens, res, std::move(fns));
}

void handle_count_tokens(ServeContext& ctx, const http::Request& req, ResponderPtr res) {
  auto parsed = parse(ctx, req, true);
  if (!parsed.ok()) return send_anthropic_error(*res, parsed.error());
  if (!ctx.chat_template) return send_anthropic_error(*res, no_chat_template(ctx));
  const ChatRequest& c = parsed->chat;
  auto ids = encode_chat(ctx, c.messages, c.tools, c.add_generation_prompt, c.chat_template_kwargs);
  if (!ids.ok()) return send_anthropic_error(*res, ids.error());
  send_json(*res, {{"input_tokens", ids->ids.size()}});
}

}  // namespace

void add_anthropic_routes(ServeContext& ctx, const AddRoute& add) {
  add("POST", "/v1/messages", [&ctx](const http::Request& req, ResponderPtr res) { handle_messages(ctx, req, std::move(res)); },
      http::Run::kWorker);
  add("POST", "/v1/messages/count_tokens",
      [&ctx](const http::Request& req, ResponderPtr res) { handle_count_tokens(ctx, req, std::move(res)); },
      http::Run::kWorker);
}

}  // namespace sparkserve
