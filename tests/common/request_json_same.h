// Test helper: two parsed request bodies are the same value — equal types all the way down (RequestJson's
// == calls 1, 1u and 1.0 equal), members in the same order, floating-point numbers bitwise equal (both
// sides parse the same text, and JSON has no NaN). The oracle of the fast request parser's unit test and
// fuzz target.
#pragma once

#include <cstring>

#include "server/json_parse.h"

namespace sparkserve {

inline bool same_request_json(const RequestJson& a, const RequestJson& b) {
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
      if (i.key() != j.key() || !same_request_json(*i, *j)) return false;
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_request_json(a[i], b[i])) return false;
    return true;
  }
  if (a.is_number_float()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  return a == b;
}

}  // namespace sparkserve
