// Response builders and SSE framing: exact JSON text for fixed inputs (the shapes of
// serving-api.md 5.3-5.5), plus the properties clients rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>

#include "server/openai_response.h"
#include "server/sse.h"

namespace sparkserve {
namespace {

ResponseMeta meta(const char* id = "chatcmpl-abc") { return {id, 1700000000, "qwen"}; }

TEST(ResponseIds, PrefixAnd32HexDigitsAndDistinct) {
  std::regex shape("chatcmpl-[0-9a-f]{32}");
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = make_response_id("chatcmpl-");
    EXPECT_TRUE(std::regex_match(id, shape)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(make_response_id("cmpl-").rfind("cmpl-", 0), 0u);
}

TEST(ChatCompletion, FullShape) {
  ChatMessageOut msg;
  msg.content = "Paris.";
  msg.reasoning = "The capital of France";
  auto j = chat_completion_json(meta(), msg, {"stop", nullptr}, {12, 3});
  EXPECT_EQ(serialize_json(j),
            R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,"model":"qwen",)"
            R"("choices":[{"index":0,"message":{"role":"assistant","content":"Paris.",)"
            R"("reasoning":"The capital of France","reasoning_content":"The capital of France"},)"
            R"("logprobs":null,"finish_reason":"stop","stop_reason":null}],)"
            R"("usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}})");
}

TEST(ChatCompletion, ToolCallsTokenIdsAndNullContent) {
  ChatMessageOut msg;
  msg.tool_calls.push_back({{"id", "call_1"}, {"type", "function"},
                            {"function", {{"name", "f"}, {"arguments", "{\"a\": 1}"}}}});
  std::vector<int32_t> out_ids = {7, 8}, prompt_ids = {1, 2, 3};
  ChoiceExtras extras;
  extras.token_ids = &out_ids;
  auto j = chat_completion_json(meta(), msg, {"tool_calls", nullptr}, {3, 2}, extras, &prompt_ids);
  const auto& c = j["choices"][0];
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_FALSE(c["message"].contains("reasoning"));  // absent when there is none
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["token_ids"], ResponseJson({7, 8}));
  EXPECT_EQ(j["prompt_token_ids"], ResponseJson({1, 2, 3}));
  ChatMessageOut plain;
  plain.content = "x";
  EXPECT_FALSE(chat_completion_json(meta(), plain, {"length", nullptr}, {1, 1})["choices"][0]["message"]
                   .contains("tool_calls"));  // omitted when empty
}

TEST(ChatCompletion, StopReasonIsTheStringOrTokenId) {
  ChatMessageOut msg;
  msg.content = "a";
  EXPECT_EQ(chat_completion_json(meta(), msg, {"stop", "###"}, {1, 1})["choices"][0]["stop_reason"], "###");
  EXPECT_EQ(chat_completion_json(meta(), msg, {"stop", 248046}, {1, 1})["choices"][0]["stop_reason"],
            248046);
}

TEST(ChatChunk, FirstDeltaFinalAndUsageChunks) {
  ChatDelta first;
  first.role = true;
  first.content = "";
  EXPECT_EQ(serialize_json(chat_chunk_json(meta(), first)),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"qwen","choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
            R"("logprobs":null,"finish_reason":null,"stop_reason":null}]})");

  ChatDelta reasoning;
  reasoning.reasoning = "hmm";
  auto rj = chat_chunk_json(meta(), reasoning);
  EXPECT_EQ(rj["choices"][0]["delta"], ResponseJson({{"reasoning", "hmm"}, {"reasoning_content", "hmm"}}));

  ChatDelta tool;
  tool.tool_calls.push_back({{"index", 0}, {"function", {{"arguments", "{\"a\""}}}});
  EXPECT_EQ(chat_chunk_json(meta(), tool)["choices"][0]["delta"]["tool_calls"][0]["index"], 0);

  std::vector<int32_t> ids = {42};
  ChoiceExtras extras;
  extras.token_ids = &ids;
  auto last = chat_chunk_json(meta(), ChatDelta{}, ChoiceEnd{"length", nullptr}, extras);
  EXPECT_EQ(last["choices"][0]["delta"], ResponseJson::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["token_ids"], ResponseJson({42}));
  EXPECT_FALSE(last.contains("usage"));  // absent, not null, unless asked for

  EXPECT_EQ(serialize_json(chat_usage_chunk_json(meta(), {5, 7})),
            R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,)"
            R"("model":"qwen","choices":[],"usage":{"prompt_tokens":5,"total_tokens":12,)"
            R"("completion_tokens":7}})");
  UsageInfo running{5, 1};
  EXPECT_EQ(chat_chunk_json(meta(), first, std::nullopt, {}, &running)["usage"]["total_tokens"], 6);
}

TEST(Logprobs, ChatAndCompletionShapes) {
  std::vector<TokenLogprobs> toks = {
      {{"Hi", -0.25f}, {{"Hi", -0.25f}, {"Hey", -1.5f}}},
      {{"é", -std::numeric_limits<float>::infinity()}, {}},
  };
  auto chat = chat_logprobs_json(toks);
  EXPECT_EQ(serialize_json(chat),
            R"({"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[)"
            R"({"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":"Hey","logprob":-1.5,)"
            R"("bytes":[72,101,121]}]},{"token":"é","logprob":-9999.0,"bytes":[195,169],)"
            R"("top_logprobs":[]}]})");
  auto comp = completion_logprobs_json(toks, 10);
  EXPECT_EQ(comp["text_offset"], ResponseJson({10, 12}));
  EXPECT_EQ(comp["tokens"], ResponseJson({"Hi", "é"}));
  EXPECT_EQ(comp["token_logprobs"][1], -9999.0);
  EXPECT_EQ(comp["top_logprobs"][0], ResponseJson({{"Hi", -0.25}, {"Hey", -1.5}}));
}

TEST(TextCompletion, ResponseAndChunks) {
  auto j = text_completion_json(meta("cmpl-1"), " world", {"length", nullptr}, {2, 1});
  EXPECT_EQ(serialize_json(j),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"qwen",)"
            R"("choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length",)"
            R"("stop_reason":null}],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1}})");
  auto chunk = text_completion_chunk_json(meta("cmpl-1"), " wo");
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], " wo");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  auto usage = text_completion_usage_chunk_json(meta("cmpl-1"), {2, 1});
  EXPECT_EQ(usage["choices"], ResponseJson::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 3);
}

TEST(OtherBodies, ModelsTokenizeDetokenizeError) {
  EXPECT_EQ(serialize_json(models_list_json({"qwen"}, "/models/q", 4096, 1700000000)),
            R"({"object":"list","data":[{"id":"qwen","object":"model","created":1700000000,)"
            R"("owned_by":"sparkserve","root":"/models/q","parent":null,"max_model_len":4096,)"
            R"("permission":[]}]})");
  std::vector<std::string> strs = {"a", "b"};
  EXPECT_EQ(serialize_json(tokenize_response_json({1, 2}, 4096, &strs)),
            R"({"count":2,"max_model_len":4096,"tokens":[1,2],"token_strs":["a","b"]})");
  EXPECT_EQ(serialize_json(tokenize_response_json({}, 8)),
            R"({"count":0,"max_model_len":8,"tokens":[]})");
  EXPECT_EQ(serialize_json(detokenize_response_json("hi")), R"({"prompt":"hi"})");
  EXPECT_EQ(serialize_json(error_json(bad_request("`top_p` must be in (0, 1], got 2.", "top_p"))),
            R"({"error":{"message":"`top_p` must be in (0, 1], got 2.","type":"BadRequestError",)"
            R"("param":"top_p","code":400}})");
  EXPECT_EQ(serialize_json(error_json(model_not_found("x"))),
            R"({"error":{"message":"The model `x` does not exist.","type":"NotFoundError",)"
            R"("param":"model","code":404}})");
  auto big = error_json(body_too_large(2000, 1000));
  EXPECT_EQ(big["error"]["code"], 413);
  EXPECT_TRUE(big["error"]["param"].is_null());
  EXPECT_NE(big["error"]["message"].get<std::string>().find("2000 bytes; the limit is 1000"),
            std::string::npos);
}

TEST(Serialize, InvalidUtf8IsReplacedNotThrown) {
  ResponseJson j = {{"text", std::string("ok\xff\xfe")}};
  std::string s;
  EXPECT_NO_THROW(s = serialize_json(j));
  EXPECT_EQ(s, "{\"text\":\"ok\xEF\xBF\xBD\xEF\xBF\xBD\"}");
}

TEST(Sse, FramingDoneAndErrors) {
  EXPECT_EQ(sse_event(ResponseJson{{"a", "line1\nline2"}}), "data: {\"a\":\"line1\\nline2\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(sse_error_and_done(internal_error("engine died")),
            "data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\","
            "\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n");
}

}  // namespace
}  // namespace sparkserve
