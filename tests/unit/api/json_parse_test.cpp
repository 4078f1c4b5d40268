// parse_json_fast against nlohmann::ordered_json::parse (the reference): on every input it either
// gives nothing, or exactly nlohmann's value (same types, key order, strings, numbers). Valid inputs
// that the fast path is meant to take must come back from it (else the test could not fail), invalid
// ones never. Inputs: hand-picked edge cases, random documents written with random escapes,
// whitespace and UTF-8, and random byte mutations of those.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "server/json_fields.h"
#include "server/json_parse.h"
#include "../../common/request_json_same.h"

namespace sparkserve {
namespace {

std::optional<RequestJson> reference(std::string_view text) {
  try {
    return RequestJson::parse(text.begin(), text.end());
  } catch (const RequestJson::exception&) {
    return std::nullopt;
  }
}

// The contract on any input; returns whether the fast path answered.
bool check(std::string_view text, const std::string& what) {
  const std::optional<RequestJson> ref = reference(text), fast = parse_json_fast(text, kMaxJsonDepth);
  if (!ref) {
    EXPECT_FALSE(fast.has_value()) << what << ": nlohmann rejects it, the fast parser took it: " << fast->dump();
    return fast.has_value();
  }
  if (fast) {
    EXPECT_TRUE(same_request_json(*fast, *ref)) << what << ": " << fast->dump() << " != " << ref->dump();
  }
  return fast.has_value();
}

TEST(JsonParseFast, EdgeCasesItTakes) {
  const std::vector<std::string> cases = {
      "{}", "[]", " \t\r\n{ \"a\" : 1 } \n", "0", "-0", "7", "-7", "18446744073709551615",  // UINT64_MAX
      "-9223372036854775808", "9223372036854775808", "1.5", "-0.0", "1e3", "1E+3", "2.5e-3", "0.1", "1e-400",
      "18446744073709551616", "-9223372036854775809", "123456789012345678901234567890",  // out of range: floats
      "true", "false", "null", "[true,false,null]", "\"\"",
      R"("\" \\ \/ \b \f \n \r \t")", R"("\u0000 \u00e9 \u00E9 \u20ac \ud83d\ude00 \uFFFF")",
      "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \xee\x80\x80 \xf4\x8f\xbf\xbf\"", "\"\x7f\"",
      R"({"a":1,"b":2,"a":3})",   // a repeated key: first place, last value
      R"({"z":{"y":[1,{"x":"w"}]},"a":[]})", R"([[[[[]]]]])", R"({"k":"v" , "l" : [ 1 , 2 ] })"};
  for (const std::string& c : cases) EXPECT_TRUE(check(c, c)) << c;
  EXPECT_EQ(parse_json_fast(R"({"a":1,"b":2,"a":3})", 64)->dump(), R"({"a":3,"b":2})");
  EXPECT_TRUE(parse_json_fast("-0", 64)->is_number_integer());
  EXPECT_TRUE(parse_json_fast("0", 64)->is_number_unsigned());
  EXPECT_TRUE(parse_json_fast("18446744073709551616", 64)->is_number_float());
}

TEST(JsonParseFast, RejectsWhatNlohmannRejects) {
  const std::vector<std::string> cases = {
      "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{,}", "{\"a\" 1}", "{1:2}", "01", "-", "-01", "1.", ".5", "1e", "1e+",
      "+1", "tru", "nul", "truex", "[1 2]", "\"abc", "\"a\x01\"", "\"\\x\"", "\"\\u12\"", "\"\\u12G4\"",
      R"("\ud83d")", R"("\ude00")", R"("\ud83d\u0041")", R"("\ud83dx")", "\"\xc0\xaf\"", "\"\xc3\"", "\"\xe0\x80\xaf\"",
      "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"", "\"\x80\"", "\"\xff\"", "1e400", "-1e400",
      "{} {}", "[] x", "1 2", std::string("{}\0", 3), "/* c */ {}", "NaN", "Infinity"};
  for (const std::string& c : cases) EXPECT_FALSE(check(c, c)) << c;
  // A byte-order mark (nlohmann skips it) and nesting beyond max_depth go to nlohmann.
  EXPECT_FALSE(parse_json_fast("\xef\xbb\xbf{}", 64).has_value());
  EXPECT_TRUE(reference("\xef\xbb\xbf{}").has_value());
  EXPECT_FALSE(parse_json_fast("[[[1]]]", 2).has_value());
  EXPECT_TRUE(parse_json_fast("[[[1]]]", 3).has_value());
}

// Each kind of special byte at every offset of a long plain run (the scan reads eight bytes at a time).
TEST(JsonParseFast, SpecialBytesAtEveryAlignment) {
  const std::vector<std::pair<std::string, bool>> specials = {
      {"\x01", false}, {"\x1f", false}, {"\xc3", false}, {"\xff", false}, {"\\n", true}, {"\\\"", true},
      {"\xc3\xa9", true}, {"\xf0\x9f\x98\x80", true}, {"\x7f", true}, {"\x20", true}};
  for (const auto& [x, valid] : specials)
    for (int k = 0; k < 24; ++k) {
      std::string d(1, '"');
      d.append(static_cast<size_t>(k), 'a').append(x).append(static_cast<size_t>(40 - k), 'b').push_back('"');
      EXPECT_EQ(check(d, "offset " + std::to_string(k)), valid) << k;
    }
}

// Random documents written by hand (not by dump): every escape form, raw and escaped UTF-8 of each
// length, surrogate pairs, numbers of every shape, random whitespace, long plain runs at every
// alignment (the eight-byte scan).
class DocWriter {
 public:
  explicit DocWriter(uint32_t seed) : g_(seed) {}
  std::string doc() {
    std::string s;
    value(s, 0);
    return ws() + s + ws();
  }

 private:
  int pick(int n) { return static_cast<int>(g_() % static_cast<uint32_t>(n)); }
  std::string ws() {
    static const char* kWs[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    return kWs[pick(7)];
  }
  void value(std::string& s, int depth) {
    switch (depth < 4 ? pick(8) : 2 + pick(6)) {
      case 0: {
        s += "{" + ws();
        const int n = pick(5);
        for (int i = 0; i < n; ++i) {
          if (i) s += "," + ws();
          string(s);
          s += ws() + ":" + ws();
          value(s, depth + 1);
          s += ws();
        }
        s += "}";
        break;
      }
      case 1: {
        s += "[" + ws();
        const int n = pick(5);
        for (int i = 0; i < n; ++i) {
          if (i) s += ws() + "," + ws();
          value(s, depth + 1);
        }
        s += ws() + "]";
        break;
      }
      case 2:
      case 3: string(s); break;
      case 4: number(s); break;
      case 5: s += pick(2) ? "true" : "false"; break;
      case 6: s += "null"; break;
      default: string(s); break;
    }
  }
  void number(std::string& s) {
    static const char* kNumbers[] = {"0", "-0", "1", "42", "-17", "3.25", "-0.5", "1e10", "6.02E+23", "1e-7",
                                     "18446744073709551615", "18446744073709551616", "-9223372036854775808",
                                     "-9223372036854775809", "0.1", "123456789", "-1.5e-300", "9007199254740993"};
    s += kNumbers[pick(static_cast<int>(std::size(kNumbers)))];
  }
  void string(std::string& s) {
    s += '"';
    const int n = pick(4) == 0 ? 200 + pick(3000) : pick(12);
    static const char* kPieces[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u00e9", "\\u20AC",
                                    "\\ud83d\\ude00", "\\u0000", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                    "\x7f", "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf"};
    for (int i = 0; i < n; ++i) {
      if (pick(8) == 0) s += kPieces[pick(static_cast<int>(std::size(kPieces)))];
      else s += plain();
    }
    s += '"';
  }
  char plain() {
    char c;
    do c = static_cast<char>(0x20 + pick(95));
    while (c == '"' || c == '\\');
    return c;
  }
  std::mt19937 g_;
};

TEST(JsonParseFast, RandomDocumentsEqualNlohmann) {
  DocWriter w(11);
  int taken = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string d = w.doc();
    taken += check(d, "document " + std::to_string(i));
  }
  EXPECT_EQ(taken, 400);  // every one of them is valid and plain enough for the fast path
}

TEST(JsonParseFast, RandomMutationsNeverDisagree) {
  DocWriter w(12);
  std::mt19937 g(13);
  static const char kBytes[] = {'"', '\\', '{', '}', '[', ']', ',', ':', 'u', 'e', '-', '.', '0', '\x00', '\x1f',
                                '\x80', '\xc3', '\xed', '\xf4', '\xff', ' '};
  int rejected = 0;
  for (int i = 0; i < 300; ++i) {
    std::string d = w.doc();
    for (int m = 0; m < 3 && !d.empty(); ++m) {
      const size_t at = g() % d.size();
      switch (g() % 3) {
        case 0: d[at] = kBytes[g() % sizeof kBytes]; break;
        case 1: d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), kBytes[g() % sizeof kBytes]); break;
        default: d.erase(at, 1); break;
      }
    }
    check(d, "mutation " + std::to_string(i));
    rejected += !reference(d).has_value();
  }
  EXPECT_GT(rejected, 100);  // the mutations did make invalid documents
}

TEST(JsonParseFast, ParseJsonObjectBodyKeepsNlohmannsErrors) {
  auto bad = parse_json_object_body(R"({"model": "x",})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("Invalid JSON body (byte"), std::string::npos) << bad.error().message;
  auto good = parse_json_object_body(R"({"model": "x", "temperature": 0.7, "max_tokens": 5})");
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)["max_tokens"].is_number_unsigned());
  EXPECT_EQ((*good)["temperature"].get<double>(), 0.7);
}

}  // namespace
}  // namespace sparkserve
