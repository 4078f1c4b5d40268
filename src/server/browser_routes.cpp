#include "server/chat_page.h"
#include "server/route_util.h"
#include "server/routes.h"

namespace sparkserve {

void add_browser_routes(ServeContext& ctx, const AddRoute& add) {
  add("GET", "/", [](const http::Request&, ResponderPtr res) {
    res->send(200, "text/html; charset=utf-8", std::string(chat_page_html()));
  }, http::Run::kInline);
  // vLLM's /tokenizer_info: lm-eval's remote tokenizer uses it (with /tokenize and /detokenize)
  // instead of downloading the tokenizer from the Hub.
  add("GET", "/tokenizer_info", [&ctx](const http::Request&, ResponderPtr res) {
    const Tokenizer& t = *ctx.tokenizer;
    auto tok = [](const std::optional<std::string>& s) { return s ? ResponseJson(*s) : ResponseJson(nullptr); };
    ResponseJson j = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"eos_token", tok(t.eos_token())},
                      {"bos_token", tok(t.bos_token())},
                      {"pad_token", tok(t.pad_token())},
                      {"add_bos_token", t.add_bos_token()},
                      {"model_max_length", ctx.info.max_model_len},
                      {"vocab_size", ctx.info.vocab_size},
                      {"chat_template", ctx.chat_template ? ResponseJson(ctx.chat_template->source) : ResponseJson(nullptr)}};
    send_json(*res, j);
  }, http::Run::kInline);
}

}  // namespace sparkserve
