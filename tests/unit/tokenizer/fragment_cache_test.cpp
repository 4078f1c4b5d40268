// The tokenizer's fragment cache (text/fragment_cache.h): bounded LRU accounting, and exactness on
// the real Qwen3.5 tokenizer: multi-turn conversations rendered by the Qwen3.5 chat template and
// tokenized turn after turn (each turn re-sending the earlier ones, so their fragments come from the
// cache) give the ids a tokenizer with an empty cache gives, from one thread and from several.
#include "text/fragment_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "qwen35_tokenizer.h"
#include "text/chat_template.h"

namespace sparkserve {
namespace {

std::vector<int32_t> ids_of(FragmentCache& c, const std::string& text) {
  std::vector<int32_t> out;
  if (!c.append(text, out)) out = {-1};
  return out;
}

TEST(FragmentCache, EvictsLeastRecentlyUsedWithinItsBound) {
  // Each entry costs 100 text bytes + 4 ids of 4 bytes = 116; 400 bytes hold three.
  FragmentCache c(400);
  const std::string a(100, 'a'), b(100, 'b'), d(100, 'd'), e(100, 'e');
  c.put(a, {1, 1, 1, 1});
  c.put(b, {2, 2, 2, 2});
  c.put(d, {3, 3, 3, 3});
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.bytes(), 348u);
  EXPECT_EQ(ids_of(c, a), (std::vector<int32_t>{1, 1, 1, 1}));  // a is now the most recent
  c.put(e, {4, 4, 4, 4});                                          // evicts b, the least recent
  EXPECT_EQ(c.size(), 3u);
  EXPECT_LE(c.bytes(), c.max_bytes());
  EXPECT_EQ(ids_of(c, b), std::vector<int32_t>{-1});
  EXPECT_EQ(ids_of(c, a), (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(ids_of(c, d), (std::vector<int32_t>{3, 3, 3, 3}));
  EXPECT_EQ(ids_of(c, e), (std::vector<int32_t>{4, 4, 4, 4}));
  // append adds to what is there; a lookup of a prefix or an extension of a key misses.
  std::vector<int32_t> out = {9};
  EXPECT_TRUE(c.append(e, out));
  EXPECT_EQ(out, (std::vector<int32_t>{9, 4, 4, 4, 4}));
  EXPECT_EQ(ids_of(c, e.substr(1)), std::vector<int32_t>{-1});
  EXPECT_EQ(ids_of(c, e + "e"), std::vector<int32_t>{-1});
  // More than half the bound is never kept; putting a cached text again changes nothing.
  c.put(std::string(201, 'f'), {5});
  EXPECT_EQ(ids_of(c, std::string(201, 'f')), std::vector<int32_t>{-1});
  c.put(e, {7});
  EXPECT_EQ(ids_of(c, e), (std::vector<int32_t>{4, 4, 4, 4}));
  EXPECT_EQ(c.size(), 3u);
}

const Tokenizer& qwen35() {
  static const Tokenizer* t = [] {
    auto tok = testing::load_qwen35_tokenizer();
    if (!tok.ok()) {
      ADD_FAILURE() << tok.message();
      std::abort();
    }
    return new Tokenizer(std::move(*tok));
  }();
  return *t;
}

const ChatTemplate& qwen35_template() {
  static const ChatTemplate* t = [] {
    const std::string dir = std::string(SPARKSERVE_SOURCE_DIR) + "/tests/fixtures/templates/";
    auto tmpl = chat_template_from_source(testing::read_fixture_file(dir + "qwen3.5.jinja"), "qwen3.5.jinja", "");
    if (!tmpl.ok()) {
      ADD_FAILURE() << tmpl.message();
      std::abort();
    }
    return new ChatTemplate(std::move(*tmpl));
  }();
  return *t;
}

// Random text: words, unicode, digits, whitespace runs, and now and then an added token's text
// (which splits the fragment there).
std::string random_text(std::mt19937& rng, size_t min_bytes) {
  static const char* pieces[] = {"the", "test", " fails", "\n", "\n\n", "  ", "\t", "école", "数据", "🙂", "1234", "x=y;",
                                 "()",  "ﬁ",    "é",      "e\u0301"};
  static const char* added[] = {"<tool_response>", "</think>", "<|im_end|>"};
  std::string s;
  while (s.size() < min_bytes || rng() % 8 != 0) {
    s += rng() % 400 == 0 ? added[rng() % std::size(added)] : pieces[rng() % std::size(pieces)];
    if (rng() % 3 == 0) s += ' ';
  }
  return s;
}

// The rendered prompt of each turn of a random conversation: a system prompt (shared by the
// conversations of one seed group), then user / assistant turns of 1-3 KB.
std::vector<std::string> conversation(uint32_t seed, const std::string& system) {
  std::mt19937 rng(seed);
  OrderedJson messages = OrderedJson::array({{{"role", "system"}, {"content", system}}});
  std::vector<std::string> turns;
  for (int turn = 0; turn < 6; ++turn) {
    messages.push_back({{"role", "user"}, {"content", random_text(rng, 200 + rng() % 3000)}});
    OrderedJson req = {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", rng() % 2 == 0}}}};
    auto r = render_chat_request(qwen35_template(), req);
    EXPECT_TRUE(r.ok()) << r.message();
    turns.push_back(r.ok() ? *r : std::string());
    messages.push_back({{"role", "assistant"}, {"content", random_text(rng, rng() % 1500)}});
  }
  return turns;
}

std::vector<int32_t> encode(const Tokenizer& t, const std::string& text) {
  auto ids = t.encode(text);
  EXPECT_TRUE(ids.ok()) << ids.message();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// The ids of every turn of `convs` from a tokenizer without the fragment cache.
std::vector<std::vector<std::vector<int32_t>>> uncached_ids(const std::vector<std::vector<std::string>>& convs) {
  Tokenizer uncached = qwen35();
  uncached.set_fragment_cache_bytes(0);
  std::vector<std::vector<std::vector<int32_t>>> out;
  for (const auto& turns : convs) {
    out.emplace_back();
    for (const std::string& text : turns) out.back().push_back(encode(uncached, text));
  }
  return out;
}

TEST(FragmentCache, CachedIdsEqualUncachedOnesTurnAfterTurn) {
  std::mt19937 rng(11);
  std::vector<std::vector<std::string>> convs;
  for (uint32_t c = 0; c < 4; ++c) convs.push_back(conversation(100 + c, random_text(rng, 4000 + rng() % 8000)));
  const auto want = uncached_ids(convs);
  Tokenizer t = qwen35();  // a copy: its own, empty fragment cache
  for (size_t c = 0; c < convs.size(); ++c)
    for (size_t turn = 0; turn < convs[c].size(); ++turn) ASSERT_EQ(encode(t, convs[c][turn]), want[c][turn]);
  // The cache held the conversations' long fragments (else this test would prove nothing): at
  // least the four system prompts and most user turns.
  EXPECT_GE(t.fragment_cache().size(), 4u + 4u * 3u);
}

TEST(FragmentCache, SharedByThreadsExactly) {
  std::mt19937 rng(5);
  const std::string system = random_text(rng, 9000);
  std::vector<std::vector<std::string>> convs;
  for (uint32_t c = 0; c < 4; ++c) convs.push_back(conversation(200 + c, system));
  const auto want = uncached_ids(convs);
  const Tokenizer t = qwen35();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(convs.size(), 0);
  for (size_t c = 0; c < convs.size(); ++c)
    threads.emplace_back([&, c] {
      for (int round = 0; round < 3; ++round)
        for (size_t turn = 0; turn < convs[c].size(); ++turn) {
          auto ids = t.encode(convs[c][turn]);
          if (!ids.ok() || *ids != want[c][turn]) ++mismatches[c];
        }
    });
  for (auto& th : threads) th.join();
  for (size_t c = 0; c < convs.size(); ++c) EXPECT_EQ(mismatches[c], 0) << "conversation " << c;
  EXPECT_GE(t.fragment_cache().size(), 1u + 4u * 3u);  // the shared system prompt and user turns
}

}  // namespace
}  // namespace sparkserve
