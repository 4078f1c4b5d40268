#include "text/python_literal.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

// Expected: json.dumps(ast.literal_eval(text), ensure_ascii=False) in CPython 3.11, or "ERR"
// when literal_eval raises (or json.dumps cannot write the result).
struct LitCase {
  const char* text;
  const char* expected;
};

class PythonLiteralTest : public ::testing::TestWithParam<LitCase> {};

TEST_P(PythonLiteralTest, MatchesCPython) {
  auto v = parse_python_literal(GetParam().text);
  std::string got = v ? py_json_dumps(*v) : "ERR";
  EXPECT_EQ(got, GetParam().expected) << GetParam().text;
}

INSTANTIATE_TEST_SUITE_P(
    Literals, PythonLiteralTest,
    ::testing::Values(
        LitCase{"{'a': 1, 'b': [True, None]}", R"({"a": 1, "b": [true, null]})"}, LitCase{"(1, 2)", "[1, 2]"},
        LitCase{"(1,)", "[1]"}, LitCase{"()", "[]"}, LitCase{"(5)", "5"}, LitCase{"'it''s'", R"("its")"},
        LitCase{"1_000", "1000"}, LitCase{"0x1F", "31"}, LitCase{"0o17", "15"}, LitCase{"0b101", "5"},
        LitCase{"-5", "-5"}, LitCase{"+5", "5"}, LitCase{"--5", "ERR"}, LitCase{"-(5)", "-5"}, LitCase{"-True", "ERR"}, LitCase{"'\\u00e9'", R"("é")"},
        LitCase{"{1: 'x', 2.5: 'y', None: 1}", R"({"1": "x", "2.5": "y", "null": 1})"},
        LitCase{"[1, 2,]", "[1, 2]"}, LitCase{"1e3", "1000.0"}, LitCase{".5", "0.5"}, LitCase{"5.", "5.0"},
        LitCase{"'a' \"b\"", R"("ab")"}, LitCase{"r'\\n'", R"("\\n")"}, LitCase{"  [1]", "[1]"},
        LitCase{"007", "ERR"}, LitCase{"0", "0"}, LitCase{"00", "0"}, LitCase{"'''multi\nline'''", R"("multi\nline")"},
        LitCase{"'\\x41\\101\\t'", R"("AA\t")"}, LitCase{"{1, 2}", "ERR"}, LitCase{"b'x'", "ERR"}, LitCase{"1j", "ERR"},
        LitCase{"f'x'", "ERR"}, LitCase{"true", "ERR"}, LitCase{"null", "ERR"}, LitCase{"x", "ERR"},
        LitCase{"[1, 2", "ERR"}, LitCase{"'unterminated", "ERR"}, LitCase{"'a\nb'", "ERR"}, LitCase{"", "ERR"},
        LitCase{"1 2", "ERR"}, LitCase{"-'a'", "ERR"}, LitCase{"9223372036854775807", "9223372036854775807"},
        LitCase{"-9223372036854775808", "-9223372036854775808"}, LitCase{"[1, # comment\n 2]", "[1, 2]"},
        LitCase{"{'k': {'n': [1, (2, 3)]}}", R"({"k": {"n": [1, [2, 3]]}})"}, LitCase{"1.5e-7", "1.5e-07"},
        LitCase{"'\\N{BULLET}'", "ERR"}, LitCase{"'\\ud800'", "ERR"}, LitCase{"None", "null"},
        LitCase{"\"日本\"", R"("日本")"}, LitCase{"{'a': 1, 'a': 2}", R"({"a": 2})"}));

TEST(PythonLiteralTest, DeepNestingIsRejectedNotACrash) {
  std::string deep(100000, '[');
  EXPECT_FALSE(parse_python_literal(deep).has_value());
  std::string ok = std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(parse_python_literal(ok).has_value());
}

}  // namespace
}  // namespace sparkserve
