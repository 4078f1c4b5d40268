// A model's chat template and how an OpenAI chat request becomes its render context, as
// transformers' apply_chat_template and vLLM's preprocessing do it.
#pragma once

#include <string>

#include "core/status.h"
#include "text/jinja/template.h"
#include "text/py_json.h"

namespace sparkserve {

struct ChatTemplate {
  std::string source;          // the template text
  std::string origin;          // file it came from, for messages
  OrderedJson special_tokens;  // {"bos_token": "...", "eos_token": "...", ...}: only those set
  jinja::Template compiled;
};

// chat_template.jinja wins over tokenizer_config.json's "chat_template" (a string, or a list of
// {name, template} from which "default" is taken). Special tokens come from tokenizer_config.json
// (strings or {"content": ...} objects).
Expected<ChatTemplate> load_chat_template(const std::string& model_dir);

// Parses `source` as a chat template; special tokens still come from `tokenizer_config_path`
// when it is non-empty and exists.
Expected<ChatTemplate> chat_template_from_source(const std::string& source, const std::string& origin,
                                                 const std::string& tokenizer_config_path);

// The render context for an OpenAI chat request body: messages (assistant tool-call arguments
// given as JSON strings parsed into objects, empty ones becoming {}; `reasoning` copied to
// `reasoning_content` when that is absent), tools (None when absent), add_generation_prompt
// (default true), the special tokens, and every chat_template_kwargs entry. The request's messages
// and tools move into the context (an agent's are ~50 KB of JSON: pass the request as an rvalue
// unless it is needed again).
Expected<OrderedJson> build_chat_context(OrderedJson request, const OrderedJson& special_tokens);

// build_chat_context + render.
Expected<std::string> render_chat_request(const ChatTemplate& tmpl, OrderedJson request);

}  // namespace sparkserve
