#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tiny_tokenizer.h"

namespace sparkserve {
namespace {

using testing::added_token;
using testing::ids_of;
using testing::make_tiny;
using testing::TinySpec;

std::vector<TokenId> enc(const Tokenizer& t, const std::string& s) {
  auto r = t.encode(s);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::vector<TokenId>{};
}

TEST(Bpe, MergeRankDecidesTheSegmentation) {
  TinySpec a;
  a.extra_tokens = {"ab", "bc"};  // 256, 257
  a.merges = {{"a", "b"}, {"b", "c"}};
  EXPECT_EQ(enc(make_tiny(a), "abc"), (std::vector<TokenId>{256, 'c'}));
  TinySpec b = a;
  b.merges = {{"b", "c"}, {"a", "b"}};
  EXPECT_EQ(enc(make_tiny(b), "abc"), (std::vector<TokenId>{'a', 257}));
}

TEST(Bpe, MergesChainToLongerTokens) {
  TinySpec s;
  s.extra_tokens = {"bc", "abc", "abcd", " a"};  // 256..259
  s.merges = {{"b", "c"}, {"a", "bc"}, {"abc", "d"}, {" ", "a"}};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "abcd"), std::vector<TokenId>{258});
  EXPECT_EQ(enc(t, "abcdabc"), (std::vector<TokenId>{258, 257}));  // one regex piece
  EXPECT_EQ(enc(t, "xabc"), (std::vector<TokenId>{'x', 257}));
  EXPECT_EQ(enc(t, "a a"), (std::vector<TokenId>{'a', 259}));
}

TEST(Bpe, LeftmostPairWinsTies) {
  TinySpec s;
  s.extra_tokens = {"aa"};
  s.merges = {{"a", "a"}};
  EXPECT_EQ(enc(make_tiny(s), "aaa"), (std::vector<TokenId>{256, 'a'}));
  EXPECT_EQ(enc(make_tiny(s), "aaaa"), (std::vector<TokenId>{256, 256}));
}

TEST(Bpe, IgnoreMergesUsesWholeWordFirst) {
  TinySpec s;
  s.extra_tokens = {"cd"};  // in the vocab but no merge makes it
  EXPECT_EQ(enc(make_tiny(s), "cd"), (std::vector<TokenId>{'c', 'd'}));
  s.ignore_merges = true;
  EXPECT_EQ(enc(make_tiny(s), "cd"), std::vector<TokenId>{256});
  EXPECT_EQ(enc(make_tiny(s), "cde"), (std::vector<TokenId>{'c', 'd', 'e'}));
}

TEST(Bpe, LegacyStringMerges) {
  TinySpec s;
  s.extra_tokens = {" a", " ab"};
  s.merges = {{" ", "a"}, {" a", "b"}};
  s.merges_as_strings = true;  // "Ġ a" form
  EXPECT_EQ(enc(make_tiny(s), "x ab"), (std::vector<TokenId>{'x', 257}));
}

TEST(Bpe, BytesOfMultibyteText) {
  TinySpec s;
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "\xE4\xB8\xAD"), ids_of("\xE4\xB8\xAD"));
  EXPECT_EQ(t.decode(ids_of("\xE4\xB8\xAD")), "\xE4\xB8\xAD");
  // Ids that cut a character decode to its raw bytes; HF shows them as U+FFFD.
  EXPECT_EQ(t.decode(std::vector<TokenId>{0xE4, 0xB8}), "\xE4\xB8");
}

TEST(Nfc, DecomposedAccentsAreComposedBeforeBpe) {
  TinySpec s;
  s.extra_tokens = {"\xC3\xA9"};  // é as one token (256)
  s.merges = {{"\xC3", "\xA9"}};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "e\xCC\x81"), std::vector<TokenId>{256});
  EXPECT_EQ(enc(t, "\xC3\xA9"), std::vector<TokenId>{256});
  TinySpec raw = s;
  raw.normalizer = nullptr;
  EXPECT_EQ(enc(make_tiny(raw), "e\xCC\x81"), ids_of("e\xCC\x81"));
}

TEST(AddedTokens, SpecialTokensSplitTheTextFirst) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<|im_start|>", true), added_token(1001, "<think>", false)};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "x<|im_start|>y"), (std::vector<TokenId>{'x', 1000, 'y'}));
  EXPECT_EQ(enc(t, "<think><think>"), (std::vector<TokenId>{1001, 1001}));
  EXPECT_EQ(enc(t, "<|im_start"), ids_of("<|im_start"));
  EXPECT_EQ(enc(t, "<think >"), ids_of("<think >"));
  EXPECT_EQ(enc(t, "<|IM_START|>"), ids_of("<|IM_START|>"));
  EXPECT_EQ(t.vocab_size(), 1002u);
  EXPECT_TRUE(t.is_special(1000));
  EXPECT_FALSE(t.is_special(1001));
  EXPECT_TRUE(t.is_added(1001));
  EXPECT_EQ(t.special_token_ids(), std::vector<TokenId>{1000});
}

TEST(AddedTokens, LongestMatchAtTheLeftmostPosition) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<a>", true), added_token(1001, "<a>b", true), added_token(1002, "a>b", true)};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "<a>b"), std::vector<TokenId>{1001});
  EXPECT_EQ(enc(t, "<a>c"), (std::vector<TokenId>{1000, 'c'}));
  EXPECT_EQ(enc(t, "xa>b"), (std::vector<TokenId>{'x', 1002}));
}

TEST(AddedTokens, LstripRstripSwallowWhitespace) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<l>", true, false, /*lstrip=*/true),
                    added_token(1001, "<r>", true, false, false, /*rstrip=*/true)};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "x \t <l> y"), (std::vector<TokenId>{'x', 1000, ' ', 'y'}));
  EXPECT_EQ(enc(t, "x <r> \n y"), (std::vector<TokenId>{'x', ' ', 1001, 'y'}));
}

TEST(AddedTokens, SingleWordNeedsNonWordNeighbours) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<w>", true, false, false, false, /*single_word=*/true)};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "a<w>"), ids_of("a<w>"));
  EXPECT_EQ(enc(t, "<w>b"), ids_of("<w>b"));
  EXPECT_EQ(enc(t, "a <w>."), (std::vector<TokenId>{'a', ' ', 1000, '.'}));
  EXPECT_EQ(enc(t, "<w>"), std::vector<TokenId>{1000});
}

TEST(AddedTokens, NormalizedFlagChoosesRawOrNormalizedMatching) {
  TinySpec s;
  // normalized=true: matched after NFC, so the decomposed spelling matches too.
  s.added_tokens = {added_token(1000, "caf\xC3\xA9", false, /*normalized=*/true)};
  const Tokenizer t = make_tiny(s);
  EXPECT_EQ(enc(t, "cafe\xCC\x81!"), (std::vector<TokenId>{1000, '!'}));
  EXPECT_EQ(enc(t, "caf\xC3\xA9"), std::vector<TokenId>{1000});
  // normalized=false with decomposed content: matched on the raw text only.
  TinySpec r;
  r.added_tokens = {added_token(1000, "e\xCC\x81", false, /*normalized=*/false)};
  const Tokenizer u = make_tiny(r);
  EXPECT_EQ(enc(u, "e\xCC\x81"), std::vector<TokenId>{1000});
  EXPECT_EQ(enc(u, "\xC3\xA9"), ids_of("\xC3\xA9"));
}

TEST(Decode, SkipSpecialKeepsNonSpecialAddedTokens) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<|im_end|>", true), added_token(1001, "<think>", false),
                    added_token(1002, "<tool call>", false)};
  const Tokenizer t = make_tiny(s);
  const std::vector<TokenId> ids = {'h', 'i', 1000, 1001, 1002, 4242};
  EXPECT_EQ(t.decode(ids), "hi<|im_end|><think><tool call>");  // unknown id 4242 skipped, as HF
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "hi<think><tool call>");
  EXPECT_EQ(t.token_bytes(' '), " ");
  EXPECT_EQ(t.token_bytes(1001), "<think>");
  EXPECT_EQ(t.token_bytes(1002), "<tool call>");
  EXPECT_EQ(t.token_bytes(4242), "");
  EXPECT_EQ(t.token_bytes(-1), "");
  EXPECT_EQ(t.id_to_token(' '), "\xC4\xA0");
  EXPECT_EQ(t.id_to_token(1000), "<|im_end|>");
  EXPECT_EQ(t.token_to_id("<think>"), 1001);
  EXPECT_EQ(t.token_to_id("\xC4\xA0"), ' ');
  EXPECT_FALSE(t.token_to_id("nope").has_value());
}

TEST(Config, SpecialTokenStringsFromTokenizerConfig) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<|endoftext|>", true), added_token(1001, "<|im_end|>", true)};
  const Tokenizer t = make_tiny(
      s, R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}, "add_bos_token": false})");
  EXPECT_FALSE(t.bos_token().has_value());
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.eos_token_id(), 1001);
  EXPECT_EQ(t.pad_token_id(), 1000);
  EXPECT_FALSE(t.add_bos_token());
}

TEST(Errors, InvalidUtf8NamesTheOffset) {
  const Tokenizer t = make_tiny(TinySpec{});
  auto r = t.encode("abc\xE4\xB8");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("byte offset 3"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("0xe4"), std::string::npos) << r.message();
}

TEST(Errors, LoadingProblemsAreNamed) {
  const auto dir = std::filesystem::temp_directory_path() / "sparkserve_tokenizer_unit_missing";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "tokenizer.json");
  auto missing = Tokenizer::load(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no tokenizer.json"), std::string::npos) << missing.message();

  std::ofstream(dir / "tokenizer.json") << "{\"model\": {\"type\": ";
  auto malformed = Tokenizer::load(dir.string());
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.message().find("not valid JSON"), std::string::npos) << malformed.message();
  std::filesystem::remove_all(dir);

  auto unigram = Tokenizer::from_json_text(R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  ASSERT_FALSE(unigram.ok());
  EXPECT_NE(unigram.message().find("'Unigram'"), std::string::npos) << unigram.message();

  auto wordpiece = Tokenizer::from_json_text(R"({"model": {"type": "WordPiece", "vocab": {}}})");
  ASSERT_FALSE(wordpiece.ok());
  EXPECT_NE(wordpiece.message().find("'WordPiece'"), std::string::npos);

  auto j = testing::tiny_tokenizer_json(TinySpec{});
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "zz"})});
  auto bad_merge = Tokenizer::from_json_text(j.dump());
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.message().find("not in the vocab"), std::string::npos) << bad_merge.message();

  auto k = testing::tiny_tokenizer_json(TinySpec{});
  k["decoder"] = {{"type", "WordPiece"}};
  auto bad_decoder = Tokenizer::from_json_text(k.dump());
  ASSERT_FALSE(bad_decoder.ok());
  EXPECT_NE(bad_decoder.message().find("decoder type 'WordPiece'"), std::string::npos) << bad_decoder.message();

  // Found by fuzz_tokenizer: a number too large for a double, values of the wrong JSON type,
  // and ids that would make the id tables huge are errors, not exceptions or crashes.
  auto huge_number = Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": {"a": 2e999}, "merges": []}})");
  ASSERT_FALSE(huge_number.ok());
  auto k2 = testing::tiny_tokenizer_json(TinySpec{});
  k2["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 7;
  auto wrong_type = Tokenizer::from_json_text(k2.dump());
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_NE(wrong_type.message().find("unexpected value"), std::string::npos) << wrong_type.message();
  auto k3 = testing::tiny_tokenizer_json(TinySpec{});
  k3["model"]["vocab"]["zz"] = 2000000000;
  auto huge_id = Tokenizer::from_json_text(k3.dump());
  ASSERT_FALSE(huge_id.ok());
  EXPECT_NE(huge_id.message().find("'zz'"), std::string::npos) << huge_id.message();
  auto k4 = testing::tiny_tokenizer_json(TinySpec{});
  k4["added_tokens"] = {testing::added_token(2000000000, "<x>", true)};
  auto huge_added = Tokenizer::from_json_text(k4.dump());
  ASSERT_FALSE(huge_added.ok());
  EXPECT_NE(huge_added.message().find("out of range"), std::string::npos) << huge_added.message();

  auto no_model = Tokenizer::from_json_text("{}");
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.message().find("model"), std::string::npos);
  auto not_object = Tokenizer::from_json_text("[1, 2]");
  ASSERT_FALSE(not_object.ok());
}

// Fragments of 1 KB or more (the text between added tokens) are remembered (text/fragment_cache.h):
// a chat request re-sends its conversation. The ids must be what encoding the fragment afresh
// gives, wherever it sits, and a longer text that starts with a remembered one must not reuse its ids.
TEST(FragmentCache, RememberedFragmentsGiveFreshIds) {
  TinySpec s;
  s.added_tokens = {added_token(1000, "<|im_start|>", true)};
  s.extra_tokens = {"ab"};
  s.merges = {{"a", "b"}};
  std::string a;
  while (a.size() < 2000) a += "ab abc ba b  ";
  const std::string b = a + "ab";  // a remembered fragment as its prefix; the last "ab" merges
  const Tokenizer fresh = make_tiny(s);
  const auto a_ids = enc(fresh, a), b_ids = enc(fresh, b);
  const Tokenizer t = make_tiny(s);
  std::vector<TokenId> want = {1000};
  want.insert(want.end(), a_ids.begin(), a_ids.end());
  want.push_back(1000);
  want.insert(want.end(), b_ids.begin(), b_ids.end());
  for (int round = 0; round < 2; ++round) {  // round 1: both fragments come from the cache
    EXPECT_EQ(enc(t, "<|im_start|>" + a + "<|im_start|>" + b), want) << round;
    EXPECT_EQ(enc(t, a), a_ids) << round;
    EXPECT_EQ(enc(t, b), b_ids) << round;
  }
  EXPECT_NE(a_ids.size(), b_ids.size());
}

TEST(Robustness, LongWordsAndWhitespaceRuns) {
  TinySpec s;
  s.extra_tokens = {"aa", "aaaa"};
  s.merges = {{"a", "a"}, {"aa", "aa"}};
  const Tokenizer t = make_tiny(s);
  auto ids = enc(t, std::string(100001, 'a'));
  ASSERT_EQ(ids.size(), 25001u);
  EXPECT_EQ(ids.back(), 'a');
  auto ws = enc(t, std::string(300000, ' ') + "x" + std::string(300000, '\n'));
  EXPECT_EQ(ws.size(), 600001u);
}

}  // namespace
}  // namespace sparkserve
