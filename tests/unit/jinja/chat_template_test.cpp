// Loading a model's chat template and building the render context from an OpenAI request.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

#include "text/chat_template.h"

namespace sparkserve {
namespace {

namespace fs = std::filesystem;

fs::path make_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("sparkserve_chat_template_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(ChatTemplateLoad, JinjaFileWinsOverTokenizerConfig) {
  fs::path d = make_dir("wins");
  write(d / "chat_template.jinja", "FILE {{ eos_token }} {{ bos_token is defined }}");
  write(d / "tokenizer_config.json",
        R"({"chat_template": "CONFIG", "eos_token": {"content": "<|im_end|>", "lstrip": false}, "bos_token": null})");
  auto t = load_chat_template(d.string());
  ASSERT_TRUE(t.ok()) << t.message();
  auto out = render_chat_request(*t, OrderedJson::parse(R"({"messages": []})"));
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, "FILE <|im_end|> False");
  fs::remove_all(d);
}

TEST(ChatTemplateLoad, NamedTemplateListUsesDefault) {
  fs::path d = make_dir("named");
  write(d / "tokenizer_config.json",
        R"({"chat_template": [{"name": "rag", "template": "RAG"}, {"name": "default", "template": "DEF{{ bos_token }}"}],
            "bos_token": "<s>"})");
  auto t = load_chat_template(d.string());
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(*render_chat_request(*t, OrderedJson::parse(R"({"messages": []})")), "DEF<s>");
  fs::remove_all(d);
}

TEST(ChatTemplateLoad, ErrorsNameTheProblem) {
  fs::path d = make_dir("errors");
  auto missing = load_chat_template(d.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no chat template"), std::string::npos);
  write(d / "tokenizer_config.json", R"({"eos_token": "x"})");
  auto none = load_chat_template(d.string());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("has no chat_template"), std::string::npos);
  write(d / "chat_template.jinja", "{% if %}");
  auto bad = load_chat_template(d.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("chat_template.jinja: template syntax error: line 1, column 7"), std::string::npos)
      << bad.message();
  fs::remove_all(d);
}

TEST(ChatContext, FollowsVllmPreprocessing) {
  auto ctx = build_chat_context(OrderedJson::parse(R"({
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": null, "reasoning": "thought",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2.0, null]}"}},
                      {"type": "function", "function": {"name": "g", "arguments": ""}},
                      {"type": "function", "function": {"name": "h", "arguments": {"k": "v"}}}]},
      {"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "kept", "tool_calls": []}
    ],
    "chat_template_kwargs": {"enable_thinking": false, "custom": [1]}
  })"), OrderedJson::parse(R"({"eos_token": "</s>"})"));
  ASSERT_TRUE(ctx.ok()) << ctx.message();
  const OrderedJson& c = *ctx;
  EXPECT_EQ(c["messages"][0]["content"][0]["text"], "hi");
  const OrderedJson& calls = c["messages"][1]["tool_calls"];
  EXPECT_EQ(py_json_dumps(calls[0]["function"]["arguments"]), R"({"b": 1, "a": [2.0, null]})");
  EXPECT_EQ(calls[1]["function"]["arguments"], OrderedJson::object());
  EXPECT_EQ(calls[2]["function"]["arguments"]["k"], "v");
  EXPECT_EQ(c["messages"][1]["reasoning_content"], "thought");
  EXPECT_EQ(c["messages"][2]["reasoning_content"], "kept");
  EXPECT_FALSE(c["messages"][2].contains("tool_calls"));
  EXPECT_EQ(c["enable_thinking"], false);
  EXPECT_EQ(c["custom"][0], 1);
  EXPECT_EQ(c["eos_token"], "</s>");
  EXPECT_TRUE(c["tools"].is_null());
  EXPECT_EQ(c["add_generation_prompt"], true);
}

TEST(ChatContext, RejectsMalformedRequests) {
  auto err = [](const char* body) {
    auto r = build_chat_context(OrderedJson::parse(body), OrderedJson::object());
    return r.ok() ? std::string("OK") : r.message();
  };
  EXPECT_EQ(err(R"({})"), "request.messages is required");
  EXPECT_EQ(err(R"({"messages": {}})"), "request.messages must be an array");
  EXPECT_EQ(err(R"({"messages": [1]})"), "messages[0] must be an object");
  EXPECT_EQ(err(R"({"messages": [{"content": "x"}]})"), "messages[0].role must be a string");
  EXPECT_EQ(err(R"({"messages": [], "add_generation_prompt": "yes"})"), "request.add_generation_prompt must be a boolean");
  EXPECT_EQ(err(R"({"messages": [], "chat_template_kwargs": {"messages": []}})"),
            "chat_template_kwargs may not set 'messages'; it is a request field");
  EXPECT_NE(err(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]})")
                .find("messages[0].tool_calls[0].function.arguments is not valid JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace sparkserve
