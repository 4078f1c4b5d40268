#include "server/anthropic_api.h"

#include "server/chat_messages.h"
#include "server/image_input.h"
#include "server/sse.h"
#include "text/py_json.h"

namespace sparkserve {
namespace {

ApiError field_error(const std::string& path, const std::string& what) { return bad_request(path + ": " + what, path); }

// Text of a string or a list of text blocks (the system prompt).
ApiResult<std::string> text_of(const RequestJson& v, const std::string& path) {
  return join_text_parts(v, path, {"text"}, "\n");
}

// Chat content of a tool_result's content: text blocks, and image blocks as image_url parts.
ApiResult<RequestJson> tool_result_content(const RequestJson& v, const std::string& path) {
  return chat_content_of(v, path, {"text"}, "\n", "image", anthropic_image_block_to_chat_part);
}

// One Anthropic message -> zero or more OpenAI-style messages, appended to out.
std::optional<ApiError> translate_message(const RequestJson& m, const std::string& path, RequestJson& out) {
  if (!m.is_object()) return field_error(path, "must be an object");
  auto role_it = m.find("role");
  if (role_it == m.end() || !role_it->is_string()) return field_error(path + ".role", "is required");
  const std::string role = role_it->get<std::string>();
  if (role != "user" && role != "assistant")
    return field_error(path + ".role", "must be \"user\" or \"assistant\", got \"" + role + "\"");
  auto content_it = m.find("content");
  if (content_it == m.end()) return field_error(path + ".content", "is required");
  const RequestJson& content = *content_it;
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content.get<std::string>()}});
    return std::nullopt;
  }
  if (!content.is_array()) return field_error(path + ".content", "must be a string or a list of content blocks");
  std::string thinking;
  RequestJson parts = RequestJson::array();  // text blocks, and a user's images, as chat parts
  RequestJson tool_calls = RequestJson::array();
  RequestJson tool_results = RequestJson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const RequestJson& b = content[i];
    const std::string p = path + ".content[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return field_error(p, "must be a content block with a \"type\"");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return field_error(p + ".text", "must be a string");
      parts.push_back({{"type", "text"}, {"text", b["text"]}});
    } else if (type == "image" && role == "user") {
      auto part = anthropic_image_block_to_chat_part(b, p);
      if (!part.ok()) return part.error();
      parts.push_back(std::move(*part));
    } else if (type == "thinking" && role == "assistant") {
      if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted reasoning of another model: nothing to render.
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("name") || !b["name"].is_string()) return field_error(p + ".name", "must be a string");
      RequestJson input = b.contains("input") ? b["input"] : RequestJson::object();
      if (!input.is_object()) return field_error(p + ".input", "must be an object");
      tool_calls.push_back({{"id", b.value("id", std::string())},
                            {"type", "function"},
                            {"function", {{"name", b["name"]}, {"arguments", py_json_dumps(input)}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        return field_error(p + ".tool_use_id", "must be a string");
      RequestJson result = std::string();
      if (b.contains("content") && !b["content"].is_null()) {
        auto c = tool_result_content(b["content"], p + ".content");
        if (!c.ok()) return c.error();
        result = std::move(*c);
      }
      if (b.value("is_error", false)) {
        if (result.is_string()) result = "Error: " + result.get<std::string>();
        else result.insert(result.begin(), RequestJson{{"type", "text"}, {"text", "Error: "}});
      }
      tool_results.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", std::move(result)}});
    } else if (type == "document") {
      return field_error(p, "\"document\" blocks are not supported (text and images only)");
    } else {
      return field_error(p, "block type \"" + type + "\" is not supported in a " + role + " message");
    }
  }
  for (auto& r : tool_results) out.push_back(std::move(r));
  RequestJson chat_content = chat_content_from_parts(std::move(parts), "");
  if (role == "user") {
    if (!(chat_content.is_string() && chat_content.get<std::string>().empty()) || tool_results.empty())
      out.push_back({{"role", "user"}, {"content", std::move(chat_content)}});
    return std::nullopt;
  }
  RequestJson a = {{"role", "assistant"}, {"content", std::move(chat_content)}};
  if (!thinking.empty()) a["reasoning_content"] = thinking;
  if (!tool_calls.empty()) a["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(a));
  return std::nullopt;
}

std::string error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

ResponseJson usage_json_of(const AnthropicUsage& u) {
  return {{"input_tokens", u.input_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.output_tokens}};
}

}  // namespace

ApiResult<AnthropicRequest> parse_anthropic_request(std::string_view body, const ServedModelInfo& model,
                                                    bool count_tokens) {
  auto parsed = parse_json_object_body(body);
  if (!parsed.ok()) return parsed.error();
  const RequestJson& j = *parsed;
  AnthropicRequest out;
  RequestJson oa = RequestJson::object();  // the OpenAI chat request it becomes
  if (j.contains("model")) oa["model"] = j["model"];
  if (!count_tokens) {
    if (!j.contains("max_tokens") || j["max_tokens"].is_null()) return field_error("max_tokens", "Field required");
    oa["max_tokens"] = j["max_tokens"];
  }
  for (const char* k : {"temperature", "top_p", "top_k", "stream"})
    if (j.contains(k)) oa[k] = j[k];
  if (j.contains("stop_sequences")) {
    if (!j["stop_sequences"].is_array()) return field_error("stop_sequences", "must be a list of strings");
    oa["stop"] = j["stop_sequences"];
  }

  RequestJson messages = RequestJson::array();
  if (j.contains("system") && !j["system"].is_null()) {
    auto sys = text_of(j["system"], "system");
    if (!sys.ok()) return sys.error();
    messages.push_back({{"role", "system"}, {"content", *sys}});
  }
  if (!j.contains("messages") || !j["messages"].is_array()) return field_error("messages", "must be a list of messages");
  for (size_t i = 0; i < j["messages"].size(); ++i)
    if (auto e = translate_message(j["messages"][i], "messages[" + std::to_string(i) + "]", messages)) return *e;
  oa["messages"] = std::move(messages);

  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return field_error("tools", "must be a list of tools");
    RequestJson tools = RequestJson::array();
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const RequestJson& t = j["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return field_error(p, "must be an object");
      const std::string type = t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "custom";
      if (type != "custom") {
        out.notes.push_back("skipped tool " + p + " of type \"" + type + "\" (server tools have no runner here)");
        continue;
      }
      auto fn = as_function_tool(t, "input_schema", p);
      if (!fn.ok()) return fn.error();
      tools.push_back(std::move(*fn));
    }
    if (!tools.empty()) oa["tools"] = std::move(tools);
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const RequestJson& tc = j["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      return field_error("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const std::string type = tc["type"].get<std::string>();
    if (type == "auto") oa["tool_choice"] = "auto";
    else if (type == "any") oa["tool_choice"] = "required";
    else if (type == "none") oa["tool_choice"] = "none";
    else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string()) return field_error("tool_choice.name", "must be a string");
      oa["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return field_error("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\", got \"" + type + "\"");
    }
    if (tc.value("disable_parallel_tool_use", false)) oa["parallel_tool_calls"] = false;
    if (!oa.contains("tools") && type != "none" && type != "auto")
      return field_error("tool_choice", "needs tools");
  }
  if (j.contains("thinking") && !j["thinking"].is_null()) {
    const RequestJson& th = j["thinking"];
    if (!th.is_object() || !th.contains("type") || !th["type"].is_string())
      return field_error("thinking", "must be {\"type\": \"enabled\" | \"disabled\" | \"adaptive\", ...}");
    const std::string type = th["type"].get<std::string>();
    if (type == "enabled" || type == "adaptive" || type == "between_tools") out.thinking = true;
    else if (type != "disabled")
      return field_error("thinking.type", "must be \"enabled\", \"adaptive\", \"between_tools\" or \"disabled\", got \"" +
                                              type + "\"");
    out.omit_thinking = th.value("display", "") == "omitted";
  }
  oa["chat_template_kwargs"] = {{"enable_thinking", out.thinking}};
  // Structured outputs: output_config.format (or the older output_format), {"type": "json_schema", "schema"}.
  std::string format_param;
  const RequestJson* format = nullptr;
  if (j.contains("output_config") && j["output_config"].is_object() && j["output_config"].contains("format") &&
      !j["output_config"]["format"].is_null()) {
    format = &j["output_config"]["format"];
    format_param = "output_config.format";
  } else if (j.contains("output_format") && !j["output_format"].is_null()) {
    format = &j["output_format"];
    format_param = "output_format";
  }
  if (format) {
    if (!format->is_object() || format->value("type", "") != "json_schema" || !format->contains("schema"))
      return field_error(format_param, "must be {\"type\": \"json_schema\", \"schema\": {...}}");
    oa["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", (*format)["schema"]}}}};
  }

  auto chat = parse_chat_request(serialize_json(oa), model);
  if (!chat.ok()) {
    ApiError e = chat.error();
    if (e.param && e.param->rfind("response_format", 0) == 0) e.param = format_param + ".schema";
    if (e.param && *e.param == "stop") e.param = "stop_sequences";
    return e;
  }
  out.chat = std::move(*chat);
  out.chat.clamp_max_tokens = true;
  return out;
}

ResponseJson anthropic_error_json(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.message}}}};
}

std::string anthropic_stop_reason(bool tool_calls, const std::string& finish_reason, const ResponseJson& stop_reason) {
  if (tool_calls) return "tool_use";
  if (finish_reason == "length") return "max_tokens";
  if (stop_reason.is_string()) return "stop_sequence";
  return "end_turn";
}

std::string anthropic_tool_id(const std::string& call_id) {
  return call_id.rfind("call_", 0) == 0 ? "toolu_" + call_id.substr(5) : call_id;
}

ResponseJson anthropic_message_json(const std::string& id, const std::string& model, const ParsedOutput& out,
                                    bool include_thinking, const std::string& stop_reason,
                                    const ResponseJson& stop_sequence, const AnthropicUsage& usage) {
  ResponseJson content = ResponseJson::array();
  if (include_thinking && out.reasoning)
    content.push_back({{"type", "thinking"}, {"thinking", *out.reasoning}, {"signature", ""}});
  if (out.content && !BlankContentHold::is_blank(*out.content)) content.push_back({{"type", "text"}, {"text", *out.content}});
  for (const ToolCall& c : out.tool_calls) {
    OrderedJson input = OrderedJson::object();
    try {
      input = OrderedJson::parse(c.arguments);
    } catch (const std::exception&) {
    }
    content.push_back({{"type", "tool_use"}, {"id", anthropic_tool_id(c.id)}, {"name", c.name}, {"input", input}});
  }
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", std::move(content)},
          {"stop_reason", stop_reason},
          {"stop_sequence", stop_sequence.is_string() ? stop_sequence : ResponseJson(nullptr)},
          {"usage", usage_json_of(usage)}};
}

AnthropicStream::AnthropicStream(std::string id, std::string model, bool include_thinking)
    : id_(std::move(id)), model_(std::move(model)), include_thinking_(include_thinking) {}

std::string AnthropicStream::start(const AnthropicUsage& usage) {
  ResponseJson msg = {{"id", id_},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", model_},
                      {"content", ResponseJson::array()},
                      {"stop_reason", nullptr},
                      {"stop_sequence", nullptr},
                      {"usage", usage_json_of(usage)}};
  return named_sse_event("message_start", {{"type", "message_start"}, {"message", std::move(msg)}}) +
         named_sse_event("ping", {{"type", "ping"}});
}

std::string AnthropicStream::close() {
  if (block_ == Block::kNone) return "";
  block_ = Block::kNone;
  tool_ = -1;
  return named_sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::open(Block b, ResponseJson content_block) {
  std::string out = close();
  block_ = b;
  ++index_;
  return out + named_sse_event("content_block_start", {{"type", "content_block_start"},
                                                        {"index", index_},
                                                        {"content_block", std::move(content_block)}});
}

std::string AnthropicStream::delta(const OutputDelta& d) {
  std::string out;
  auto block_delta = [&](ResponseJson delta) {
    out += named_sse_event("content_block_delta",
                           {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  };
  if (!d.reasoning.empty() && include_thinking_) {
    if (block_ != Block::kThinking) out += open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    block_delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    const std::string text = blank_.pass(d.content, block_ == Block::kText);
    if (!text.empty()) {
      if (block_ != Block::kText) out += open(Block::kText, {{"type", "text"}, {"text", ""}});
      block_delta({{"type", "text_delta"}, {"text", text}});
    }
  }
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.id || block_ != Block::kToolUse || tool_ != t.index) {
      out += open(Block::kToolUse, {{"type", "tool_use"},
                                    {"id", anthropic_tool_id(t.id.value_or(""))},
                                    {"name", t.name.value_or("")},
                                    {"input", ResponseJson::object()}});
      tool_ = t.index;
    }
    if (!t.arguments.empty()) block_delta({{"type", "input_json_delta"}, {"partial_json", t.arguments}});
  }
  return out;
}

std::string AnthropicStream::finish(const std::string& stop_reason, const ResponseJson& stop_sequence,
                                    const AnthropicUsage& usage) {
  std::string out = close();
  ResponseJson u = {{"input_tokens", usage.input_tokens},
                    {"cache_read_input_tokens", usage.cached_tokens},
                    {"output_tokens", usage.output_tokens}};
  out += named_sse_event("message_delta",
                         {{"type", "message_delta"},
                          {"delta", {{"stop_reason", stop_reason},
                                     {"stop_sequence", stop_sequence.is_string() ? stop_sequence : ResponseJson(nullptr)}}},
                          {"usage", std::move(u)}});
  return out + named_sse_event("message_stop", {{"type", "message_stop"}});
}

std::string AnthropicStream::error(const ApiError& e) { return named_sse_event("error", anthropic_error_json(e)); }

}  // namespace sparkserve
