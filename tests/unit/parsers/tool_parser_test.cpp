#include "text/tool_parser.h"

#include "parser_test_util.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

using testing::Assembled;
using testing::counter_ids;

const char* kWeatherTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
     "ratio":{"type":"number"},"tags":{"type":"array"},"opts":{"type":"object"},
     "maybe":{"type":["integer","null"]},"choice":{"anyOf":[{"type":"null"},{"type":"integer"}]},
     "free":{}}}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
     "query":{"type":"string"},"limit":{"type":"int"}}}}}
])";

ToolSchemas weather_schemas() { return ToolSchemas::from_openai_tools(OrderedJson::parse(kWeatherTools)); }

// --- Type conversion ----------------------------------------------------------------------------

struct ConvCase {
  const char* param;
  const char* value;
  const char* expected_json;  // json.dumps of vLLM's converted value
};

class ConvertTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvertTest, MatchesPythonConversion) {
  const ConvCase& c = GetParam();
  ToolSchemas schemas = weather_schemas();
  OrderedJson v = convert_tool_param_value(c.value, c.param, schemas.properties("get_weather"));
  EXPECT_EQ(py_json_dumps(v), c.expected_json) << c.param << " = " << c.value;
}

// Expected values are what vLLM's _convert_param_value + json.dumps give (checked with
// CPython 3.11's int(), float(), json.loads and ast.literal_eval).
INSTANTIATE_TEST_SUITE_P(
    Types, ConvertTest,
    ::testing::Values(
        // strings stay raw, even when they look like numbers or JSON
        ConvCase{"city", "Paris", R"("Paris")"}, ConvCase{"city", "42", R"("42")"},
        ConvCase{"city", "{\"a\": 1}", R"("{\"a\": 1}")"}, ConvCase{"city", "", R"("")"},
        ConvCase{"city", "héllo \"q\"\n", "\"héllo \\\"q\\\"\\n\""},
        // "null" in any case is null for every type, strings included (§3.2)
        ConvCase{"city", "null", "null"}, ConvCase{"days", "NULL", "null"}, ConvCase{"unknown_param", "Null", "null"},
        // integers: Python int()
        ConvCase{"days", "2", "2"}, ConvCase{"days", " -7 ", "-7"}, ConvCase{"days", "+7", "7"},
        ConvCase{"days", "1_000", "1000"}, ConvCase{"days", "2.5", R"("2.5")"}, ConvCase{"days", "two", R"("two")"},
        ConvCase{"days", "0x10", R"("0x10")"}, ConvCase{"days", "9223372036854775807", "9223372036854775807"},
        ConvCase{"days", "-9223372036854775808", "-9223372036854775808"},
        // numbers: float(), written as int when integral
        ConvCase{"ratio", "0.5", "0.5"}, ConvCase{"ratio", "2", "2"}, ConvCase{"ratio", "2.0", "2"},
        ConvCase{"ratio", "1.5e3", "1500"}, ConvCase{"ratio", "-2.50", "-2.5"}, ConvCase{"ratio", "1e-5", "1e-05"},
        ConvCase{"ratio", "abc", R"("abc")"}, ConvCase{"ratio", "nan", R"("nan")"}, ConvCase{"ratio", "inf", R"("inf")"},
        ConvCase{"ratio", "-0", "0"}, ConvCase{"ratio", " 3 ", "3"}, ConvCase{"ratio", "0.1", "0.1"},
        // booleans: lower() == "true"
        ConvCase{"metric", "true", "true"}, ConvCase{"metric", "True", "true"}, ConvCase{"metric", "TRUE", "true"},
        ConvCase{"metric", "false", "false"}, ConvCase{"metric", "yes", "false"}, ConvCase{"metric", "1", "false"},
        // containers: json.loads, then ast.literal_eval, else raw
        ConvCase{"tags", "[\"a\", \"b\"]", R"(["a", "b"])"}, ConvCase{"tags", "['a', 'b']", R"(["a", "b"])"},
        ConvCase{"tags", "[1, 2.0, true, null]", "[1, 2.0, true, null]"},
        ConvCase{"tags", "[True, None, False]", "[true, null, false]"}, ConvCase{"tags", "(1, 2)", "[1, 2]"},
        ConvCase{"tags", "not a list", R"("not a list")"}, ConvCase{"tags", "[1, 2", R"("[1, 2")"},
        ConvCase{"opts", "{\"k\": {\"n\": [1, {\"x\": \"é\"}]}}", R"({"k": {"n": [1, {"x": "é"}]}})"},
        ConvCase{"opts", "{'a': 1, 'b': [True, None]}", R"({"a": 1, "b": [true, null]})"},
        ConvCase{"opts", "{\"b\": 1, \"a\": 2}", R"({"b": 1, "a": 2})"},  // key order kept
        ConvCase{"opts", "{1: 'x', 2.5: 'y', None: 3}", R"({"1": "x", "2.5": "y", "null": 3})"},
        ConvCase{"opts", "{1, 2}", R"("{1, 2}")"},  // a set: json.dumps cannot write it
        ConvCase{"opts", "\"just a string\"", R"("just a string")"},
        // other types (a type list): ast.literal_eval, else raw
        ConvCase{"maybe", "5", "5"}, ConvCase{"maybe", "true", R"("true")"}, ConvCase{"maybe", "'x'", R"("x")"},
        ConvCase{"maybe", "[1,2]", "[1, 2]"}, ConvCase{"maybe", "hello", R"("hello")"},
        // anyOf takes the first non-null type (integer here)
        ConvCase{"choice", "12", "12"}, ConvCase{"choice", "x", R"("x")"},
        // a property without "type" is a string
        ConvCase{"free", "12", R"("12")"},
        // not in the schema: raw string
        ConvCase{"unknown_param", "12", R"("12")"}));

TEST(ConvertTest, UnknownToolGivesRawStrings) {
  EXPECT_EQ(py_json_dumps(convert_tool_param_value("12", "x", nullptr)), R"("12")");
  EXPECT_EQ(py_json_dumps(convert_tool_param_value("null", "x", nullptr)), "null");
}

TEST(ConvertTest, TypeNamePrefixesAndCase) {
  OrderedJson props = OrderedJson::parse(R"({
    "a":{"type":" INTEGER "},"b":{"type":"uint8"},"c":{"type":"long"},"d":{"type":"short"},
    "e":{"type":"unsigned"},"f":{"type":"float32"},"g":{"type":"numeric"},"h":{"type":"dict[str,int]"},
    "i":{"type":"list"},"j":{"type":"arr"},"k":{"type":"bool"},"l":{"type":"binary"},"m":{"type":"text"},
    "n":{"type":"varchar"},"o":{"type":"char"},"p":{"type":"enum"},"q":{"type":"str"}})");
  auto conv = [&](const char* name, const char* v) { return py_json_dumps(convert_tool_param_value(v, name, &props)); };
  EXPECT_EQ(conv("a", "3"), "3");
  EXPECT_EQ(conv("b", "3"), "3");
  EXPECT_EQ(conv("c", "3"), "3");
  EXPECT_EQ(conv("d", "3"), "3");
  EXPECT_EQ(conv("e", "3"), "3");
  EXPECT_EQ(conv("f", "3.25"), "3.25");
  EXPECT_EQ(conv("g", "3.0"), "3");
  EXPECT_EQ(conv("h", "{\"a\": 1}"), R"({"a": 1})");
  EXPECT_EQ(conv("i", "[1]"), "[1]");
  EXPECT_EQ(conv("j", "[1]"), "[1]");
  EXPECT_EQ(conv("k", "True"), "true");
  EXPECT_EQ(conv("l", "false"), "false");
  for (const char* s : {"m", "n", "o", "p", "q"}) EXPECT_EQ(conv(s, "[1]"), R"("[1]")") << s;
}

// --- One-shot extraction (vLLM parity) ----------------------------------------------------------

TEST(ToolParserTest, ReferenceExample) {
  // serving-api.md §3.1.
  std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
      "</parameter>\n</function>\n</tool_call>";
  ToolParseResult r = parse_tool_calls(text, weather_schemas(), counter_ids());
  EXPECT_FALSE(r.content.has_value());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Paris", "days": 2})");
  EXPECT_EQ(r.tool_calls[0].id, "call_000000000000000000000000");
  EXPECT_EQ(r.tool_calls[0].to_openai().dump(),
            R"({"id":"call_000000000000000000000000","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"days\": 2}"}})");
}

TEST(ToolParserTest, ContentBeforeCallsAndSeveralCalls) {
  std::string text =
      "Let me check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nweather in Rome\n"
      "</parameter>\n<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>";
  ToolParseResult r = parse_tool_calls(text, weather_schemas(), counter_ids());
  EXPECT_EQ(r.content, "Let me check both.\n\n");  // vLLM keeps the text up to <tool_call> as is
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"query": "weather in Rome", "limit": 3})");
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(ToolParserTest, NoFunctionTagMeansAllContent) {
  for (std::string text : {"plain answer", "", "<tool_call>{\"name\": \"f\"}</tool_call>", "a <tool_call> b",
                           "<parameter=x>1</parameter>"}) {
    ToolParseResult r = parse_tool_calls(text, weather_schemas(), counter_ids());
    EXPECT_TRUE(r.tool_calls.empty()) << text;
    if (text.empty()) EXPECT_FALSE(r.content.has_value());
    else EXPECT_EQ(r.content, text);
  }
}

TEST(ToolParserTest, ValueNewlinesExactlyOneEachSide) {
  ToolParseResult r = parse_tool_calls(
      "<tool_call>\n<function=search>\n<parameter=query>\n\n  two lines\nhere  \n\n</parameter>\n</function>\n</tool_call>",
      weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": "\n  two lines\nhere  \n"})");
  r = parse_tool_calls("<tool_call><function=search><parameter=query>x</parameter></function></tool_call>",
                       weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": "x"})");
}

TEST(ToolParserTest, ParameterEndsAtNextParameterOrFunctionEnd) {
  ToolParseResult r = parse_tool_calls(
      "<tool_call>\n<function=search>\n<parameter=query>\nabc\n<parameter=limit>\n4\n</function>\n</tool_call>",
      weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": "abc", "limit": 4})");
}

TEST(ToolParserTest, UnterminatedCallAtMaxTokens) {
  // Cut inside a value: the value so far is kept (vLLM: `<tool_call>(.*?)$`, `$` before a final \n).
  ToolParseResult r = parse_tool_calls("Sure.\n<tool_call>\n<function=search>\n<parameter=query>\nrust async\n",
                                       weather_schemas(), counter_ids());
  EXPECT_EQ(r.content, "Sure.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"query": "rust async"})");
  // Cut after a complete parameter.
  r = parse_tool_calls("<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n",
                       weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"days": 3})");
  // Cut inside the name: the call is dropped, and no XML leaks into content.
  r = parse_tool_calls("Checking.\n<tool_call>\n<function=get_wea", weather_schemas(), counter_ids());
  EXPECT_EQ(r.content, "Checking.\n");
  EXPECT_TRUE(r.tool_calls.empty());
  // Cut inside a parameter name: the call survives with the parameters before it.
  r = parse_tool_calls("<tool_call>\n<function=search>\n<parameter=limit>\n1\n</parameter>\n<parameter=que",
                       weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"limit": 1})");
  // Only the header.
  r = parse_tool_calls("<tool_call>\n<function=search>\n", weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
}

TEST(ToolParserTest, BareFunctionFallback) {
  // No <tool_call> tags at all: vLLM searches the whole output for <function=.
  ToolParseResult r = parse_tool_calls("text <function=search>\n<parameter=limit>\n2\n</parameter>\n</function>",
                                       weather_schemas(), counter_ids());
  EXPECT_EQ(r.content, "text ");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"limit": 2})");
}

TEST(ToolParserTest, TextAfterAndBetweenCallsIsDropped) {
  ToolParseResult r = parse_tool_calls(
      "A<tool_call><function=search></function></tool_call> between <tool_call><function=search></function></tool_call> after",
      weather_schemas(), counter_ids());
  EXPECT_EQ(r.content, "A");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(ToolParserTest, SeveralFunctionsInOneBlock) {
  ToolParseResult r = parse_tool_calls(
      "<tool_call><function=search><parameter=limit>1</parameter></function><function=get_weather></function></tool_call>",
      weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[1].name, "get_weather");
}

TEST(ToolParserTest, InvalidNamesAreDropped) {
  ToolParseResult r = parse_tool_calls("<tool_call><function={{ tc.name }}></function></tool_call>", weather_schemas(),
                                       counter_ids());
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_FALSE(r.content.has_value());
  r = parse_tool_calls("<tool_call><function=></function></tool_call>", weather_schemas(), counter_ids());
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserTest, UnknownToolKeepsStrings) {
  ToolParseResult r = parse_tool_calls("<tool_call><function=other><parameter=n>5</parameter></function></tool_call>",
                                       weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n": "5"})");
}

TEST(ToolParserTest, RepeatedParameterKeepsFirst) {
  ToolParseResult r = parse_tool_calls(
      "<tool_call><function=search><parameter=limit>1</parameter><parameter=limit>2</parameter></function></tool_call>",
      weather_schemas(), counter_ids());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"limit": 1})");
}

TEST(ToolParserTest, RandomIdsHaveOpenAiShape) {
  auto gen = random_tool_call_id_generator();
  std::string a = gen(), b = gen();
  ASSERT_EQ(a.size(), 29u);
  EXPECT_EQ(a.substr(0, 5), "call_");
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  EXPECT_NE(a, b);
}

TEST(ToolParserTest, DeltaJsonShape) {
  ToolCallDelta header{0, "call_x", "f", ""};
  EXPECT_EQ(header.to_openai().dump(), R"({"index":0,"id":"call_x","type":"function","function":{"name":"f","arguments":""}})");
  ToolCallDelta args{1, std::nullopt, std::nullopt, "{\"a\""};
  EXPECT_EQ(args.to_openai().dump(), R"({"index":1,"function":{"arguments":"{\"a\""}})");
}

// --- Streaming: every split point equals the one-shot parse ------------------------------------

std::vector<std::string> tool_corpus() {
  return {
      "",
      "Hello world, no tools here. a < b > c",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
      "I'll look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo 🌧\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n0.75\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nx < y && <b>bold</b>\n</parameter>\n<parameter=limit>\n10\n</parameter>\n</function>\n</tool_call>\n",
      "<tool_call>\n<function=get_weather>\n<parameter=tags>\n['a', \"b\", None]\n</parameter>\n<parameter=opts>\n{\"deep\": {\"list\": [1, 2.5, false]}}\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n</function>\n</tool_call>",
      "Sure.\n<tool_call>\n<function=search>\n<parameter=query>\nrust async\n",
      "<tool_call>\n<function=get_wea",
      "<tool_call>\n<function=search>\n<parameter=limit>\n1\n</parameter>\n<parameter=que",
      "text <function=search>\n<parameter=limit>\n2\n</parameter>\n</function> tail <function=get_weather></function>",
      "<tool_call>{\"name\": \"json style\"}</tool_call> then <tool_call>\n<function=search>\n</function>\n</tool_call>",
      "<tool_call><function={{ name }}><parameter=a>1</parameter></function></tool_call><tool_call><function=search></function></tool_call>",
      "<tool_call><function=search><parameter=query>a</tool_call>b</parameter></function></tool_call>",
      "<tool_call><function=search><parameter=query>abc<parameter=limit>4</function>junk</tool_call>  \n <tool_call><function=search>",
      "<tool_call><function=search><parameter=limit>1</parameter><parameter=limit>2</parameter></function></tool_call>",
      "a <tool_call b <function c <parameter= d </tool_call> e",
      "<tool_call>\n\n<function=search>\n<parameter=query>\n\n\n</parameter>\n</function>\n</tool_call>\n\n",
      "<tool_call>\n<function=search>\n<parameter=query>\nends with newlines\n\n\n",
      "<<tool_call><function=search><parameter=query><</parameter></function></tool_call>",
      "<function=search><parameter=query>x</parameter><parameter=noclose>\n",
      "<tool_call><function=search></tool_call><function=get_weather><parameter=days>7",
      "<tool_call><function=search><parameter>bad</parameter><parameter=limit>3</parameter></function></tool_call>",
      "<tool_call></tool_call><tool_call></tool_call>x",
  };
}

void check_tool_splits(const std::string& text, const ToolSchemas& schemas) {
  ToolParseResult one = parse_tool_calls(text, schemas, counter_ids());
  for (const auto& plan : testing::split_plans(text, 100, 7)) {
    StreamingToolParser p(schemas, counter_ids());
    Assembled got;
    for (const auto& piece : plan) {
      ToolStreamDelta d = p.feed(piece);
      got.content += d.content;
      got.add(d.tool_calls);
    }
    ToolStreamDelta d = p.finish();
    got.content += d.content;
    got.add(d.tool_calls);
    std::string where = "text: " + text + "\nfirst piece: " + plan[0];
    ASSERT_EQ(got.content, one.content.value_or("")) << where;
    ASSERT_EQ(got.calls.size(), one.tool_calls.size()) << where;
    for (size_t i = 0; i < got.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].id, one.tool_calls[i].id) << where;
      EXPECT_EQ(got.calls[i].name, one.tool_calls[i].name) << where;
      ASSERT_EQ(got.calls[i].arguments, one.tool_calls[i].arguments) << where;
      EXPECT_TRUE(OrderedJson::accept(got.calls[i].arguments)) << got.calls[i].arguments;
      EXPECT_EQ(p.tool_calls()[i].arguments, one.tool_calls[i].arguments);
    }
  }
}

TEST(ToolStreamingTest, EverySplitEqualsOneShot) {
  ToolSchemas schemas = weather_schemas();
  for (const auto& text : tool_corpus()) check_tool_splits(text, schemas);
}

TEST(ToolStreamingTest, NoXmlInContentDeltas) {
  // Tags split at every position never reach content, even as a prefix at a chunk end.
  std::string text = "Answer first.\n\n<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>";
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); j += 3) {
      StreamingToolParser p(weather_schemas(), counter_ids());
      std::string content;
      for (auto piece : {text.substr(0, i), text.substr(i, j - i), text.substr(j)}) content += p.feed(piece).content;
      content += p.finish().content;
      ASSERT_EQ(content, "Answer first.\n\n");
    }
  }
}

TEST(ToolStreamingTest, ArgumentsStreamPerParameter) {
  StreamingToolParser p(weather_schemas(), counter_ids());
  ToolStreamDelta d = p.feed("<tool_call>\n<function=search>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "search");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  d = p.feed("<parameter=query>\nabc\n</parameter>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_FALSE(d.tool_calls[0].id.has_value());
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"query": "abc")");
  d = p.feed("<parameter=limit>\n7\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, R"(, "limit": 7})");
  EXPECT_TRUE(p.finish().empty());
}

TEST(ToolStreamingTest, LongValueFedCharByCharIsLinearEnough) {
  std::string value(20000, 'x');
  std::string text = "<tool_call>\n<function=search>\n<parameter=query>\n" + value + "\n</parameter>\n</function>\n</tool_call>";
  StreamingToolParser p(weather_schemas(), counter_ids());
  for (size_t i = 0; i < text.size(); i += 3) p.feed(std::string_view(text).substr(i, 3));
  p.finish();
  ASSERT_EQ(p.tool_calls().size(), 1u);
  EXPECT_EQ(p.tool_calls()[0].arguments, "{\"query\": \"" + value + "\"}");
}

}  // namespace
}  // namespace sparkserve
