// /v1/completions, /tokenize and /detokenize bodies, and the post-tokenization context check.
#include <gtest/gtest.h>

#include "server/openai_request.h"

namespace sparkserve {
namespace {

ServedModelInfo model_info() { return {{"qwen"}, 4096, 1000}; }

template <class Parse>
void expect_error(Parse parse, const std::string& body, int status, const std::string& param,
                  const std::string& needle) {
  auto r = parse(body, model_info());
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().status, status) << r.error().message;
  EXPECT_EQ(r.error().param.value_or(""), param) << r.error().message;
  EXPECT_NE(r.error().message.find(needle), std::string::npos)
      << "message: " << r.error().message << "\nwanted: " << needle;
}

CompletionRequest completion_ok(const std::string& body) {
  auto r = parse_completion_request(body, model_info());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : CompletionRequest{};
}

TEST(CompletionRequest, PromptShapes) {
  CompletionRequest c = completion_ok(R"({"prompt": "Once upon"})");
  ASSERT_EQ(c.prompts.size(), 1u);
  EXPECT_EQ(*c.prompts[0].text, "Once upon");
  EXPECT_EQ(*c.sampling.max_tokens, 16);  // vLLM's completions default
  EXPECT_TRUE(c.add_special_tokens);
  EXPECT_EQ(*completion_ok(R"({"prompt": ["only one"]})").prompts.at(0).text, "only one");
  EXPECT_EQ(completion_ok(R"({"prompt": [1, 2, 3]})").prompts.at(0).tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(completion_ok(R"({"prompt": [[4, 5]]})").prompts.at(0).tokens, (std::vector<int32_t>{4, 5}));
  // A batch (lm-eval sends several prompts per request), n per prompt.
  CompletionRequest b = completion_ok(R"({"prompt": [[4, 5], [6]], "n": 3})");
  ASSERT_EQ(b.prompts.size(), 2u);
  EXPECT_EQ(b.prompts[1].tokens, (std::vector<int32_t>{6}));
  EXPECT_EQ(b.n, 3);
  EXPECT_EQ(completion_ok(R"({"prompt": ["a", "b"]})").prompts.size(), 2u);
  // echo with max_tokens 0: the prompt only.
  CompletionRequest e = completion_ok(R"({"prompt": [1, 2], "echo": true, "max_tokens": 0, "logprobs": 1})");
  EXPECT_TRUE(e.prompt_only);
  EXPECT_EQ(*e.sampling.max_tokens, 1);
}

TEST(CompletionRequest, FieldsAndLogprobsAsInteger) {
  CompletionRequest c = completion_ok(R"({"prompt": "x", "model": "qwen", "max_tokens": 5,
      "logprobs": 3, "echo": true, "stream": true, "stream_options": {"include_usage": true},
      "temperature": 0, "stop": ["\n"], "return_token_ids": true})");
  EXPECT_EQ(*c.sampling.logprobs, 3);
  EXPECT_TRUE(c.echo);
  EXPECT_TRUE(c.include_usage);
  EXPECT_EQ(*c.sampling.max_tokens, 5);
  EXPECT_TRUE(c.return_token_ids);
}

TEST(CompletionRequest, Errors) {
  auto P = parse_completion_request;
  expect_error(P, "{}", 400, "prompt", "`prompt` is required");
  expect_error(P, R"({"prompt": ""})", 400, "prompt", "must not be empty");
  expect_error(P, R"({"prompt": []})", 400, "prompt", "must not be empty");
  expect_error(P, R"({"prompt": [1, "b"]})", 400, "prompt[1]", "integer token id");
  expect_error(P, R"({"prompt": [1, 5000]})", 400, "prompt[1]", "outside the vocabulary");
  expect_error(P, R"({"prompt": [[1], [2]], "n": 100})", 400, "prompt", "at most 128 choices");
  expect_error(P, R"({"prompt": [[1], []]})", 400, "prompt[1]", "must not be empty");
  expect_error(P, R"({"prompt": 5})", 400, "prompt", "a string, a list of token ids");
  expect_error(P, R"({"prompt": "x", "suffix": "y"})", 400, "suffix", "not supported");
  expect_error(P, R"({"prompt": "x", "logprobs": true})", 400, "logprobs", "an integer");
  expect_error(P, R"({"prompt": "x", "logprobs": 30})", 400, "logprobs", "[0, 20]");
  expect_error(P, R"({"prompt": "x", "model": "other"})", 404, "model", "`other` does not exist");
  expect_error(P, R"({"prompt": "x", "n": 0})", 400, "n", "[1, 128]");
  expect_error(P, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", "at least 1");
  expect_error(P, R"({"prompt": "x", "top_p": 1.5})", 400, "top_p", "(0, 1]");
}

TEST(TokenizeRequest, PromptAndMessagesShapes) {
  auto t = parse_tokenize_request(R"({"prompt": "hi", "return_token_strs": true})", model_info());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(*t->prompt, "hi");
  EXPECT_TRUE(t->add_special_tokens);
  EXPECT_TRUE(t->return_token_strs);
  auto m = parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}})",
      model_info());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_FALSE(m->add_special_tokens);  // vLLM's default for the chat shape
  EXPECT_TRUE(m->add_generation_prompt);
  EXPECT_EQ(m->messages.size(), 1u);
  EXPECT_EQ(m->chat_template_kwargs["enable_thinking"], false);

  auto P = parse_tokenize_request;
  expect_error(P, "{}", 400, "prompt", "exactly one of `prompt` and `messages`");
  expect_error(P, R"({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})", 400,
               "messages", "exactly one");
  expect_error(P, R"({"prompt": 5})", 400, "prompt", "must be a string");
  expect_error(P, R"({"messages": []})", 400, "messages", "at least one");
  expect_error(P, R"({"prompt": "a", "model": "zzz"})", 404, "model", "zzz");
}

TEST(DetokenizeRequest, TokensChecked) {
  auto d = parse_detokenize_request(R"({"tokens": [1, 2, 999]})", model_info());
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->tokens, (std::vector<int32_t>{1, 2, 999}));
  auto P = parse_detokenize_request;
  expect_error(P, "{}", 400, "tokens", "required");
  expect_error(P, R"({"tokens": [1000]})", 400, "tokens[0]", "outside the vocabulary");
  expect_error(P, R"({"tokens": [-1]})", 400, "tokens[0]", "outside the vocabulary");
  expect_error(P, R"({"tokens": "1 2"})", 400, "tokens", "a list of token ids");
}

TEST(ContextLength, FitsOrSaysByHowMuch) {
  auto ok = check_context_length(100, 50, 4096);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 50);
  auto rest = check_context_length(100, std::nullopt, 4096);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 3996);
  EXPECT_TRUE(check_context_length(4000, 96, 4096).ok());  // exactly full

  auto over = check_context_length(4000, 200, 4096);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().status, 400);
  EXPECT_EQ(over.error().param.value_or(""), "max_tokens");
  EXPECT_NE(over.error().message.find("maximum context length is 4096 tokens"), std::string::npos);
  EXPECT_NE(over.error().message.find("you requested 4200 tokens (4000 in the input, 200 in the "
                                      "completion)"),
            std::string::npos)
      << over.error().message;

  auto huge = check_context_length(10, INT64_MAX, 4096);  // no signed overflow in the check
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("you requested 9223372036854775817 tokens"), std::string::npos)
      << huge.error().message;

  auto too_long = check_context_length(5000, std::nullopt, 4096);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("your request has 5000 input tokens"), std::string::npos);
  EXPECT_FALSE(check_context_length(4096, std::nullopt, 4096).ok());  // no room for one token
}

}  // namespace
}  // namespace sparkserve
