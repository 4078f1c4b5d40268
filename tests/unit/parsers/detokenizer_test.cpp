#include "text/detokenizer.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <random>

namespace sparkserve {
namespace {

// A fake vocabulary whose tokens split UTF-8 characters: "é" (C3 A9) as two byte tokens, the
// emoji 😀 (F0 9F 98 80) over three tokens, plus whole words and special tokens.
struct FakeVocab {
  std::map<int, std::string> bytes = {
      {0, "Hello"},      {1, " world"},      {2, "\xC3"},     {3, "\xA9"},       {4, "\xF0\x9F"},
      {5, "\x98"},       {6, "\x80"},        {7, "STOP"},     {8, "ST"},         {9, "OP"},
      {10, "<|im_end|>"}, {11, "<think>"},   {12, "\xFF"},    {13, "\xE2\x82"},  {14, "!"},
      {15, "\n"},        {16, "caf"},        {17, "x"},
  };
  std::set<int> special = {10};
  StreamingDetokenizer make(DetokenizerOptions o = {}) const {
    return StreamingDetokenizer([this](int id) { return bytes.at(id); },
                                [this](int id) { return special.count(id) > 0; }, std::move(o));
  }
};

std::vector<std::string> run(StreamingDetokenizer& d, const std::vector<int>& ids, DetokenizerStep* last = nullptr) {
  std::vector<std::string> steps;
  for (int id : ids) {
    DetokenizerStep s = d.push(id);
    steps.push_back(s.text);
    if (last && s.stopped) *last = s;
  }
  DetokenizerStep f = d.finish();
  steps.push_back(f.text);
  if (last && f.stopped) *last = f;
  return steps;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

bool valid_utf8(const std::string& s) {
  std::string rest;
  return decode_utf8_replace(s, false, &rest) == s && rest.empty();
}

TEST(DetokenizerTest, HoldsSplitCharacters) {
  FakeVocab v;
  auto d = v.make();
  std::vector<std::string> steps = run(d, {16, 2, 3, 4, 5, 6, 14});
  // "caf", "" (C3 held), "é", "" , "", "😀", "!", finish "".
  EXPECT_EQ(steps, (std::vector<std::string>{"caf", "", "\xC3\xA9", "", "", "\xF0\x9F\x98\x80", "!", ""}));
  for (const auto& s : steps) EXPECT_TRUE(valid_utf8(s));
  EXPECT_EQ(d.text(), "café😀!");
}

TEST(DetokenizerTest, IncompleteAtEndBecomesReplacement) {
  FakeVocab v;
  auto d = v.make();
  EXPECT_EQ(joined(run(d, {0, 4, 5})), "Hello\xEF\xBF\xBD");  // Python: b"\xf0\x9f\x98".decode(errors="replace")
}

TEST(DetokenizerTest, InvalidBytesReplacedAsPythonDoes) {
  // Each maximal invalid subpart is one U+FFFD (CPython's errors="replace").
  EXPECT_EQ(decode_utf8_replace("a\xFF" "b", true), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(decode_utf8_replace("\xE2\x82(", true), "\xEF\xBF\xBD(");
  EXPECT_EQ(decode_utf8_replace("\xE0\x80", true), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(decode_utf8_replace("\xED\xA0\x80", true), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(decode_utf8_replace("\xF4\x90\x80\x80", true), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(decode_utf8_replace("\xC0\xAF", true), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  std::string rest;
  EXPECT_EQ(decode_utf8_replace("ok\xF0\x9F\x98", false, &rest), "ok");
  EXPECT_EQ(rest, "\xF0\x9F\x98");
  FakeVocab v;
  auto d = v.make();
  EXPECT_EQ(joined(run(d, {17, 12, 17, 13, 14})), "x\xEF\xBF\xBDx\xEF\xBF\xBD!");
}

TEST(DetokenizerTest, SkipSpecialTokens) {
  FakeVocab v;
  auto d = v.make();
  EXPECT_EQ(joined(run(d, {0, 10, 1})), "Hello world");
  DetokenizerOptions keep;
  keep.skip_special_tokens = false;
  auto k = v.make(keep);
  EXPECT_EQ(joined(run(k, {0, 10, 1})), "Hello<|im_end|> world");
  // A special token between the two halves of a character does not break it.
  auto e = v.make();
  EXPECT_EQ(joined(run(e, {2, 10, 3})), "é");
}

TEST(DetokenizerTest, StopStringSpanningTokens) {
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"STOP"};
  auto d = v.make(o);
  DetokenizerStep last;
  std::vector<std::string> steps = run(d, {0, 8, 9, 1}, &last);
  // "ST" is held (could become STOP); at "OP" the stop matches and nothing after it is emitted.
  EXPECT_EQ(steps, (std::vector<std::string>{"Hello", "", "", "", ""}));
  EXPECT_TRUE(last.stopped);
  EXPECT_EQ(last.stop_string, "STOP");
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.text(), "Hello");
}

TEST(DetokenizerTest, HeldPrefixReleasedWhenItDiverges) {
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"STOP"};
  auto d = v.make(o);
  EXPECT_EQ(d.push(8).text, "");
  EXPECT_EQ(d.push(14).text, "ST!");
  EXPECT_EQ(d.push(8).text, "");
  EXPECT_EQ(d.finish().text, "ST");  // end of generation releases the held prefix
  EXPECT_FALSE(d.stopped());
}

TEST(DetokenizerTest, IncludeStopString) {
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"STOP"};
  o.include_stop_str_in_output = true;
  auto d = v.make(o);
  EXPECT_EQ(joined(run(d, {0, 7, 1})), "HelloSTOP");
}

TEST(DetokenizerTest, StopStringWithMultibyteCharacterAcrossTokens) {
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"é!"};
  auto d = v.make(o);
  EXPECT_EQ(joined(run(d, {16, 2, 3, 14, 1})), "caf");
}

TEST(DetokenizerTest, FirstCompletedStopWinsWhateverTheChunking) {
  // "bc" completes before "abcd": a token-by-token check stops at "bc".
  std::map<int, std::string> vocab = {{0, "a"}, {1, "b"}, {2, "c"}, {3, "d"}, {4, "abcd"}, {5, "bcd"}};
  DetokenizerOptions o;
  o.stop = {"abcd", "bc"};
  auto mk = [&] { return StreamingDetokenizer([&](int id) { return vocab.at(id); }, [](int) { return false; }, o); };
  auto d1 = mk();
  EXPECT_EQ(joined(run(d1, {0, 1, 2, 3})), "a");
  auto d2 = mk();
  EXPECT_EQ(joined(run(d2, {4})), "a");
  auto d3 = mk();
  EXPECT_EQ(joined(run(d3, {0, 5})), "a");
}

TEST(DetokenizerTest, RandomTokenStreamsEqualWholeDecode) {
  // Any token sequence: the streamed pieces are valid UTF-8 and add up to the one-shot decode.
  FakeVocab v;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int> ids;
    std::string bytes;
    int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      int id = static_cast<int>(rng() % 18);
      ids.push_back(id);
      if (!v.special.count(id)) bytes += v.bytes.at(id);
    }
    auto d = v.make();
    std::vector<std::string> steps = run(d, ids);
    for (const auto& s : steps) ASSERT_TRUE(valid_utf8(s));
    ASSERT_EQ(joined(steps), decode_utf8_replace(bytes, true));
  }
}

TEST(DetokenizerTest, EmptyStopStringsIgnoredAndNothingAfterStop) {
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"", "world"};
  auto d = v.make(o);
  EXPECT_EQ(d.push(0).text, "Hello");
  DetokenizerStep s = d.push(1);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, " ");
  EXPECT_EQ(d.push(0).text, "");
  EXPECT_FALSE(d.finish().stopped);
}

TEST(DetokenizerTest, InvalidUtf8StopStringNeverSplitsACharacter) {
  // Found by fuzz_detokenizer: a stop string starting with a continuation byte matched inside
  // "é" and the half character was emitted. Stop strings are now decoded like the text.
  FakeVocab v;
  DetokenizerOptions o;
  o.stop = {"\xA9\xF0\x9F"};
  auto d = v.make(o);
  std::vector<std::string> steps = run(d, {16, 2, 3, 4, 5, 6});
  for (const auto& s : steps) EXPECT_TRUE(valid_utf8(s));
  EXPECT_EQ(joined(steps), "café😀");
}

}  // namespace
}  // namespace sparkserve
