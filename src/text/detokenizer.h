// Streaming detokenization: token ids in, complete UTF-8 text out, with stop strings.
//  - Byte-level BPE tokens can end in the middle of a UTF-8 character; those bytes are held
//    until the character completes. Bytes that can never form a character are replaced with
//    U+FFFD at once, one per maximal invalid subpart (Python's errors="replace", which HF
//    decode uses); bytes still incomplete at finish() become U+FFFD too.
//  - Text that could still grow into a stop string (a suffix that is a prefix of one) is held
//    back. When a stop string completes, the text before it is emitted (plus the stop string
//    itself with include_stop_str_in_output) and the detokenizer stops; later tokens are
//    ignored. The stop string that completes first wins (on a tie, the one starting earlier),
//    whatever the token boundaries.
//  - skip_special_tokens drops the tokens is_special() names.
// The vocabulary is reached through two functions so this does not depend on the tokenizer.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace sparkserve {

struct DetokenizerOptions {
  std::vector<std::string> stop;          // stop strings (empty ones ignored; invalid UTF-8 in
                                          // them is replaced with U+FFFD like the text)
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
};

struct DetokenizerStep {
  std::string text;        // new complete text to send
  bool stopped = false;    // a stop string matched (in this step)
  std::string stop_string; // the one that matched
};

class StreamingDetokenizer {
 public:
  using TokenBytes = std::function<std::string(int)>;  // id -> raw bytes of the token
  using IsSpecial = std::function<bool(int)>;

  StreamingDetokenizer(TokenBytes token_bytes, IsSpecial is_special, DetokenizerOptions options = {});

  DetokenizerStep push(int token_id);
  // End of generation: incomplete bytes become U+FFFD, held text is released.
  DetokenizerStep finish();
  bool stopped() const { return stopped_; }
  // Everything emitted so far.
  const std::string& text() const { return emitted_; }

 private:
  DetokenizerStep add_text(std::string text, bool at_end);

  TokenBytes token_bytes_;
  IsSpecial is_special_;
  DetokenizerOptions options_;
  std::string pending_bytes_;  // an incomplete UTF-8 sequence
  std::string held_;           // complete text that may begin a stop string
  std::string emitted_;
  bool stopped_ = false;
  bool finished_ = false;
};

// Decodes bytes as UTF-8 with errors="replace" semantics. With `final` false, a trailing
// incomplete (but so far valid) sequence is left in `rest` instead of being replaced.
std::string decode_utf8_replace(const std::string& bytes, bool final, std::string* rest = nullptr);

}  // namespace sparkserve
