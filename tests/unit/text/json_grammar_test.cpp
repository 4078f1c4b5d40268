// The JSON-Schema compiler and the byte-level matcher on hand-picked documents: what must be
// accepted (valid for the schema, in the forms the grammar writes) and what must be refused
// (invalid for the schema, or valid JSON the grammar does not write, such as out-of-order
// keys). The Python suite tests the same machinery against the `jsonschema` package on a
// generated corpus through the server.
#include "text/json_schema_compiler.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

bool accepts(const JsonMatcher& m, const std::string& text) {
  JsonMatchState s = m.initial();
  return m.step_all(s, text) && m.accepting(s);
}

// A prefix that is not dead (may still become valid).
bool alive(const JsonMatcher& m, const std::string& text) {
  JsonMatchState s = m.initial();
  return m.step_all(s, text);
}

JsonMatcher compile(const char* schema) {
  auto g = compile_json_schema(OrderedJson::parse(schema));
  if (!g.ok()) ADD_FAILURE() << schema << ": " << g.message();
  return JsonMatcher(g.ok() ? *g : json_object_grammar());
}

TEST(JsonGrammar, ObjectPropertiesInOrderRequiredEnforced) {
  auto m = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(accepts(m, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(m, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(accepts(m, "{\n  \"a\": -12,\n  \"b\": \"\"\n}"));
  EXPECT_FALSE(accepts(m, R"({"a":1})"));          // b required
  EXPECT_FALSE(accepts(m, R"({"b":"x","a":1})"));  // out of order
  EXPECT_FALSE(accepts(m, R"({"b":"x","d":1})"));  // no additional properties
  EXPECT_FALSE(accepts(m, R"({"a":1.5,"b":"x"})"));
  EXPECT_FALSE(accepts(m, R"({"a":01,"b":"x"})"));
  EXPECT_FALSE(accepts(m, R"({"b":"x",})"));
  EXPECT_FALSE(alive(m, R"({"c")"));  // skips the required b
}

TEST(JsonGrammar, AdditionalPropertiesAndFreeKeys) {
  auto m = compile(R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"number"}})");
  EXPECT_TRUE(accepts(m, R"({"id":1,"x":2.5,"y":-1e3})"));
  EXPECT_TRUE(accepts(m, R"({"zz":0})"));
  EXPECT_FALSE(accepts(m, R"({"x":1,"id":2})"));  // a declared key cannot come as an additional one
  EXPECT_FALSE(accepts(m, R"({"x":"s"})"));
  EXPECT_FALSE(alive(m, R"({"a\n)"));
}

TEST(JsonGrammar, ArraysStringsNumbersLiterals) {
  auto m = compile(R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":3},"minItems":1,"maxItems":2})");
  EXPECT_TRUE(accepts(m, R"(["a"])"));
  EXPECT_TRUE(accepts(m, R"(["abc", "é\n"])"));
  EXPECT_FALSE(accepts(m, R"([])"));
  EXPECT_FALSE(accepts(m, R"(["abcd"])"));
  EXPECT_FALSE(accepts(m, R"([""])"));
  EXPECT_FALSE(accepts(m, R"(["a","b","c"])"));
  EXPECT_FALSE(alive(m, "[\"a\nb"));       // raw control character
  EXPECT_FALSE(alive(m, "[\"\\ud800"));    // surrogate escape
  EXPECT_FALSE(alive(m, "[\"\xC0\xAF"));   // overlong UTF-8

  auto e = compile(R"({"enum":["red","green",1,null,{"a":[1,2]}]})");
  EXPECT_TRUE(accepts(e, R"("red")"));
  EXPECT_TRUE(accepts(e, R"(1)"));
  EXPECT_TRUE(accepts(e, R"(null)"));
  EXPECT_TRUE(accepts(e, R"({"a": [1, 2]})"));
  EXPECT_FALSE(accepts(e, R"("blue")"));
  EXPECT_FALSE(accepts(e, R"(12)"));

  auto n = compile(R"({"type":"integer","minimum":-5,"exclusiveMaximum":100})");
  for (const char* ok : {"-5", "0", "99", "7"}) EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char* bad : {"-6", "100", "1000", "-0.5", "1e2"}) EXPECT_FALSE(accepts(n, bad)) << bad;
  EXPECT_FALSE(alive(n, "-6"));  // refused at the digit, not only at the end
  EXPECT_FALSE(alive(n, "100"));

  auto r = compile(R"({"type":"number","minimum":0.5,"maximum":2})");
  for (const char* ok : {"0.5", "1", "2", "1.999999", "2.0"}) EXPECT_TRUE(accepts(r, ok)) << ok;
  for (const char* bad : {"0.4", "2.1", "-1", "3", "0"}) EXPECT_FALSE(accepts(r, bad)) << bad;
}

TEST(JsonGrammar, AnyOfRefsRecursionAndNullable) {
  auto m = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(accepts(m, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(accepts(m, R"({"v":1,"kids":[{}]})"));

  auto u = compile(R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"]},{"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind","y"]}]})");
  EXPECT_TRUE(accepts(u, R"({"kind":"a","x":1})"));
  EXPECT_TRUE(accepts(u, R"({"kind":"b","y":"s"})"));
  EXPECT_FALSE(accepts(u, R"({"kind":"a","y":"s"})"));

  auto n = compile(R"({"type":["string","null"],"pattern":"^[a-z]+$"})");
  EXPECT_TRUE(accepts(n, R"("abc")"));
  EXPECT_TRUE(accepts(n, "null"));
  EXPECT_FALSE(accepts(n, R"("ab1")"));
  auto o = compile(R"({"type":"integer","nullable":true})");
  EXPECT_TRUE(accepts(o, "null"));
  EXPECT_TRUE(accepts(o, "3"));
}

TEST(JsonGrammar, PatternSearchSemanticsAndEscapes) {
  auto m = compile(R"({"type":"string","pattern":"\\d{3}"})");
  EXPECT_TRUE(accepts(m, R"("ab123cd")"));
  EXPECT_FALSE(accepts(m, R"("ab12cd")"));
  // A lead byte no digit can follow is refused at once (E0 starts U+0800..U+0FFF only).
  auto d = compile(R"({"type":"string","pattern":"^\\d+$"})");
  EXPECT_FALSE(alive(d, "\"\xE0"));
  EXPECT_FALSE(alive(d, "\"\xC3"));
  auto cjk = compile(R"({"type":"string","pattern":"^[中文]$"})");
  EXPECT_TRUE(accepts(cjk, "\"中\""));
  EXPECT_FALSE(alive(cjk, "\"\xE3"));  // U+3000..U+3FFF: neither 中 (U+4E2D) nor 文 (U+6587)
  auto q = compile(R"({"type":"string","pattern":"^a\"b$"})");
  EXPECT_TRUE(accepts(q, R"("a\"b")"));
  EXPECT_FALSE(alive(q, R"("a\u0022)"));  // \u escapes are not taken under a pattern
}

TEST(JsonGrammar, RawRoots) {
  auto c = choice_grammar({"yes", "no", "y"});
  ASSERT_TRUE(c.ok());
  JsonMatcher cm(*c);
  EXPECT_TRUE(accepts(cm, "yes"));
  EXPECT_TRUE(accepts(cm, "y"));
  EXPECT_FALSE(accepts(cm, "ye"));
  EXPECT_FALSE(accepts(cm, " yes"));
  auto r = regex_grammar("[a-c]+@(x|yz)");
  ASSERT_TRUE(r.ok());
  JsonMatcher rm(*r);
  EXPECT_TRUE(accepts(rm, "abc@yz"));
  EXPECT_FALSE(accepts(rm, "abc@y"));
  EXPECT_FALSE(alive(rm, "d"));
  JsonMatcher obj(json_object_grammar());
  EXPECT_TRUE(accepts(obj, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(accepts(obj, "[1]"));
  EXPECT_FALSE(accepts(obj, R"({"a": 1} x)"));
}

TEST(JsonGrammar, WhitespaceIsBounded) {
  JsonMatcher obj(json_object_grammar());
  EXPECT_TRUE(alive(obj, "{" + std::string(JsonMatcher::kMaxIndent, ' ')));
  EXPECT_FALSE(alive(obj, "{" + std::string(JsonMatcher::kMaxIndent + 1, ' ')));
  EXPECT_TRUE(accepts(obj, "\n\n{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
  EXPECT_TRUE(accepts(obj, "{\"a\":\t1}"));
  EXPECT_FALSE(alive(obj, "{\n\n"));        // one newline per gap
  EXPECT_FALSE(alive(obj, "{\r\n"));        // no carriage returns
  EXPECT_FALSE(alive(obj, "{  \n"));         // the newline comes first
  EXPECT_FALSE(alive(obj, "\n\n\n{"));
}

TEST(JsonGrammar, NestingDeeperThanTheLimitIsRefused) {
  JsonMatcher obj(json_object_grammar());
  std::string deep = "{\"a\":";
  for (size_t i = 1; i < JsonMatcher::kMaxDepth; ++i) deep += "[";
  EXPECT_TRUE(alive(obj, deep));
  EXPECT_FALSE(alive(obj, deep + "["));
}

TEST(JsonSchemaCompiler, ErrorsNameTheKeywordAndPlace) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"type":"array","uniqueItems":true})", "\"uniqueItems\""},
      {R"({"type":"object","properties":{"a":{"not":{}}}})", "\"not\" (at #/properties/a)"},
      {R"({"type":"object","patternProperties":{}})", "\"patternProperties\""},
      {R"({"type":"number","multipleOf":2})", "\"multipleOf\""},
      {R"({"$ref":"http://x/y"})", "not a local reference"},
      {R"({"$ref":"#/$defs/missing"})", "does not point into the schema"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreferences"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "minLength is larger"},
      {R"({"type":"integer","minimum":1.2,"maximum":1.8})", "no integer"},
      {R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})", "no finite JSON value"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "refers to itself"},
      {R"({"allOf":[{"type":"string"},{"minLength":1}]})", "allOf"},
      {R"({"type":"object","required":["x"],"additionalProperties":false})", "required property \"x\""},
      {R"({"type":"wat"})", "unknown type"},
  };
  for (const auto& [schema, want] : bad) {
    auto g = compile_json_schema(OrderedJson::parse(schema));
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_NE(g.message().find(want), std::string::npos) << schema << ": " << g.message();
  }
}

}  // namespace
}  // namespace sparkserve
