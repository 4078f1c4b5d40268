#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

namespace sparkserve {
namespace {

// Unicode White_Space, as class members (Oniguruma's \s for UTF-8 text).
constexpr std::string_view kWhiteSpaceMembers =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: match data and a JIT stack big enough for long inputs.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(32, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string oniguruma_compatible_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        if (in_class) out += kWhiteSpaceMembers;
        else out += "[" + std::string(kWhiteSpaceMembers) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceMembers) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') { out += '^'; ++i; }
      if (i + 1 < p.size() && p[i + 1] == ']') { out += ']'; ++i; }
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Expected<Regex> Regex::compile(std::string_view pattern, bool literal) {
  const std::string translated = literal ? std::string(pattern) : oniguruma_compatible_pattern(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // PCRE2_LITERAL does not combine with PCRE2_UCP (and needs no character classes).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   options, &err, &err_offset, nullptr);
  if (code == nullptr) {
    return make_error("tokenizer.json: cannot compile Split regex '" + std::string(pattern) + "' at offset " +
                      std::to_string(err_offset) + ": " + pcre2_error_text(err));
  }
  auto owned = std::make_shared<Code>();
  owned->code = code;
  owned->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex r;
  r.code_ = std::move(owned);
  r.pattern_ = std::string(pattern);
  return r;
}

Status Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  ThreadMatchState& st = thread_match_state();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos < subject.size()) {
    const int rc = code_->jit
        ? pcre2_jit_match(code_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.context)
        : pcre2_match(code_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0 && rc != 0) {
      return make_error("regex '" + pattern_ + "' failed on a " + std::to_string(subject.size()) +
                        "-byte input: " + pcre2_error_text(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t start = ov[0], end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      pos = end;
    } else {
      // Empty match: split nothing, step over one character.
      pos = start + 1;
      while (pos < subject.size() && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return Status::Ok();
}

}  // namespace sparkserve
