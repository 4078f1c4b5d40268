// The chat template's generation prompt (the text add_generation_prompt appends) per request shape,
// remembered so that a chat request renders its template once instead of twice.
//
// The server needs where the generation prompt starts (the prefix cache saves the GDN state there,
// so the next turn of the conversation resumes from it). Finding it took a second render without
// the generation prompt. Templates append the same text for the same chat_template_kwargs whatever
// the messages, so the first request of a shape renders twice and records the text and its token
// count; later requests whose rendering ends with that text use it. A template whose suffix varies
// with the messages simply renders twice again (the text does not match), and a wrong suffix could
// only move where the state is saved, never which tokens the model sees.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace sparkserve {

class GenerationPromptSuffixes {
 public:
  struct Suffix {
    std::string text;
    int64_t tokens = 0;
  };
  // key: the request shape (chat_template_kwargs and whether tools were given).
  std::optional<Suffix> find(const std::string& key) const;
  void put(const std::string& key, Suffix suffix);

 private:
  static constexpr size_t kMaxEntries = 256;  // distinct kwargs sets kept; cleared beyond
  mutable std::mutex mu_;
  std::map<std::string, Suffix> map_;
};

}  // namespace sparkserve
