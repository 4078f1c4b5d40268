#include "server/responses_api.h"

#include "server/chat_messages.h"
#include "server/image_input.h"
#include "server/sse.h"

namespace sparkserve {
namespace {

ApiError field_error(const std::string& path, const std::string& what) { return bad_request(path + ": " + what, path); }

// Text of message content: a string, or input_text / output_text / text / refusal parts.
ApiResult<std::string> content_text(const RequestJson& c, const std::string& path) {
  return join_text_parts(c, path, {"input_text", "output_text", "text"}, "");
}

// Chat content of a user message or a function call's output: text parts, and input_image parts
// as image_url parts.
ApiResult<RequestJson> content_with_images(const RequestJson& c, const std::string& path) {
  return chat_content_of(c, path, {"input_text", "output_text", "text"}, "", "input_image", responses_image_part_to_chat_part);
}

// Builds the chat messages from `input` items.
class InputTranslator {
 public:
  explicit InputTranslator(std::vector<std::string>& notes) : notes_(notes) {}

  std::optional<ApiError> add(const RequestJson& item, const std::string& path) {
    if (!item.is_object()) return field_error(path, "must be an object");
    std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "";
    if (type.empty() && item.contains("role")) type = "message";  // EasyInputMessage
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) return field_error(path + ".role", "is required");
      const std::string role = item["role"].get<std::string>();
      const RequestJson content = item.contains("content") ? item["content"] : RequestJson();
      if (role == "user") {
        auto c = content_with_images(content, path + ".content");
        if (!c.ok()) return c.error();
        messages_.push_back({{"role", "user"}, {"content", std::move(*c)}});
        return std::nullopt;
      }
      auto text = content_text(content, path + ".content");
      if (!text.ok()) return text.error();
      if (role == "system" || role == "developer") {
        if (!system_.empty() && !text->empty()) system_ += "\n\n";
        system_ += *text;
      } else if (role == "assistant") {
        RequestJson& a = assistant();
        a["content"] = a["content"].get<std::string>() + *text;
      } else {
        return field_error(path + ".role", "must be user, assistant, system or developer, got \"" + role + "\"");
      }
      return std::nullopt;
    }
    if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!item.contains(k) || !item[k].is_string()) return field_error(path + "." + k, "must be a string");
      RequestJson& a = assistant();
      if (!a.contains("tool_calls")) a["tool_calls"] = RequestJson::array();
      a["tool_calls"].push_back({{"id", item["call_id"]},
                                 {"type", "function"},
                                 {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      return std::nullopt;
    }
    if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) return field_error(path + ".call_id", "must be a string");
      auto out = content_with_images(item.contains("output") ? item["output"] : RequestJson(), path + ".output");
      if (!out.ok()) return out.error();
      messages_.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", std::move(*out)}});
      return std::nullopt;
    }
    if (type == "reasoning") {
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!text.empty() || !item.contains(key) || !item[key].is_array()) continue;
        for (const auto& p : item[key])
          if (p.is_object() && p.contains("text") && p["text"].is_string()) text += p["text"].get<std::string>();
      }
      pending_reasoning_ += text;
      return std::nullopt;
    }
    notes_.push_back("skipped input item " + path + " of type \"" + type + "\"");
    return std::nullopt;
  }

  RequestJson finish(const std::string& instructions) {
    RequestJson out = RequestJson::array();
    std::string sys = instructions;
    if (!system_.empty()) sys += (sys.empty() ? "" : "\n\n") + system_;
    if (!sys.empty()) out.push_back({{"role", "system"}, {"content", sys}});
    for (auto& m : messages_) out.push_back(std::move(m));
    return out;
  }

 private:
  // The assistant turn to add to: the last message when it is one (and, for a function call,
  // no tool result came after it), else a new one that takes the pending reasoning.
  RequestJson& assistant() {
    if (!messages_.empty() && messages_.back()["role"] == "assistant" && pending_reasoning_.empty())
      return messages_.back();
    RequestJson a = {{"role", "assistant"}, {"content", ""}};
    if (!pending_reasoning_.empty()) a["reasoning_content"] = pending_reasoning_;
    pending_reasoning_.clear();
    messages_.push_back(std::move(a));
    return messages_.back();
  }

  std::vector<std::string>& notes_;
  std::vector<RequestJson> messages_;
  std::string system_, pending_reasoning_;
};

std::string suffix_of(const std::string& id) { return id.substr(id.find('_') + 1); }

}  // namespace

ApiResult<ResponsesRequest> parse_responses_request(std::string_view body, const ServedModelInfo& model) {
  auto parsed = parse_json_object_body(body);
  if (!parsed.ok()) return parsed.error();
  const RequestJson& j = *parsed;
  ResponsesRequest out;
  for (const char* k : {"previous_response_id", "conversation"})
    if (j.contains(k) && !j[k].is_null())
      return bad_request(std::string("`") + k +
                             "` is not supported: this server does not store responses; send the whole conversation "
                             "in `input` (and set store to false).", k);
  if (j.contains("background") && j["background"].is_boolean() && j["background"].get<bool>())
    return bad_request("`background` responses are not supported.", "background");
  RequestJson oa = RequestJson::object();
  if (j.contains("model")) oa["model"] = j["model"];
  if (j.contains("max_output_tokens") && !j["max_output_tokens"].is_null()) oa["max_tokens"] = j["max_output_tokens"];
  for (const char* k : {"temperature", "top_p", "stream", "parallel_tool_calls"})
    if (j.contains(k) && !j[k].is_null()) oa[k] = j[k];

  std::string instructions;
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return field_error("instructions", "must be a string");
    instructions = j["instructions"].get<std::string>();
  }
  InputTranslator tr(out.notes);
  if (!j.contains("input") || j["input"].is_null()) return field_error("input", "is required");
  if (j["input"].is_string()) {
    if (auto e = tr.add({{"role", "user"}, {"content", j["input"]}}, "input")) return *e;
  } else if (j["input"].is_array()) {
    for (size_t i = 0; i < j["input"].size(); ++i)
      if (auto e = tr.add(j["input"][i], "input[" + std::to_string(i) + "]")) return *e;
  } else {
    return field_error("input", "must be a string or a list of items");
  }
  oa["messages"] = tr.finish(instructions);

  RequestJson echo_tools = RequestJson::array();
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return field_error("tools", "must be a list of tools");
    RequestJson tools = RequestJson::array();
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const RequestJson& t = j["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      const std::string type = t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "";
      if (type != "function") {
        out.notes.push_back("skipped tool " + p + " of type \"" + type + "\" (only function tools run here)");
        continue;
      }
      auto fn = as_function_tool(t, "parameters", p);
      if (!fn.ok()) return fn.error();
      tools.push_back(std::move(*fn));
      echo_tools.push_back(t);
    }
    if (!tools.empty()) oa["tools"] = std::move(tools);
  }
  RequestJson echo_choice = "auto";
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const RequestJson& tc = j["tool_choice"];
    if (tc.is_string()) {
      oa["tool_choice"] = tc;
      echo_choice = tc;
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name")) {
      oa["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
      echo_choice = tc;
    } else {
      out.notes.push_back("tool_choice " + tc.dump() + " names no function tool; using \"auto\"");
    }
    if (!oa.contains("tools")) oa.erase("tool_choice");
  }
  bool thinking = true;
  RequestJson echo_reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (j.contains("reasoning") && j["reasoning"].is_object()) {
    const RequestJson& r = j["reasoning"];
    if (r.contains("effort") && r["effort"].is_string()) {
      const std::string effort = r["effort"].get<std::string>();
      thinking = effort != "none" && effort != "minimal";
      echo_reasoning["effort"] = effort;
    }
    if (r.contains("summary")) echo_reasoning["summary"] = r["summary"];
  }
  oa["chat_template_kwargs"] = {{"enable_thinking", thinking}};
  RequestJson echo_text = {{"format", {{"type", "text"}}}};
  if (j.contains("text") && j["text"].is_object() && j["text"].contains("format") && j["text"]["format"].is_object()) {
    const RequestJson& f = j["text"]["format"];
    const std::string type = f.value("type", "text");
    if (type == "json_object") {
      oa["response_format"] = {{"type", "json_object"}};
    } else if (type == "json_schema") {
      oa["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", f.value("name", "schema")},
                                                {"schema", f.contains("schema") ? f["schema"] : RequestJson()}}}};
    } else if (type != "text") {
      return field_error("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
    }
    echo_text = j["text"];
  }
  auto chat = parse_chat_request(serialize_json(oa), model);
  if (!chat.ok()) {
    ApiError e = chat.error();
    if (e.param == "response_format.json_schema.schema") e.param = "text.format.schema";
    if (e.param == "max_tokens") e.param = "max_output_tokens";
    return e;
  }
  out.chat = std::move(*chat);
  out.chat.clamp_max_tokens = true;
  out.echo = {{"instructions", instructions.empty() ? RequestJson(nullptr) : RequestJson(instructions)},
              {"max_output_tokens", oa.value("max_tokens", RequestJson(nullptr))},
              {"parallel_tool_calls", out.chat.parallel_tool_calls},
              {"reasoning", echo_reasoning},
              {"temperature", oa.value("temperature", RequestJson(nullptr))},
              {"text", echo_text},
              {"tool_choice", echo_choice},
              {"tools", echo_tools},
              {"top_p", oa.value("top_p", RequestJson(nullptr))},
              {"metadata", j.contains("metadata") && j["metadata"].is_object() ? j["metadata"] : RequestJson::object()},
              {"user", j.contains("user") && j["user"].is_string() ? j["user"] : RequestJson(nullptr)}};
  return out;
}

ResponseJson responses_object_json(const std::string& id, int64_t created_at, const std::string& model,
                                   const RequestJson& echo, const std::string& status, ResponseJson output,
                                   const ResponsesUsage* usage) {
  ResponseJson r = {{"id", id},
                    {"object", "response"},
                    {"created_at", created_at},
                    {"status", status},
                    {"background", false},
                    {"error", nullptr},
                    {"incomplete_details", status == "incomplete" ? ResponseJson{{"reason", "max_output_tokens"}}
                                                                  : ResponseJson(nullptr)},
                    {"model", model},
                    {"output", std::move(output)},
                    {"previous_response_id", nullptr},
                    {"store", false},
                    {"truncation", "disabled"}};
  for (const auto& [k, v] : echo.items()) r[k] = v;
  if (usage) {
    r["usage"] = {{"input_tokens", usage->input_tokens},
                  {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}, {"cache_write_tokens", 0}}},
                  {"output_tokens", usage->output_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", usage->reasoning_tokens}}},
                  {"total_tokens", usage->input_tokens + usage->output_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

namespace {

ResponseJson reasoning_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id},
          {"type", "reasoning"},
          {"summary", ResponseJson::array()},
          {"content", ResponseJson::array({{{"type", "reasoning_text"}, {"text", text}}})},
          {"status", status}};
}

ResponseJson output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ResponseJson::array()}, {"logprobs", ResponseJson::array()}};
}

ResponseJson message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", ResponseJson::array({output_text_part(text)})}};
}

ResponseJson call_item(const std::string& id, const std::string& call_id, const std::string& name,
                       const std::string& arguments, const char* status) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id}, {"name", name},
          {"arguments", arguments}};
}

}  // namespace

ResponseJson responses_output_items(const std::string& response_id, const ParsedOutput& out, bool include_reasoning) {
  const std::string sfx = suffix_of(response_id);
  ResponseJson items = ResponseJson::array();
  if (include_reasoning && out.reasoning) items.push_back(reasoning_item("rs_" + sfx, *out.reasoning, "completed"));
  if (out.content && !BlankContentHold::is_blank(*out.content)) items.push_back(message_item("msg_" + sfx, *out.content, "completed"));
  for (size_t i = 0; i < out.tool_calls.size(); ++i) {
    const ToolCall& c = out.tool_calls[i];
    items.push_back(call_item("fc_" + sfx + "_" + std::to_string(i), c.id, c.name, c.arguments, "completed"));
  }
  return items;
}

ResponsesStream::ResponsesStream(std::string id, int64_t created_at, std::string model, RequestJson echo,
                                 bool include_reasoning)
    : id_(std::move(id)), model_(std::move(model)), created_at_(created_at), echo_(std::move(echo)),
      include_reasoning_(include_reasoning) {}

std::string ResponsesStream::event(const std::string& type, ResponseJson body) {
  ResponseJson e = {{"type", type}};
  for (auto& [k, v] : body.items()) e[k] = std::move(v);
  e["sequence_number"] = seq_++;
  return named_sse_event(type, e);
}

std::string ResponsesStream::start() {
  ResponseJson r = responses_object_json(id_, created_at_, model_, echo_, "in_progress", ResponseJson::array(), nullptr);
  std::string out = event("response.created", {{"response", r}});
  return out + event("response.in_progress", {{"response", r}});
}

ResponseJson ResponsesStream::current_item(const char* status) const {
  switch (item_) {
    case Item::kReasoning: return reasoning_item(item_id_, text_, status);
    case Item::kMessage: return message_item(item_id_, text_, status);
    case Item::kFunctionCall: return call_item(item_id_, call_id_, name_, text_, status);
    case Item::kNone: break;
  }
  return nullptr;
}

std::string ResponsesStream::close() {
  if (item_ == Item::kNone) return "";
  std::string out;
  const ResponseJson ids = {{"item_id", item_id_}, {"output_index", output_index_}};
  auto with = [&](ResponseJson extra) {
    ResponseJson b = ids;
    for (auto& [k, v] : extra.items()) b[k] = std::move(v);
    return b;
  };
  if (item_ == Item::kReasoning) {
    out += event("response.reasoning_text.done", with({{"content_index", 0}, {"text", text_}}));
    out += event("response.content_part.done",
                 with({{"content_index", 0}, {"part", {{"type", "reasoning_text"}, {"text", text_}}}}));
  } else if (item_ == Item::kMessage) {
    out += event("response.output_text.done", with({{"content_index", 0}, {"text", text_}, {"logprobs", ResponseJson::array()}}));
    out += event("response.content_part.done", with({{"content_index", 0}, {"part", output_text_part(text_)}}));
  } else {
    out += event("response.function_call_arguments.done", with({{"arguments", text_}, {"name", name_}}));
  }
  ResponseJson item = current_item("completed");
  out += event("response.output_item.done", {{"output_index", output_index_}, {"item", item}});
  done_items_.push_back(std::move(item));
  item_ = Item::kNone;
  tool_ = -1;
  return out;
}

std::string ResponsesStream::open(Item kind, int tool_index, const ToolCallDelta* call) {
  std::string out = close();
  item_ = kind;
  ++output_index_;
  text_.clear();
  const std::string sfx = suffix_of(id_);
  if (kind == Item::kReasoning) item_id_ = "rs_" + sfx + "_" + std::to_string(output_index_);
  else if (kind == Item::kMessage) item_id_ = "msg_" + sfx + "_" + std::to_string(output_index_);
  else item_id_ = "fc_" + sfx + "_" + std::to_string(output_index_);
  if (call) {
    tool_ = tool_index;
    call_id_ = call->id.value_or("");
    name_ = call->name.value_or("");
  }
  ResponseJson item = current_item("in_progress");
  if (kind != Item::kFunctionCall) item["content"] = ResponseJson::array();
  out += event("response.output_item.added", {{"output_index", output_index_}, {"item", item}});
  if (kind == Item::kReasoning)
    out += event("response.content_part.added", {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0},
                                                 {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  else if (kind == Item::kMessage)
    out += event("response.content_part.added", {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0},
                                                 {"part", output_text_part("")}});
  return out;
}

std::string ResponsesStream::delta(const OutputDelta& d) {
  std::string out;
  if (!d.reasoning.empty() && include_reasoning_) {
    if (item_ != Item::kReasoning) out += open(Item::kReasoning, -1, nullptr);
    text_ += d.reasoning;
    out += event("response.reasoning_text.delta",
                 {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    const std::string text = blank_.pass(d.content, item_ == Item::kMessage);
    if (!text.empty()) {
      if (item_ != Item::kMessage) out += open(Item::kMessage, -1, nullptr);
      text_ += text;
      out += event("response.output_text.delta", {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0},
                                                 {"delta", text}, {"logprobs", ResponseJson::array()}});
    }
  }
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.id || item_ != Item::kFunctionCall || tool_ != t.index) out += open(Item::kFunctionCall, t.index, &t);
    if (t.arguments.empty()) continue;
    text_ += t.arguments;
    out += event("response.function_call_arguments.delta",
                 {{"item_id", item_id_}, {"output_index", output_index_}, {"delta", t.arguments}});
  }
  return out;
}

std::string ResponsesStream::finish(const std::string& status, const ResponsesUsage& usage) {
  std::string out = close();
  ResponseJson r = responses_object_json(id_, created_at_, model_, echo_, status, done_items_, &usage);
  return out + event(status == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
}

std::string ResponsesStream::error(const ApiError& e) {
  return event("error", {{"code", e.type}, {"message", e.message}, {"param", e.param ? ResponseJson(*e.param) : ResponseJson(nullptr)}});
}

}  // namespace sparkserve
