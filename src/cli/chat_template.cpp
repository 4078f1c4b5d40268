// `sparkserve chat-template --model DIR --request FILE.json`: prints the prompt the model's chat
// template renders for an OpenAI chat request, byte for byte with nothing added. `--template FILE`
// renders another template instead (special tokens still come from --model when given).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "text/chat_template.h"

namespace {

struct Options {
  std::string model;
  std::string request;
  std::string template_file;
};

int run(const Options& o) {
  using namespace sparkserve;
  std::ifstream in(o.request, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", o.request.c_str());
    return 2;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  OrderedJson request;
  try {
    request = OrderedJson::parse(ss.str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s is not valid JSON: %s\n", o.request.c_str(), e.what());
    return 2;
  }
  Expected<ChatTemplate> tmpl = make_error("");
  if (!o.template_file.empty()) {
    std::ifstream tf(o.template_file, std::ios::binary);
    if (!tf) {
      std::fprintf(stderr, "error: cannot read %s\n", o.template_file.c_str());
      return 2;
    }
    std::ostringstream ts;
    ts << tf.rdbuf();
    std::string cfg = o.model.empty() ? "" : o.model + "/tokenizer_config.json";
    tmpl = chat_template_from_source(ts.str(), o.template_file, cfg);
  } else {
    if (o.model.empty()) {
      std::fprintf(stderr, "error: --model or --template is required\n");
      return 2;
    }
    tmpl = load_chat_template(o.model);
  }
  if (!tmpl.ok()) {
    std::fprintf(stderr, "error: %s\n", tmpl.message().c_str());
    return 1;
  }
  auto prompt = render_chat_request(*tmpl, request);
  if (!prompt.ok()) {
    std::fprintf(stderr, "error: %s\n", prompt.message().c_str());
    return 1;
  }
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
  return 0;
}

void register_chat_template(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("chat-template", "Render a model's chat template for an OpenAI chat request");
  cmd->add_option("--model", opts->model, "Model folder (chat_template.jinja / tokenizer_config.json)");
  cmd->add_option("--request", opts->request, "OpenAI chat request body (JSON file)")->required();
  cmd->add_option("--template", opts->template_file, "Render this template file instead of the model's");
  cmd->callback([opts, &exit_code] { exit_code = run(*opts); });
}
SPARKSERVE_COMMAND(register_chat_template);

}  // namespace
