// /v1/chat/completions body parsing: accepted shapes, normalization for the template, and one
// test per class of invalid request, each checking the status, the field named and the message.
#include <gtest/gtest.h>

#include "server/openai_request.h"

namespace sparkserve {
namespace {

ServedModelInfo model_info() { return {{"qwen", "Qwen/Qwen3.5-122B-A10B"}, 4096, 1000}; }

ChatRequest parse_ok(const std::string& body) {
  auto r = parse_chat_request(body, model_info());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : ChatRequest{};
}

// Expects an error with `status` whose param is `param` and whose message contains `needle`.
void expect_error(const std::string& body, int status, const std::string& param,
                  const std::string& needle) {
  auto r = parse_chat_request(body, model_info());
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().status, status) << r.error().message;
  EXPECT_EQ(r.error().param.value_or(""), param) << r.error().message;
  EXPECT_NE(r.error().message.find(needle), std::string::npos)
      << "message: " << r.error().message << "\nwanted: " << needle;
}

const char* kHello = R"("messages": [{"role": "user", "content": "Hello"}])";
std::string body(const std::string& extra) {
  return std::string("{") + kHello + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(ChatRequest, MinimalBodyGetsDefaults) {
  ChatRequest c = parse_ok(body(""));
  EXPECT_FALSE(c.model);
  EXPECT_EQ(c.messages.size(), 1u);
  EXPECT_FALSE(c.stream);
  EXPECT_FALSE(c.sampling.max_tokens);  // chat: up to the context
  EXPECT_FALSE(c.sampling.temperature);
  EXPECT_EQ(c.tool_choice, ToolChoice::kNone);
  EXPECT_TRUE(c.add_generation_prompt);
  EXPECT_TRUE(c.include_reasoning);
  EXPECT_TRUE(c.skip_special_tokens);
  EXPECT_FALSE(c.sampling.logprobs);
}

TEST(ChatRequest, AllSupportedFieldsAreRead) {
  ChatRequest c = parse_ok(body(R"(
    "model": "qwen", "max_tokens": 10, "max_completion_tokens": 20, "temperature": 0.7,
    "top_p": 0.9, "top_k": 20, "min_p": 0.05, "presence_penalty": 1.5, "frequency_penalty": -0.5,
    "repetition_penalty": 1.1, "seed": 42, "stop": ["</s>", "END"], "stop_token_ids": [5, 6],
    "n": 1, "stream": true, "stream_options": {"include_usage": true},
    "logprobs": true, "top_logprobs": 5, "logit_bias": {"17": -100, "3": 2.5},
    "min_tokens": 2, "ignore_eos": true, "chat_template_kwargs": {"enable_thinking": false},
    "include_reasoning": false, "skip_special_tokens": false, "include_stop_str_in_output": true,
    "return_token_ids": true, "response_format": {"type": "text"}, "user": "u1",
    "parallel_tool_calls": false, "allowed_token_ids": [1, 2, 3], "cache_prompt": false)"));
  EXPECT_EQ(*c.model, "qwen");
  EXPECT_EQ(*c.sampling.max_tokens, 20);  // max_completion_tokens wins over max_tokens
  EXPECT_DOUBLE_EQ(*c.sampling.temperature, 0.7);
  EXPECT_DOUBLE_EQ(*c.sampling.top_p, 0.9);
  EXPECT_EQ(*c.sampling.top_k, 20);
  EXPECT_DOUBLE_EQ(*c.sampling.min_p, 0.05);
  EXPECT_DOUBLE_EQ(*c.sampling.presence_penalty, 1.5);
  EXPECT_DOUBLE_EQ(*c.sampling.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(*c.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(*c.sampling.seed, 42);
  EXPECT_EQ(c.stop, (std::vector<std::string>{"</s>", "END"}));
  EXPECT_EQ(c.sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(c.stream);
  EXPECT_TRUE(c.include_usage);
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(*c.sampling.logprobs, 5);
  ASSERT_EQ(c.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(c.sampling.logit_bias[0], (std::pair<int32_t, float>{17, -100.0f}));
  EXPECT_EQ(c.sampling.logit_bias[1], (std::pair<int32_t, float>{3, 2.5f}));
  EXPECT_EQ(*c.sampling.min_tokens, 2);
  EXPECT_TRUE(c.sampling.ignore_eos);
  EXPECT_EQ(c.chat_template_kwargs["enable_thinking"], false);
  EXPECT_FALSE(c.include_reasoning);
  EXPECT_FALSE(c.skip_special_tokens);
  EXPECT_TRUE(c.include_stop_str_in_output);
  EXPECT_TRUE(c.return_token_ids);
  EXPECT_FALSE(c.parallel_tool_calls);
  EXPECT_EQ(*c.sampling.allowed_token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(c.unknown_fields, (std::vector<std::string>{"cache_prompt"}));
}

TEST(ChatRequest, LlamaBenchyShapeIsAccepted) {
  // What llama-benchy sends (peers-and-performance.md 6), with --exact-tg and --no-cache.
  ChatRequest c = parse_ok(R"({"model": "Qwen/Qwen3.5-122B-A10B", "messages": [
      {"role": "system", "content": "context ..."}, {"role": "user", "content": "prompt ..."}],
      "max_tokens": 32, "stream": true, "stream_options": {"include_usage": true},
      "return_token_ids": true, "min_tokens": 32, "ignore_eos": true, "cache_prompt": false})");
  EXPECT_TRUE(c.return_token_ids);
  EXPECT_EQ(*c.sampling.min_tokens, 32);
}

TEST(ChatRequest, StopAsStringSeedMinusOneAndIntegralFloats) {
  ChatRequest c = parse_ok(body(R"("stop": "###", "seed": -1, "max_tokens": 12.0, "temperature": 1)"));
  EXPECT_EQ(c.stop, (std::vector<std::string>{"###"}));
  EXPECT_FALSE(c.sampling.seed);  // -1 = no seed (vLLM)
  EXPECT_EQ(*c.sampling.max_tokens, 12);
  EXPECT_DOUBLE_EQ(*c.sampling.temperature, 1.0);
}

TEST(ChatRequest, NullMeansOmitted) {
  ChatRequest c = parse_ok(body(R"("temperature": null, "stop": null, "tools": null, "seed": null)"));
  EXPECT_FALSE(c.sampling.temperature);
  EXPECT_TRUE(c.stop.empty());
  EXPECT_TRUE(c.tools.is_null());
}

TEST(ChatRequest, MessagesAreNormalizedForTheTemplate) {
  ChatRequest c = parse_ok(R"({"messages": [
    {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "reasoning": "need a tool",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny.", "reasoning_content": "easy"}]})");
  const RequestJson& m = c.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_TRUE(m[0]["content"].is_array());  // parts are kept for the template
  EXPECT_EQ(m[2]["reasoning_content"], "need a tool");
  EXPECT_FALSE(m[2].contains("reasoning"));
  EXPECT_TRUE(m[2]["content"].is_null());
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], RequestJson({{"city", "Paris"}}));
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
  EXPECT_EQ(m[4]["reasoning_content"], "easy");
}

TEST(ChatRequest, ToolsAndToolChoice) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "d", "parameters": {"type": "object", "properties": {}}}}])";
  EXPECT_EQ(parse_ok(body(tools)).tool_choice, ToolChoice::kAuto);  // default with tools
  EXPECT_EQ(parse_ok(body(tools + R"(, "tool_choice": "none")")).tool_choice, ToolChoice::kNone);
  EXPECT_EQ(parse_ok(body(tools + R"(, "tool_choice": "required")")).tool_choice,
            ToolChoice::kRequired);
  ChatRequest named = parse_ok(body(
      tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "get_weather");
  EXPECT_EQ(named.tools.size(), 1u);

  expect_error(body(tools + R"(, "tool_choice": "sometimes")"), 400, "tool_choice", "sometimes");
  expect_error(body(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})"),
               400, "tool_choice", "\"nope\"");
  expect_error(body(R"("tool_choice": "required")"), 400, "tool_choice", "no `tools`");
  expect_error(body(R"("tools": [{"type": "retrieval"}])"), 400, "tools[0].type", "function");
  expect_error(body(R"("tools": [{"type": "function", "function": {"description": "x"}}])"), 400,
               "tools[0].function.name", "non-empty string");
  expect_error(body(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}])"),
               400, "tools[0].function.parameters", "JSON schema object");
  expect_error(body(R"("tools": {"type": "function"})"), 400, "tools", "must be a list");
}

TEST(ChatRequestErrors, MalformedJsonSaysWhere) {
  auto r = parse_chat_request(R"({"messages": [}")", model_info());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, 400);
  EXPECT_NE(r.error().message.find("Invalid JSON body (byte 15)"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("line 1, column 15"), std::string::npos) << r.error().message;
  expect_error("", 400, "", "Invalid JSON body");
  expect_error("[1, 2]", 400, "", "must be a JSON object, got an array");
  expect_error(R"({"a": 1e400})", 400, "", "Invalid JSON body");
  expect_error("{\"messages\": \"\xff\"}", 400, "", "Invalid JSON body");  // invalid UTF-8
  expect_error(std::string(100000, '['), 400, "", "nesting deeper than 64");
}

TEST(ChatRequestErrors, WrongTypesNameTheField) {
  expect_error(body(R"("temperature": "hot")"), 400, "temperature", "must be a number, got a string");
  expect_error(body(R"("max_tokens": 1.5)"), 400, "max_tokens", "must be an integer");
  expect_error(body(R"("max_tokens": true)"), 400, "max_tokens", "got a boolean");
  expect_error(body(R"("stream": "yes")"), 400, "stream", "must be a boolean");
  expect_error(body(R"("stop": 5)"), 400, "stop", "a string or a list of strings");
  expect_error(body(R"("stop": ["a", 5])"), 400, "stop[1]", "must be a string");
  expect_error(body(R"("seed": 1e30)"), 400, "seed", "64-bit range");
  expect_error(body(R"("stream": true, "stream_options": {"include_usage": 1})"), 400,
               "stream_options.include_usage", "must be a boolean");
  expect_error(body(R"("logit_bias": [1])"), 400, "logit_bias", "an object");
  expect_error(body(R"("logit_bias": {"abc": 1})"), 400, "logit_bias", "\"abc\" is not an integer");
  expect_error(body(R"("logit_bias": {"5": "x"})"), 400, "logit_bias[\"5\"]", "a number");
  expect_error(body(R"("stop_token_ids": [1, "2"])"), 400, "stop_token_ids[1]", "token id");
  expect_error(body(R"("chat_template_kwargs": [])"), 400, "chat_template_kwargs", "an object");
}

TEST(ChatRequestErrors, MessagesProblems) {
  expect_error("{}", 400, "messages", "`messages` is required");
  expect_error(R"({"messages": []})", 400, "messages", "at least one message");
  expect_error(R"({"messages": "hi"})", 400, "messages", "a list of messages");
  expect_error(R"({"messages": [5]})", 400, "messages[0]", "an object");
  expect_error(R"({"messages": [{"content": "x"}]})", 400, "messages[0].role", "required");
  expect_error(R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "messages[0].role",
               "\"wizard\"");
  expect_error(R"({"messages": [{"role": "user"}]})", 400, "messages[0].content", "required");
  expect_error(R"({"messages": [{"role": "user", "content": null}]})", 400, "messages[0].content",
               "must not be null");
  expect_error(R"({"messages": [{"role": "user", "content": 7}]})", 400, "messages[0].content",
               "a string or a list of content parts");
  expect_error(R"({"messages": [{"role": "user", "content": [{"type": "input_audio",
      "input_audio": {"data": "", "format": "wav"}}]}]})", 400, "messages[0].content[0].type", "only text and image_url");
  expect_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}]})", 400,
               "messages[0].content[0].image_url", "must be an object");
  expect_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url",
      "image_url": {"url": "data:,", "detail": "ultra"}}]}]})", 400, "messages[0].content[0].image_url.detail", "auto");
  expect_error(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", 400,
               "messages[0].content[0].text", "must be a string");
  expect_error(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", 400,
               "messages[0].tool_calls", "only allowed in assistant");
  expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{not json"}}]}]})", 400,
               "messages[0].tool_calls[0].function.arguments", "not valid JSON");
  expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "[1]"}}]}]})", 400,
               "messages[0].tool_calls[0].function.arguments", "JSON object");
  expect_error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})", 400,
               "messages[0].tool_calls[0].function.name", "must be a string");
  expect_error(R"({"messages": [{"role": "assistant", "content": "a", "reasoning": 5}]})", 400,
               "messages[0].reasoning", "a string");
  expect_error(R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 5}]})", 400,
               "messages[0].tool_call_id", "a string");
  std::string deep_args = "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": "
                          "{\"name\": \"f\", \"arguments\": \"" +
                          std::string(1000, '[') + "\"}}]}]}";
  expect_error(deep_args, 400, "messages[0].tool_calls[0].function.arguments", "deeper");
}

TEST(ChatRequestErrors, UnknownModelIs404) {
  expect_error(body(R"("model": "gpt-4")"), 404, "model", "The model `gpt-4` does not exist.");
  auto r = parse_chat_request(body(R"("model": "gpt-4")"), model_info());
  EXPECT_EQ(r.error().type, "NotFoundError");
}

TEST(ChatRequestErrors, OutOfRangeSamplingValues) {
  expect_error(body(R"("temperature": -1)"), 400, "temperature", "[0, 2]");
  expect_error(body(R"("temperature": 2.5)"), 400, "temperature", "[0, 2]");
  expect_error(body(R"("top_p": 0)"), 400, "top_p", "(0, 1]");
  expect_error(body(R"("top_k": -5)"), 400, "top_k", "-5");
  expect_error(body(R"("min_p": 2)"), 400, "min_p", "[0, 1]");
  expect_error(body(R"("presence_penalty": 3)"), 400, "presence_penalty", "[-2, 2]");
  expect_error(body(R"("frequency_penalty": -2.5)"), 400, "frequency_penalty", "[-2, 2]");
  expect_error(body(R"("repetition_penalty": 0)"), 400, "repetition_penalty", "greater than zero");
  expect_error(body(R"("max_tokens": 0)"), 400, "max_tokens", "at least 1");
  expect_error(body(R"("max_completion_tokens": -3)"), 400, "max_completion_tokens", "at least 1");
  expect_error(body(R"("min_tokens": 5, "max_tokens": 2)"), 400, "min_tokens", "max_tokens=2");
  expect_error(body(R"("logprobs": true, "top_logprobs": 21)"), 400, "top_logprobs", "[0, 20]");
  expect_error(body(R"("top_logprobs": 3)"), 400, "top_logprobs", "`logprobs` set to true");
  expect_error(body(R"("logit_bias": {"5": 150})"), 400, "logit_bias", "[-100, 100]");
  expect_error(body(R"("logit_bias": {"1000": 1})"), 400, "logit_bias", "outside the vocabulary");
  expect_error(body(R"("stop_token_ids": [1000])"), 400, "stop_token_ids[0]", "outside the vocabulary");
  expect_error(body(R"("allowed_token_ids": [])"), 400, "allowed_token_ids", "must not be empty");
  expect_error(body(R"("stop": ["a", ""])"), 400, "stop", "empty string");
}

TEST(ChatRequestErrors, UnsupportedFeaturesAreClear) {
  EXPECT_EQ(parse_ok(body(R"("n": 2)")).n, 2);
  expect_error(body(R"("n": 0)"), 400, "n", "got n=0");
  expect_error(body(R"("n": 2, "best_of": 3)"), 400, "best_of", "equal to `n`");
  expect_error(body(R"("use_beam_search": true)"), 400, "use_beam_search", "Beam search");
  expect_error(body(R"("response_format": {"type": "json_schema", "json_schema": {}})"), 400,
               "response_format.json_schema.schema", "is required");
  expect_error(body(R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "array", "uniqueItems": true}}})"),
               400, "response_format.json_schema.schema", "unsupported JSON Schema keyword \"uniqueItems\" (at #)");
  expect_error(body(R"("response_format": {"type": "grammar"})"), 400, "response_format.type", "not supported");
  EXPECT_TRUE(parse_ok(body(R"("response_format": {"type": "json_object"})")).structured.grammar);
  EXPECT_TRUE(parse_ok(body(R"("structured_outputs": {"choice": ["a", "b"]})")).structured.grammar);
  EXPECT_TRUE(parse_ok(body(R"("guided_regex": "[0-9]+")")).structured.grammar);
  expect_error(body(R"("structured_outputs": {"grammar": "root ::= x"})"), 400, "structured_outputs.grammar",
               "not supported");
  expect_error(body(R"("structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"})"), 400,
               "structured_outputs.regex", "cannot be combined");
  expect_error(body(R"("stream_options": {"include_usage": true})"), 400, "stream_options",
               "only be set when `stream` is true");
  expect_error(body(R"("add_generation_prompt": true, "continue_final_message": true)"), 400,
               "continue_final_message", "Cannot set both");
  expect_error(body(R"("chat_template": "{{ x }}")"), 400, "chat_template", "per-request");
  expect_error(body(R"("prompt_logprobs": 1)"), 400, "prompt_logprobs", "not supported");
  expect_error(body(R"("bad_words": ["x"])"), 400, "bad_words", "not supported");
  parse_ok(body(R"("bad_words": [], "prompt_logprobs": null, "return_tokens_as_token_ids": true)"));
}

TEST(ChatRequest, ContinueFinalMessageAlone) {
  ChatRequest c = parse_ok(body(R"("add_generation_prompt": false, "continue_final_message": true)"));
  EXPECT_TRUE(c.continue_final_message);
  EXPECT_FALSE(c.add_generation_prompt);
}

}  // namespace
}  // namespace sparkserve
