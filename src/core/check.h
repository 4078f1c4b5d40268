// CHECK: abort with file:line on a broken internal invariant (never for user input).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace sparkserve::detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "CHECK failed: %s at %s:%d%s%s\n", expr, file, line, msg[0] ? ": " : "", msg);
  std::abort();
}
}  // namespace sparkserve::detail

#define CHECK(cond) \
  do { if (!(cond)) ::sparkserve::detail::check_failed(#cond, __FILE__, __LINE__, ""); } while (0)
#define CHECK_MSG(cond, msg) \
  do { if (!(cond)) ::sparkserve::detail::check_failed(#cond, __FILE__, __LINE__, (msg)); } while (0)
