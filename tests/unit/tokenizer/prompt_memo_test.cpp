// The tokenizer's prompt memo (text/prompt_memo.h): a text that starts as a recently encoded one
// did is encoded from the memo's last shared added token on; its ids must be exactly those of a
// tokenizer without the memo. Differential fuzz on texts made to stress the resume rule (added
// tokens that overlap, that swallow whitespace on either side, that need non-word neighbours,
// texts cut right after or inside an added token), on the real Qwen3.5 tokenizer over chat turns,
// and invalid UTF-8 in the new tail (the error names the offset in the whole text).
#include "text/prompt_memo.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "qwen35_tokenizer.h"
#include "tiny_tokenizer.h"

namespace sparkserve {
namespace {

using testing::added_token;

std::vector<int32_t> ids(const Tokenizer& t, const std::string& text) {
  auto r = t.encode(text);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::vector<int32_t>{-1};
}

Tokenizer without_memo(const Tokenizer& t) {
  Tokenizer u = t;
  u.set_fragment_cache_bytes(0);
  EXPECT_EQ(u.prompt_memo(), nullptr);
  return u;
}

std::string random_piece(std::mt19937& rng, const std::vector<std::string>& tokens) {
  static const char* plain[] = {"a", "b", "word", " ", "  ", "\n", "\n\n", "\t", "_", ".", "é", "数", "🙂", "<", ">", "x<"};
  return rng() % 4 == 0 ? tokens[rng() % tokens.size()] : plain[rng() % std::size(plain)];
}

TEST(PromptMemo, ResumedIdsEqualFullEncodingOnAdversarialAddedTokens) {
  testing::TinySpec s;
  s.added_tokens = {added_token(1000, "<a>", true), added_token(1001, "<a>b", true),
                    added_token(1002, "a>b", true), added_token(1003, "<l>", true, false, /*lstrip=*/true),
                    added_token(1004, "<r>", true, false, false, /*rstrip=*/true),
                    added_token(1005, "<w>", true, false, false, false, /*single_word=*/true),
                    added_token(1006, "<lr>", true, false, true, true),
                    added_token(1007, "<long-token-pattern-of-forty-bytes-xxxx>", false),
                    added_token(1008, "\n\n", false)};
  const Tokenizer memo = testing::make_tiny(s);
  const Tokenizer full = without_memo(memo);
  std::vector<std::string> tokens;
  for (const auto& a : s.added_tokens) tokens.push_back(a["content"].get<std::string>());
  // Partial token texts too: a cut inside a pattern must not resume past it.
  tokens.push_back("<long-token-pattern");
  tokens.push_back("<a");
  // rstrip swallowing a pattern: the next match is searched from the match's end, inside it.
  tokens.push_back("<r>\n\n");
  tokens.push_back("<lr> \n\n\n");
  std::mt19937 rng(3);
  std::vector<std::string> texts;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    if (texts.empty() || rng() % 5 == 0) {
      while (text.size() < 1100 + rng() % 400) text += random_piece(rng, tokens);
    } else {
      // A recent text, cut anywhere (often inside or next to an added token), with a new tail.
      const std::string& base = texts[texts.size() - 1 - rng() % std::min<size_t>(texts.size(), 4)];
      size_t cut = rng() % (base.size() + 1);
      while (cut > 0 && (static_cast<unsigned char>(base[cut]) & 0xC0) == 0x80) --cut;  // a character boundary
      text = base.substr(0, cut);
      const size_t tail = rng() % 3 == 0 ? 0 : 1 + rng() % 60;
      while (text.size() < cut + tail || text.size() < 1030) text += random_piece(rng, tokens);
    }
    texts.push_back(text);
    ASSERT_EQ(ids(memo, text), ids(full, text)) << "trial " << trial;
  }
  // Most derived texts resumed (else this test would prove nothing).
  EXPECT_GT(memo.prompt_memo()->resumes(), 200u);
}

TEST(PromptMemo, ResumedIdsEqualFullEncodingOnQwen35ChatTurns) {
  auto loaded = testing::load_qwen35_tokenizer();
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  const Tokenizer& memo = *loaded;
  const Tokenizer full = without_memo(memo);
  std::mt19937 rng(9);
  static const char* words[] = {"the", " test", " fails", "\n", "  ", "école", "数据", "🙂", "x=y;", "{\"a\": 1}",
                                "<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>", "<tool_response>"};
  auto message = [&](size_t n) {
    std::string m;
    while (m.size() < n) m += words[rng() % std::size(words)];
    return m;
  };
  std::string conversation = "<|im_start|>system\n" + message(6000) + "<|im_end|>\n";
  uint64_t before = memo.prompt_memo()->resumes();
  for (int turn = 0; turn < 12; ++turn) {
    conversation += "<|im_start|>user\n" + message(100 + rng() % 1500) + "<|im_end|>\n";
    const std::string prompt = conversation + "<|im_start|>assistant\n";
    ASSERT_EQ(ids(memo, prompt), ids(full, prompt)) << "turn " << turn;
    conversation += "<|im_start|>assistant\n" + message(rng() % 800) + "<|im_end|>\n";
  }
  EXPECT_GE(memo.prompt_memo()->resumes() - before, 11u);
}

TEST(PromptMemo, InvalidUtf8AfterTheResumePointNamesItsOffsetInTheWholeText) {
  testing::TinySpec s;
  s.added_tokens = {added_token(1000, "<a>", true)};
  const Tokenizer memo = testing::make_tiny(s);
  const Tokenizer full = without_memo(memo);
  std::string base;
  while (base.size() < 2000) base += "some text <a> ";
  ASSERT_EQ(ids(memo, base), ids(full, base));
  const std::string bad = base + "tail \xC3(";
  auto a = memo.encode(bad), b = full.encode(bad);
  ASSERT_FALSE(a.ok());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(a.message(), b.message());
  EXPECT_NE(a.message().find("at byte offset " + std::to_string(base.size() + 5)), std::string::npos) << a.message();
  EXPECT_GE(memo.prompt_memo()->resumes(), 1u);
}

}  // namespace
}  // namespace sparkserve
