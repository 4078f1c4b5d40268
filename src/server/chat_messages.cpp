#include "server/chat_messages.h"

#include <algorithm>

namespace sparkserve {
namespace {

std::string at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

ApiError type_error(const std::string& path, const char* expected, const RequestJson& got) {
  return bad_request("`" + path + "` must be " + expected + ", got " + json_type_phrase(got) + ".",
                     path);
}

// {"type": "image_url", "image_url": {"url": "...", "detail"?: "auto" | "low" | "high"}}: the shape
// only; server/image_input.h reads the URL.
std::optional<ApiError> check_image_url_part(const RequestJson& part, const std::string& p) {
  auto iu = part.find("image_url");
  if (iu == part.end() || !iu->is_object())
    return bad_request("`" + p + ".image_url` must be an object such as {\"url\": \"data:image/png;base64,...\"}.",
                       p + ".image_url");
  auto url = iu->find("url");
  if (url == iu->end() || !url->is_string())
    return bad_request("`" + p + ".image_url.url` must be a string.", p + ".image_url.url");
  if (auto d = iu->find("detail"); d != iu->end() && !d->is_null()) {
    const bool known = d->is_string() && (*d == "auto" || *d == "low" || *d == "high");
    if (!known) return bad_request("`" + p + ".image_url.detail` must be \"auto\", \"low\" or \"high\".", p + ".image_url.detail");
  }
  return std::nullopt;
}

// content: a string, null, or a list of text and image_url parts; refuses other modalities.
std::optional<ApiError> check_content(const RequestJson& content, const std::string& path,
                                      bool null_allowed) {
  if (content.is_string()) return std::nullopt;
  if (content.is_null()) {
    if (null_allowed) return std::nullopt;
    return bad_request("`" + path + "` must not be null for this role.", path);
  }
  if (!content.is_array()) return type_error(path, "a string or a list of content parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const RequestJson& part = content[i];
    std::string p = at(path, i);
    if (!part.is_object()) return type_error(p, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return bad_request("`" + p + ".type` must be a string such as \"text\".", p + ".type");
    std::string t = type->get<std::string>();
    if (t == "image_url") {
      if (auto e = check_image_url_part(part, p)) return e;
      continue;
    }
    if (t != "text") {
      return bad_request("`" + p + ".type` is \"" + t +
                             "\": only text and image_url content parts are supported by this server.",
                         p + ".type");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return bad_request("`" + p + ".text` must be a string.", p + ".text");
  }
  return std::nullopt;
}

// One assistant tool call, normalized in place (arguments parsed into an object).
std::optional<ApiError> normalize_tool_call(RequestJson& call, const std::string& path) {
  if (!call.is_object()) return type_error(path, "an object", call);
  if (auto t = call.find("type"); t != call.end() && !t->is_null() &&
                                  !(t->is_string() && t->get<std::string>() == "function"))
    return bad_request("`" + path + ".type` must be \"function\".", path + ".type");
  if (auto id = call.find("id"); id != call.end() && !id->is_null() && !id->is_string())
    return type_error(path + ".id", "a string", *id);
  auto fn = call.find("function");
  if (fn == call.end() || !fn->is_object())
    return bad_request("`" + path + ".function` must be an object with `name` and `arguments`.",
                       path + ".function");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string())
    return bad_request("`" + path + ".function.name` must be a string.", path + ".function.name");
  auto args = fn->find("arguments");
  std::string ap = path + ".function.arguments";
  if (args == fn->end() || args->is_null() ||
      (args->is_string() && args->get_ref<const std::string&>().empty())) {
    (*fn)["arguments"] = RequestJson::object();
    return std::nullopt;
  }
  if (args->is_string()) {
    if (json_nesting_depth(args->get_ref<const std::string&>(), kMaxJsonDepth) > kMaxJsonDepth)
      return bad_request("`" + ap + "` nests deeper than " + std::to_string(kMaxJsonDepth) +
                             " levels.", ap);
    RequestJson parsed;
    try {
      parsed = RequestJson::parse(args->get_ref<const std::string&>());
    } catch (const nlohmann::json::exception&) {
      return bad_request("`" + ap + "` is not valid JSON: " + args->dump(), ap);
    }
    if (!parsed.is_object())
      return bad_request("`" + ap + "` must encode a JSON object, got " + json_type_phrase(parsed) +
                             ".", ap);
    *args = std::move(parsed);
    return std::nullopt;
  }
  if (!args->is_object()) return type_error(ap, "a JSON object or its text", *args);
  return std::nullopt;
}

std::optional<ApiError> normalize_message(RequestJson& m, const std::string& path) {
  if (!m.is_object()) return type_error(path, "an object", m);
  auto role_it = m.find("role");
  if (role_it == m.end() || !role_it->is_string())
    return bad_request("`" + path + ".role` is required and must be a string.", path + ".role");
  const std::string role = role_it->get<std::string>();
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    return bad_request("`" + path + ".role` is \"" + role +
                           "\"; supported roles are system, user, assistant and tool.",
                       path + ".role");
  if (auto n = m.find("name"); n != m.end() && !n->is_null() && !n->is_string())
    return type_error(path + ".name", "a string", *n);

  if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    if (role != "assistant")
      return bad_request("`" + path + ".tool_calls` is only allowed in assistant messages.",
                         path + ".tool_calls");
    if (!calls->is_array()) return type_error(path + ".tool_calls", "a list", *calls);
    for (size_t i = 0; i < calls->size(); ++i)
      if (auto e = normalize_tool_call((*calls)[i], at(path + ".tool_calls", i))) return e;
  }

  // Content is left as sent (string, null or parts): the template sees what HF would see.
  auto content = m.find("content");
  if (content == m.end()) {
    if (role != "assistant")
      return bad_request("`" + path + ".content` is required for role \"" + role + "\".",
                         path + ".content");
  } else if (auto e = check_content(*content, path + ".content", role == "assistant")) {
    return e;
  }

  // reasoning_content / reasoning (vLLM >= 0.17 name) both map to reasoning_content.
  for (const char* key : {"reasoning_content", "reasoning"}) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) continue;
    if (!it->is_string()) return type_error(path + "." + key, "a string", *it);
  }
  if (auto r = m.find("reasoning"); r != m.end()) {
    if (!r->is_null() && (!m.contains("reasoning_content") || m["reasoning_content"].is_null()))
      m["reasoning_content"] = *r;
    m.erase("reasoning");
  }
  if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string())
    return type_error(path + ".tool_call_id", "a string", *id);
  return std::nullopt;
}

}  // namespace

ApiResult<RequestJson> normalize_chat_messages(RequestJson messages) {
  if (!messages.is_array()) return type_error("messages", "a list of messages", messages);
  if (messages.empty()) return bad_request("`messages` must contain at least one message.", "messages");
  RequestJson out = std::move(messages);
  for (size_t i = 0; i < out.size(); ++i)
    if (auto e = normalize_message(out[i], at("messages", i))) return *e;
  return out;
}

ApiResult<RequestJson> validate_tools(RequestJson tools) {
  if (!tools.is_array()) return type_error("tools", "a list", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const RequestJson& t = tools[i];
    std::string p = at("tools", i);
    if (!t.is_object()) return type_error(p, "an object", t);
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || type->get<std::string>() != "function")
      return bad_request("`" + p + ".type` must be \"function\".", p + ".type");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return bad_request("`" + p + ".function` must be an object.", p + ".function");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return bad_request("`" + p + ".function.name` must be a non-empty string.",
                         p + ".function.name");
    if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string())
      return type_error(p + ".function.description", "a string", *d);
    if (auto s = fn->find("parameters"); s != fn->end() && !s->is_null() && !s->is_object())
      return type_error(p + ".function.parameters", "a JSON schema object", *s);
    if (auto s = fn->find("strict"); s != fn->end() && !s->is_null() && !s->is_boolean())
      return type_error(p + ".function.strict", "a boolean", *s);
  }
  return tools;
}

ApiResult<RequestJson> as_function_tool(const RequestJson& t, const char* params_key, const std::string& path) {
  if (!t.contains("name") || !t["name"].is_string()) return bad_request(path + ".name: must be a string", path + ".name");
  RequestJson fn = {{"name", t["name"]}};
  if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
  fn["parameters"] = t.contains(params_key) && !t[params_key].is_null() ? t[params_key] : RequestJson{{"type", "object"}};
  return RequestJson{{"type", "function"}, {"function", std::move(fn)}};
}

RequestJson chat_content_from_parts(RequestJson parts, std::string_view sep) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i]["type"] != "text") return parts;
    if (i > 0) text += sep;
    text += parts[i]["text"].get<std::string>();
  }
  return text;
}

ApiResult<RequestJson> chat_content_of(const RequestJson& v, const std::string& path,
                                       std::initializer_list<std::string_view> text_types, std::string_view sep,
                                       std::string_view image_type, ImagePartMapper image_part) {
  auto err = [](const std::string& p, const std::string& what) { return bad_request(p + ": " + what, p); };
  if (v.is_string()) return v;
  if (v.is_null()) return RequestJson(std::string());
  if (!v.is_array()) return err(path, "must be a string or a list of content parts");
  RequestJson parts = RequestJson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const RequestJson& b = v[i];
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return err(p, "must be a content part with a \"type\"");
    const std::string type = b["type"].get<std::string>();
    const bool is_text = std::find(text_types.begin(), text_types.end(), type) != text_types.end();
    if (is_text) {
      if (!b.contains("text") || !b["text"].is_string()) return err(p + ".text", "must be a string");
      parts.push_back({{"type", "text"}, {"text", b["text"]}});
    } else if (type == "refusal" && b.contains("refusal") && b["refusal"].is_string()) {
      parts.push_back({{"type", "text"}, {"text", b["refusal"]}});
    } else if (image_part && type == image_type) {
      auto part = image_part(b, p);
      if (!part.ok()) return part.error();
      parts.push_back(std::move(*part));
    } else if (type == "image" || type == "document" || type == "input_image" || type == "input_file" ||
               type == "input_audio") {
      return err(p, "\"" + type + "\" parts are not supported here (" +
                        (image_part ? "text and " + std::string(image_type) + " only" : std::string("text only")) + ")");
    } else {
      return err(p, "unexpected content part type \"" + type + "\"");
    }
  }
  return chat_content_from_parts(std::move(parts), sep);
}

ApiResult<std::string> join_text_parts(const RequestJson& v, const std::string& path,
                                       std::initializer_list<std::string_view> text_types, std::string_view sep) {
  auto c = chat_content_of(v, path, text_types, sep);
  if (!c.ok()) return c.error();
  return c->get<std::string>();
}

}  // namespace sparkserve
