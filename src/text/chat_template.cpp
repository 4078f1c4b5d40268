#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace sparkserve {

namespace {

Expected<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return make_error("cannot read " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Expected<OrderedJson> read_json(const std::filesystem::path& p) {
  SS_ASSIGN_OR_RETURN(std::string text, read_file(p));
  try {
    return OrderedJson::parse(text);
  } catch (const std::exception& e) {
    return make_error(p.string() + " is not valid JSON: " + e.what());
  }
}

// "bos_token": "<s>" or {"content": "<s>", ...} (AddedToken form); null or absent -> not set.
void collect_special_tokens(const OrderedJson& cfg, OrderedJson& out) {
  static const char* names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                "pad_token", "cls_token", "mask_token"};
  for (const char* n : names) {
    auto it = cfg.find(n);
    if (it == cfg.end()) continue;
    if (it->is_string()) out[n] = *it;
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) out[n] = (*it)["content"];
  }
  auto extra = cfg.find("additional_special_tokens");
  if (extra != cfg.end() && extra->is_array()) {
    OrderedJson list = OrderedJson::array();
    for (const auto& t : *extra) {
      if (t.is_string()) list.push_back(t);
      else if (t.is_object() && t.contains("content") && t["content"].is_string()) list.push_back(t["content"]);
    }
    out["additional_special_tokens"] = list;
  }
}

Expected<std::string> template_from_config(const OrderedJson& cfg, const std::string& path) {
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return make_error(path + " has no chat_template");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
    return make_error(path + ": chat_template is a list without a \"default\" entry");
  }
  return make_error(path + ": chat_template must be a string or a list of {name, template}");
}

}  // namespace

Expected<ChatTemplate> chat_template_from_source(const std::string& source, const std::string& origin,
                                                 const std::string& tokenizer_config_path) {
  ChatTemplate t;
  t.source = source;
  t.origin = origin;
  t.special_tokens = OrderedJson::object();
  if (!tokenizer_config_path.empty() && std::filesystem::exists(tokenizer_config_path)) {
    SS_ASSIGN_OR_RETURN(OrderedJson cfg, read_json(tokenizer_config_path));
    if (!cfg.is_object()) return make_error(tokenizer_config_path + " must hold a JSON object");
    collect_special_tokens(cfg, t.special_tokens);
  }
  auto compiled = jinja::Template::parse(source);
  if (!compiled.ok()) return make_error(origin + ": " + compiled.message());
  t.compiled = std::move(compiled).value();
  return t;
}

Expected<ChatTemplate> load_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path dir(model_dir);
  fs::path jinja_path = dir / "chat_template.jinja";
  fs::path cfg_path = dir / "tokenizer_config.json";
  if (fs::exists(jinja_path)) {
    SS_ASSIGN_OR_RETURN(std::string src, read_file(jinja_path));
    return chat_template_from_source(src, jinja_path.string(), cfg_path.string());
  }
  if (!fs::exists(cfg_path))
    return make_error("no chat template in " + model_dir + ": neither chat_template.jinja nor tokenizer_config.json exists");
  SS_ASSIGN_OR_RETURN(OrderedJson cfg, read_json(cfg_path));
  if (!cfg.is_object()) return make_error(cfg_path.string() + " must hold a JSON object");
  SS_ASSIGN_OR_RETURN(std::string src, template_from_config(cfg, cfg_path.string()));
  return chat_template_from_source(src, cfg_path.string(), cfg_path.string());
}

Expected<OrderedJson> build_chat_context(OrderedJson request, const OrderedJson& special_tokens) {
  if (!request.is_object()) return make_error("the request body must be a JSON object");
  auto msgs = request.find("messages");
  if (msgs == request.end()) return make_error("request.messages is required");
  if (!msgs->is_array()) return make_error("request.messages must be an array");

  OrderedJson messages = OrderedJson::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    OrderedJson& in = (*msgs)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!in.is_object()) return make_error(where + " must be an object");
    if (!in.contains("role") || !in["role"].is_string()) return make_error(where + ".role must be a string");
    OrderedJson m = std::move(in);
    const auto& content = m.find("content");
    if (content != m.end() && !(content->is_string() || content->is_array() || content->is_null()))
      return make_error(where + ".content must be a string, an array of content parts, or null");
    // vLLM accepts `reasoning` (its current name) as well as `reasoning_content` on input.
    if (m.contains("reasoning") && !m.contains("reasoning_content")) m["reasoning_content"] = m["reasoning"];
    auto calls = m.find("tool_calls");
    if (calls != m.end()) {
      if (calls->is_null() || (calls->is_array() && calls->empty())) {
        m.erase("tool_calls");
      } else if (m["role"] == "assistant") {
        if (!calls->is_array()) return make_error(where + ".tool_calls must be an array");
        for (size_t j = 0; j < calls->size(); ++j) {
          OrderedJson& call = (*calls)[j];
          std::string cwhere = where + ".tool_calls[" + std::to_string(j) + "]";
          if (!call.is_object()) return make_error(cwhere + " must be an object");
          auto fn = call.find("function");
          if (fn == call.end() || !fn->is_object()) return make_error(cwhere + ".function must be an object");
          auto args = fn->find("arguments");
          // vLLM: a falsy arguments value becomes {}; a JSON string is parsed; objects pass.
          bool falsy = args == fn->end() || args->is_null() || (args->is_string() && args->get_ref<const std::string&>().empty()) ||
                       ((args->is_object() || args->is_array()) && args->empty()) ||
                       (args->is_boolean() && !args->get<bool>()) || (args->is_number() && args->get<double>() == 0);
          if (falsy) {
            (*fn)["arguments"] = OrderedJson::object();
          } else if (args->is_string()) {
            try {
              (*fn)["arguments"] = OrderedJson::parse(args->get<std::string>());
            } catch (const std::exception& e) {
              return make_error(cwhere + ".function.arguments is not valid JSON: " + e.what());
            }
          }
        }
      }
    }
    messages.push_back(std::move(m));
  }

  OrderedJson ctx = OrderedJson::object();
  for (const auto& [k, v] : special_tokens.items()) ctx[k] = v;
  auto kwargs = request.find("chat_template_kwargs");
  if (kwargs != request.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) return make_error("request.chat_template_kwargs must be an object");
    for (const auto& [k, v] : kwargs->items()) {
      if (k == "messages" || k == "tools" || k == "add_generation_prompt" || k == "documents")
        return make_error("chat_template_kwargs may not set '" + k + "'; it is a request field");
      ctx[k] = v;
    }
  }
  ctx["messages"] = std::move(messages);
  auto tools = request.find("tools");
  if (tools != request.end() && !tools->is_null() && !tools->is_array())
    return make_error("request.tools must be an array");
  ctx["tools"] = tools != request.end() ? std::move(*tools) : OrderedJson(nullptr);
  ctx["documents"] = nullptr;
  auto agp = request.find("add_generation_prompt");
  if (agp != request.end() && !agp->is_boolean()) return make_error("request.add_generation_prompt must be a boolean");
  ctx["add_generation_prompt"] = agp != request.end() ? agp->get<bool>() : true;
  return ctx;
}

Expected<std::string> render_chat_request(const ChatTemplate& tmpl, OrderedJson request) {
  SS_ASSIGN_OR_RETURN(OrderedJson ctx, build_chat_context(std::move(request), tmpl.special_tokens));
  return tmpl.compiled.render(ctx);
}

}  // namespace sparkserve
