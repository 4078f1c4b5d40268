// Recoverable errors (bad files, bad requests, bad templates) travel as values up to the
// boundary (CLI message, HTTP 4xx). Broken internal invariants use CHECK (check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace sparkserve {

struct Error {
  std::string message;
};

// Status: success or an Error with a message that names what is wrong.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::move(e.message)), ok_(false) {}  // NOLINT: implicit by design
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const std::string& message() const { return error_; }

 private:
  std::string error_;
  bool ok_ = true;
};

// Expected<T>: a value or an Error.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Expected(Error e) : v_(std::move(e)) {}          // NOLINT
  Expected(Status s) : v_(Error{s.message()}) {}   // NOLINT: only for failed statuses
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const std::string& message() const { return std::get<1>(v_).message; }
  Error error() const { return std::get<1>(v_); }
  Status status() const { return ok() ? Status() : Status(std::get<1>(v_)); }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(std::string message) { return Error{std::move(message)}; }

}  // namespace sparkserve

// Propagate a failed Status / Expected to the caller.
#define SS_RETURN_IF_ERROR(expr)                          \
  do {                                                    \
    auto ss_status_ = (expr);                             \
    if (!ss_status_.ok()) return ::sparkserve::Error{ss_status_.message()}; \
  } while (0)

#define SS_CONCAT_INNER(a, b) a##b
#define SS_CONCAT(a, b) SS_CONCAT_INNER(a, b)
// SS_ASSIGN_OR_RETURN(auto x, expr): x = expr.value(), or return its error.
#define SS_ASSIGN_OR_RETURN(lhs, expr) SS_ASSIGN_OR_RETURN_IMPL(SS_CONCAT(ss_tmp_, __LINE__), lhs, expr)
#define SS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)            \
  auto tmp = (expr);                                        \
  if (!tmp.ok()) return ::sparkserve::Error{tmp.message()}; \
  lhs = std::move(tmp).value()
