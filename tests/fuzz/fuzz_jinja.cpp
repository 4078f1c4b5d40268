// libFuzzer entry point for the Jinja engine. Input: template source, optionally followed by
// "\n@@CONTEXT@@\n" and a JSON object used as the render context (otherwise a fixed chat context).
// Parsing and rendering must end in a value or an Error, never a crash, hang, sanitizer report or
// escaping exception; errors must carry a message; limits are small so runaway templates end fast.
#include <cstddef>
#include <cstdint>
#include <string>

#include "text/jinja/template.h"

namespace {

const sparkserve::OrderedJson& default_context() {
  static const auto* ctx = new sparkserve::OrderedJson(sparkserve::OrderedJson::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi é"}]},
      {"role": "assistant", "content": "<think>r</think>a", "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
      {"role": "tool", "content": "out"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>"
  })"));
  return *ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparkserve;
  std::string input(reinterpret_cast<const char*>(data), size);
  std::string source = input;
  OrderedJson context = default_context();
  const std::string marker = "\n@@CONTEXT@@\n";
  size_t at = input.find(marker);
  if (at != std::string::npos) {
    source = input.substr(0, at);
    context = OrderedJson::parse(input.substr(at + marker.size()), nullptr, false);
    if (context.is_discarded() || !context.is_object()) return 0;
  }
  jinja::TemplateOptions opt;
  opt.limits.max_steps = 20000;
  opt.limits.max_output_bytes = 1 << 20;
  opt.limits.max_call_depth = 30;
  auto tmpl = jinja::Template::parse(source, opt);
  if (!tmpl.ok()) {
    if (tmpl.message().empty()) __builtin_trap();
    return 0;
  }
  auto out = tmpl->render(context);
  if (!out.ok() && out.message().empty() && source.find("raise_exception") == std::string::npos) __builtin_trap();
  if (out.ok() && out->size() > opt.limits.max_output_bytes) __builtin_trap();
  return 0;
}
