// Engine features one by one. Expected strings were produced by Python jinja2 3.1.6 in the
// transformers environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, json.dumps-based tojson) and pasted here; the Python conformance suite
// (tests/python/test_chat_template_conformance.py) re-derives many more at test time.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "text/jinja/py_str.h"
#include "text/jinja/template.h"

namespace sparkserve::jinja {
namespace {

const OrderedJson& ctx() {
  static const OrderedJson c = OrderedJson::parse(R"({
    "messages": [{"role": "user", "content": " hi "}],
    "x": {"b": [1, 2.0, null, true], "a": "é\n"}})");
  return c;
}

std::string render(const std::string& src, const OrderedJson& context = ctx()) {
  auto t = Template::parse(src);
  if (!t.ok()) return "PARSE ERROR: " + t.message();
  auto out = t->render(context);
  if (!out.ok()) return "RENDER ERROR: " + out.message();
  return *out;
}

struct Case {
  const char* src;
  const char* want;
};

TEST(JinjaEngine, MatchesPythonJinja2) {
  const Case cases[] = {
      {"a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc"},
      {"{%- for m in messages -%} [{{ m.role }}:{{ m.content|trim }}] {%- endfor %}", "[user:hi]"},
      {"{{ x|tojson }}|{{ x.b|string }}|{{ x.b[::-1] }}|{{ x.a|tojson(ensure_ascii=true) }}",
       "{\"b\": [1, 2.0, null, true], \"a\": \"\xc3\xa9\\n\"}|[1, 2.0, None, True]|[True, None, 2.0, 1]|\"\\u00e9\\n\""},
      {"{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i is odd %}{% set ns.n = ns.n + i %}{% endif %}"
       "{% endfor %}{{ ns.n }}",
       "4"},
      {"{% macro greet(who, punct='!') %}Hello {{ who }}{{ punct }}{% endmacro %}{{ greet('you') }} "
       "{{ greet('me', punct='?')|upper }}",
       "Hello you! HELLO ME?"},
      {"{% for k, v in x|dictsort %}{{ loop.index0 }}{{ k }}{{ v|length }}{{ '' if loop.last else ',' }}{% endfor %}",
       "0a2,1b4"},
      {"{{ '  a  '.strip() ~ '|' ~ 'a,b'.split(',')|join('+') ~ '|' ~ 'abc'.startswith('ab') }}", "a|a+b|True"},
      {"{% raw %}{{ kept }}{% endraw %} {# gone #}", "{{ kept }} "},
      {"{{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 1 / 4 }} {{ 1e-05 }} {{ 1e16 }} {{ 0.1 + 0.2 }}",
       "3 2 256 0.25 1e-05 1e+16 0.30000000000000004"},
      {"{{ none }} {{ true }} {{ [none, false, 'it\\'s'] }} {{ {'k': (1,)} }}",
       "None True [None, False, \"it's\"] {'k': (1,)}"},
  };
  for (const auto& c : cases) EXPECT_EQ(render(c.src), c.want) << "template: " << c.src;
}

TEST(JinjaEngine, RaiseExceptionCarriesTheMessageOnly) {
  EXPECT_EQ(render("a{{ raise_exception('No user query found in messages.') }}"),
            "RENDER ERROR: No user query found in messages.");
}

TEST(JinjaEngine, SyntaxErrorsGiveLineAndColumnAndWhatWasExpected) {
  EXPECT_EQ(render("line one\n{% if true %}\n{{ 1 + }}\n{% endif %}"),
            "PARSE ERROR: template syntax error: line 3, column 8: unexpected end of print statement");
  EXPECT_EQ(render("{% for x in y %}\n  {% endif %}"),
            "PARSE ERROR: template syntax error: line 2, column 6: Encountered unknown tag 'endif'.");
  EXPECT_EQ(render("{% if a %}x"),
            "PARSE ERROR: template syntax error: line 1, column 12: Unexpected end of template. Jinja was looking "
            "for the following tags: 'elif' or 'else' or 'endif'.");
  EXPECT_EQ(render("{{ x | nosuch }}"), "PARSE ERROR: template syntax error: line 1, column 8: No filter named 'nosuch'.");
  EXPECT_EQ(render("{{ x is nosuch }}"), "PARSE ERROR: template syntax error: line 1, column 9: No test named 'nosuch'.");
  EXPECT_EQ(render("{% set x = 1 %"),
            "PARSE ERROR: template syntax error: line 1, column 15: unexpected end of template, expected '%}'");
}

TEST(JinjaEngine, UndefinedBehavesAsInPython) {
  EXPECT_EQ(render("[{{ nope }}][{{ x.zzz }}][{{ x.zzz is defined }}][{{ nope|length }}]"), "[][][False][0]");
  EXPECT_EQ(render("{{ nope.attr }}"), "RENDER ERROR: UndefinedError: 'nope' is undefined");
  EXPECT_EQ(render("{{ x.zzz.y }}"), "RENDER ERROR: UndefinedError: 'dict object' has no attribute 'zzz'");
  EXPECT_EQ(render("{{ x.b[9].y }}"), "RENDER ERROR: UndefinedError: list object has no element 9");
}

TEST(JinjaEngine, SandboxRefusesMutation) {
  EXPECT_EQ(render("{{ x.b.append(1) }}"),
            "RENDER ERROR: SecurityError: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(render("{{ range(100001)|length }}"),
            "RENDER ERROR: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
}

TEST(JinjaEngine, GenerationTagRendersItsBody) {
  // transformers' AssistantTracker extension: {% generation %} only marks a span.
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(JinjaEngine, HostileTemplatesEndWithAnError) {
  EXPECT_NE(render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("template nesting too deep"),
            std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 20000; ++i) chain += " + 1";
  EXPECT_NE(render(chain + " }}").find("nested too deeply"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 20000; ++i) filters += "|trim";
  EXPECT_NE(render(filters + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("RecursionError"), std::string::npos);
  EXPECT_NE(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").find("StepLimitError"),
            std::string::npos);
  EXPECT_NE(render("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("OutputLimitError"),
            std::string::npos);
  EXPECT_NE(render("\xff\xfe{{ 1 }}").find("not valid UTF-8"), std::string::npos);
}

// Repeating a sequence: empty ones are empty at once, however large the count (this used to loop
// 10**15 times); a result past the limit fails before any work.
TEST(JinjaEngine, SequenceRepeatIsBoundedBeforeWork) {
  EXPECT_EQ(render("[{{ '' * 10**15 }}]"), "[]");
  EXPECT_EQ(render("{{ ([] * 10**15) | length }}"), "0");
  EXPECT_EQ(render("{{ (10**15 * ()) | length }}"), "0");
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ ([1, 2] * 2) | length }}"), "ababab4");
  EXPECT_NE(render("{{ 'ab' * 10**15 }}").find("OutputLimitError"), std::string::npos);
  EXPECT_NE(render("{{ ([1] * 10**15) | length }}").find("OutputLimitError"), std::string::npos);
}

// Many strings each under the per-string limit still cannot add up past the render's budget.
TEST(JinjaEngine, EverythingBuiltCountsTowardsTheBudget) {
  // 100 strings of 20 MB, each under the 32 MiB limit and dropped at once: 2 GB built in all.
  const std::string many = "{% for i in range(100) %}{% set s = 'x' * 20000000 %}{% endfor %}done";
  EXPECT_NE(render(many).find("built more than"), std::string::npos);
  // A list's items are copied when lists are added: their bytes count too.
  const std::string lists = "{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
                            "{% set ns.l = ns.l + ['x' * 10000000] %}{% endfor %}{{ ns.l | length }}";
  EXPECT_NE(render(lists).find("OutputLimitError"), std::string::npos);
}

TEST(JinjaEngine, DeepInputIsRefusedNotACrash) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  OrderedJson c = OrderedJson::object();
  c["x"] = OrderedJson::parse(deep);
  EXPECT_NE(render("{{ x|tojson }}", c).find("nested deeper than 512"), std::string::npos);
}

TEST(JinjaEngine, LimitsAreConfigurable) {
  TemplateOptions opt;
  opt.limits.max_output_bytes = 10;
  auto t = Template::parse("{{ 'x' * 11 }}", opt);
  ASSERT_TRUE(t.ok());
  auto out = t->render(OrderedJson::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("OutputLimitError"), std::string::npos);
}

TEST(JinjaEngine, TemplateIsReusableAcrossRenders) {
  auto t = Template::parse("{% set ns = namespace(n=0) %}{% set ns.n = ns.n + v %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render(OrderedJson::parse(R"({"v": 2})")), "2");
  EXPECT_EQ(*t->render(OrderedJson::parse(R"({"v": 5})")), "5");
  EXPECT_FALSE(t->render(OrderedJson::array()).ok());
}

// str.strip() on code points, with Python's whitespace: expected values from CPython 3.11
// ('\u00a0\u3000\u2028\x85\u1680'.isspace() is True; '\u200b', '\ufeff', '\u180e' are not spaces).
TEST(PyStrip, UnicodeWhitespaceAsPython) {
  const std::string ws = "\xc2\xa0\xe3\x80\x80\xe2\x80\xa8\xc2\x85\xe1\x9a\x80 \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f";
  EXPECT_EQ(py_strip(ws + "a\xc3\xa9 b" + ws, std::nullopt, true, true), "a\xc3\xa9 b");
  EXPECT_EQ(py_strip(ws + "a" + ws, std::nullopt, true, false), "a" + ws);
  EXPECT_EQ(py_strip(ws + "a" + ws, std::nullopt, false, true), ws + "a");
  EXPECT_EQ(py_strip(ws, std::nullopt, true, true), "");
  for (const std::string keep : {"\xe2\x80\x8b", "\xef\xbb\xbf", "\xe1\xa0\x8e"})
    EXPECT_EQ(py_strip(" " + keep + " ", std::nullopt, true, true), keep);
  EXPECT_EQ(py_strip("\xc3\xa9\xc3\xa9x\xc3\xa9", std::string("\xc3\xa9"), true, true), "x");
  // Invalid UTF-8 reads as U+FFFD per bad byte, as before the byte-level path existed.
  EXPECT_EQ(py_strip(" \xff a\xc3", std::nullopt, true, true), "\xef\xbf\xbd a\xef\xbf\xbd");
  EXPECT_EQ(py_strip("  abcdefghijkl\xff  ", std::nullopt, true, true), "abcdefghijkl\xef\xbf\xbd");
  EXPECT_EQ(py_strip("abcdefghijklmnop\xe4\xb8", std::nullopt, true, true), "abcdefghijklmnop\xef\xbf\xbd");
  EXPECT_EQ(py_strip("abcdefgh\xed\xa0\x80 ", std::nullopt, true, true), "abcdefgh\xed\xa0\x80");  // kept as it was
}

// The byte-level path (valid UTF-8: only the ends decoded) against the definition (decode all,
// strip code points, encode) on random strings of spaces and non-spaces of every UTF-8 length.
TEST(PyStrip, EndsOnlyEqualsWholeDecode) {
  const char32_t alphabet[] = {' ', '\n', 'a', 0xa0, 0x85, 0xe9, 0x3000, 0x2028, 0x200b, 0x4e2d, 0x1f600, 0xfeff};
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::u32string u;
    for (int n = static_cast<int>(rng() % 12); n > 0; --n) u += alphabet[rng() % std::size(alphabet)];
    const std::string s = utf8_encode(u);
    const bool left = rng() % 2, right = rng() % 2;
    size_t b = 0, e = u.size();
    while (left && b < e && py_isspace(u[b])) ++b;
    while (right && e > b && py_isspace(u[e - 1])) --e;
    ASSERT_EQ(py_strip(s, std::nullopt, left, right), utf8_encode(u.substr(b, e - b))) << s;
    const std::string chars = utf8_encode(std::u32string{alphabet[rng() % 12], alphabet[rng() % 12]});
    const std::u32string set = utf8_decode(chars);
    b = 0, e = u.size();
    while (left && b < e && set.find(u[b]) != std::u32string::npos) ++b;
    while (right && e > b && set.find(u[e - 1]) != std::u32string::npos) --e;
    ASSERT_EQ(py_strip(s, chars, left, right), utf8_encode(u.substr(b, e - b))) << s;
  }
}

}  // namespace
}  // namespace sparkserve::jinja
