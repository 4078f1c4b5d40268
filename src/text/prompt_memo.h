// The last few long texts a Tokenizer encoded, with their ids and the points where encoding may
// resume. A chat client re-sends its whole conversation every turn, so the prompt rendered for
// turn N starts with (nearly all of) turn N-1's: encoding it again from the start re-splits and
// re-looks-up ~10K tokens' worth of text (an agent's later turn: ~0.1 ms here, ~0.4 ms on a slower
// host) to change only the tail.
//
// Exact by construction: a resume point is the end of an added token's segment in the raw split
// (AddedTokenMatcher::SplitResume). Up to there the split of any text that agrees with the memo's
// text on the point plus the matcher's lookahead bytes is the same, and the tokenizer encodes each
// plain fragment between added tokens on its own, so the ids up to there are the memo's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "text/added_tokens.h"

namespace sparkserve {

class PromptMemo {
 public:
  struct ResumePoint {
    SplitResume split;
    size_t needs = 0;    // a text must agree with the entry's on this many bytes (ascends over an entry's points)
    size_t num_ids = 0;  // ids of the text before split.segment_begin
  };
  struct Entry {
    std::string text;
    std::vector<int32_t> ids;
    std::vector<ResumePoint> points;
  };
  // Holds up to max_entries texts of at most max_text_bytes each.
  PromptMemo(size_t max_entries, size_t max_text_bytes) : max_entries_(max_entries), max_text_bytes_(max_text_bytes) {}
  PromptMemo(const PromptMemo&) = delete;
  PromptMemo& operator=(const PromptMemo&) = delete;

  // The last resume point of a remembered text whose `needs` bytes `text` agrees with (the one
  // furthest into text over all entries); point nullptr when none.
  struct Found {
    std::shared_ptr<const Entry> entry;
    const ResumePoint* point = nullptr;
  };
  Found find(std::string_view text) const;
  // Remembers an encoded text as the most recent one, forgetting the least recent beyond the bound.
  void add(std::shared_ptr<const Entry> entry);
  size_t max_text_bytes() const { return max_text_bytes_; }
  // Calls of find() that found a resume point.
  uint64_t resumes() const { return resumes_.load(); }

 private:
  mutable std::atomic<uint64_t> resumes_{0};
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<const Entry>> entries_;  // most recent first
  const size_t max_entries_, max_text_bytes_;
};

// Length of the longest common prefix of a and b.
size_t common_prefix_length(std::string_view a, std::string_view b);

}  // namespace sparkserve
