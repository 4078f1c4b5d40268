// The Anthropic and Responses translations without a server: request -> chat messages (what the
// template renders), and parsed output -> event streams. The SDK suites (tests/python/server)
// check the same against the official clients.
#include <gtest/gtest.h>

#include "loader/model_path.h"
#include "server/anthropic_api.h"
#include "server/responses_api.h"

namespace sparkserve {
namespace {

ServedModelInfo info() { return ServedModelInfo{{"m"}, 4096, 1000}; }

std::vector<std::string> event_names(const std::string& sse) {
  std::vector<std::string> out;
  for (size_t p = 0; (p = sse.find("event: ", p)) != std::string::npos; p += 7)
    out.push_back(sse.substr(p + 7, sse.find('\n', p) - p - 7));
  return out;
}

TEST(AnthropicApi, RequestBecomesChatMessages) {
  auto r = parse_anthropic_request(R"({"model":"m","max_tokens":50,"system":[{"type":"text","text":"S1"},{"type":"text","text":"S2"}],
    "messages":[{"role":"user","content":"Q"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"T","signature":"x"},{"type":"text","text":"A"},
        {"type":"tool_use","id":"toolu_1","name":"f","input":{"k":1}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"R"}]},
        {"type":"text","text":"next"}]}],
    "tools":[{"name":"f","input_schema":{"type":"object","properties":{"k":{"type":"integer"}}}},{"type":"bash_20250124","name":"bash"}],
    "tool_choice":{"type":"any","disable_parallel_tool_use":true},"thinking":{"type":"enabled","budget_tokens":10},
    "stop_sequences":["END"],"metadata":{"user_id":"u"}})", info());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& m = r->chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[0]["content"], "S1\nS2");
  EXPECT_EQ(m[2]["reasoning_content"], "T");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], OrderedJson::parse(R"({"k":1})"));
  EXPECT_EQ(m[3]["role"], "tool");  // the result first, then the user's text
  EXPECT_EQ(m[3]["content"], "R");
  EXPECT_EQ(m[4]["content"], "next");
  EXPECT_EQ(r->chat.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(r->chat.parallel_tool_calls);
  EXPECT_EQ(r->chat.tools.size(), 1u);  // the server tool is skipped with a note
  EXPECT_EQ(r->notes.size(), 1u);
  EXPECT_TRUE(r->thinking);
  EXPECT_EQ(r->chat.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*r->chat.sampling.max_tokens, 50);
  EXPECT_TRUE(r->chat.clamp_max_tokens);
}

TEST(AnthropicApi, StreamEventSequence) {
  AnthropicStream s("msg_1", "m", true);
  std::string out = s.start({10, 0, 0});
  OutputDelta d1;
  d1.reasoning = "hmm";
  out += s.delta(d1);
  OutputDelta d2;
  d2.content = "\n\n";  // whitespace before a call opens no text block
  out += s.delta(d2);
  OutputDelta d3;
  d3.tool_calls.push_back({0, std::string("call_ab"), std::string("f"), ""});
  d3.tool_calls.push_back({0, std::nullopt, std::nullopt, "{\"k\": 1}"});
  out += s.delta(d3);
  out += s.finish("tool_use", nullptr, {10, 0, 5});
  EXPECT_EQ(event_names(out), (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                                        "content_block_stop", "content_block_start", "content_block_delta",
                                                        "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_NE(out.find(R"("id":"toolu_ab")"), std::string::npos);
  EXPECT_NE(out.find(R"("partial_json":"{\"k\": 1}")"), std::string::npos);
}

TEST(ResponsesApi, InputItemsBecomeChatMessages) {
  auto r = parse_responses_request(R"({"model":"m","instructions":"I","input":[
    {"type":"message","role":"developer","content":[{"type":"input_text","text":"D"}]},
    {"role":"user","content":"Q"},
    {"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"R"}]},
    {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
    {"type":"function_call_output","call_id":"c1","output":"out"},
    {"type":"local_shell_call","id":"x"}],
    "tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}},{"type":"web_search"}],
    "reasoning":{"effort":"minimal"},"max_output_tokens":7})", info());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& m = r->chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["content"], "I\n\nD");  // instructions and developer text: the one system message
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["reasoning_content"], "R");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[3]["role"], "tool");
  EXPECT_EQ(r->notes.size(), 2u);  // the web_search tool and the local_shell_call item
  EXPECT_EQ(r->chat.chat_template_kwargs["enable_thinking"], false);  // effort "minimal": no thinking
  EXPECT_EQ(*r->chat.sampling.max_tokens, 7);
}

// Images become the chat path's image_url parts (data: URLs; image_input.h decodes them with the
// request's other images), in block order among the text; an image-free list stays a string.
TEST(AgentApis, ImagePartsBecomeChatImageUrlParts) {
  const std::string png = "iVBORw0KGgo=";  // the bytes are only decoded when the images load
  auto a = parse_anthropic_request(R"({"model":"m","max_tokens":5,"messages":[
    {"role":"user","content":[{"type":"text","text":"What is"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":")" + png + R"("}},{"type":"text","text":"?"}]},
    {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"shot","input":{}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"AA=="}}]}]}]})",
                                   info());
  ASSERT_TRUE(a.ok()) << a.error().message;
  const auto& am = a->chat.messages;
  ASSERT_EQ(am.size(), 3u);
  ASSERT_TRUE(am[0]["content"].is_array());
  EXPECT_EQ(am[0]["content"][0], OrderedJson::parse(R"({"type":"text","text":"What is"})"));
  EXPECT_EQ(am[0]["content"][1]["image_url"]["url"], "data:image/png;base64," + png);
  EXPECT_EQ(am[0]["content"][2]["text"], "?");
  EXPECT_EQ(am[2]["role"], "tool");
  EXPECT_EQ(am[2]["content"][0]["text"], "Error: ");
  EXPECT_EQ(am[2]["content"][1]["image_url"]["url"], "data:image/jpeg;base64,AA==");

  auto r = parse_responses_request(R"({"model":"m","input":[
    {"role":"user","content":[{"type":"input_text","text":"Describe"},{"type":"input_image","image_url":"data:image/png;base64,)" + png + R"(","detail":"low"}]},
    {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
    {"type":"function_call_output","call_id":"c1","output":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]},
    {"role":"user","content":[{"type":"input_text","text":"plain"}]}]})", info());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& rm = r->chat.messages;
  ASSERT_EQ(rm.size(), 4u);
  EXPECT_EQ(rm[0]["content"][1], OrderedJson::parse(R"({"type":"image_url","image_url":{"url":"data:image/png;base64,)" + png +
                                                    R"(","detail":"low"}})"));
  EXPECT_EQ(rm[2]["content"][0]["image_url"]["url"], "data:image/png;base64,AA==");
  EXPECT_EQ(rm[3]["content"], "plain");

  // Refusals name the part: URL sources (no network), file ids (no file store), a bad detail,
  // an image in an assistant or system turn.
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://x"}}]}]})",
            "messages[0].content[0].source.type"},
           {R"({"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]})",
            "messages[0].content[0]"},
           {R"({"max_tokens":5,"system":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}],"messages":[]})",
            "system[0]"}}) {
    auto bad = parse_anthropic_request(body, info());
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.error().status, 400);
    EXPECT_EQ(bad.error().param, param) << bad.error().message;
  }
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]})", "input[0].content[0].file_id"},
           {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA==","detail":"huge"}]}]})",
            "input[0].content[0].detail"},
           {R"({"input":[{"role":"system","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]})",
            "input[0].content[0]"}}) {
    auto bad = parse_responses_request(body, info());
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.error().status, 400);
    EXPECT_EQ(bad.error().param, param) << bad.error().message;
  }
}

TEST(ResponsesApi, StreamSequenceNumbersAndItems) {
  ResponsesStream s("resp_1", 0, "m", OrderedJson::object(), true);
  std::string out = s.start();
  OutputDelta d;
  d.content = "hi";
  out += s.delta(d);
  out += s.finish("completed", {3, 0, 1, 0});
  EXPECT_EQ(event_names(out),
            (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                      "response.content_part.added", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  for (int i = 0; i < 9; ++i)
    EXPECT_NE(out.find("\"sequence_number\":" + std::to_string(i) + "}"), std::string::npos) << i;
}

TEST(ModelPath, TokenCountsAsVllmReadsThem) {
  EXPECT_EQ(*parse_token_count("32768", "--x"), 32768);
  EXPECT_EQ(*parse_token_count("32k", "--x"), 32000);
  EXPECT_EQ(*parse_token_count("32K", "--x"), 32768);
  EXPECT_EQ(*parse_token_count("25.6k", "--x"), 25600);
  EXPECT_EQ(*parse_token_count("1M", "--x"), 1048576);
  EXPECT_EQ(*parse_token_count("-1", "--x"), -1);
  for (const char* bad : {"", "k", "3x", "1.5", "0", "1..2k"}) EXPECT_FALSE(parse_token_count(bad, "--x").ok()) << bad;
}

}  // namespace
}  // namespace sparkserve
