#include "server/json_fields.h"

#include <cmath>
#include <limits>

#include "server/json_parse.h"

namespace sparkserve {
namespace {

}  // namespace

int json_nesting_depth(std::string_view s, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

ApiResult<RequestJson> parse_json_object_body(std::string_view body) {
  // The fast parser takes valid bodies nested at most kMaxJsonDepth deep; nlohmann's parser the rest,
  // which it either parses the same way or reports.
  std::optional<RequestJson> fast = parse_json_fast(body, kMaxJsonDepth);
  if (!fast && json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return bad_request("Invalid JSON body: nesting deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels is not accepted.");
  RequestJson j;
  if (fast) {
    j = std::move(*fast);
  } else {
    try {
      j = RequestJson::parse(body.begin(), body.end());
    } catch (const nlohmann::json::parse_error& e) {
      std::string what = e.what();
      // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep "parse error at line L,
      // column C: ...".
      if (auto pos = what.find("] "); pos != std::string::npos && what.rfind("[json.", 0) == 0)
        what = what.substr(pos + 2);
      return bad_request("Invalid JSON body (byte " + std::to_string(e.byte) + "): " + what);
    } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range for a number like 1e400
      std::string what = e.what();
      if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
      return bad_request("Invalid JSON body: " + what);
    }
  }
  if (!j.is_object())
    return bad_request("The request body must be a JSON object, got " + json_type_phrase(j) + ".");
  return j;
}

std::string json_type_phrase(const RequestJson& v) {
  switch (v.type()) {
    case RequestJson::value_t::null: return "null";
    case RequestJson::value_t::object: return "an object";
    case RequestJson::value_t::array: return "an array";
    case RequestJson::value_t::string: return "a string";
    case RequestJson::value_t::boolean: return "a boolean";
    case RequestJson::value_t::number_integer:
    case RequestJson::value_t::number_unsigned: return "an integer";
    case RequestJson::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

std::optional<int64_t> json_to_int64(const RequestJson& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 itself is out of range; every double below it converts exactly.
    if (std::isfinite(d) && d == std::floor(d) && d >= -9.2233720368547758e18 && d < 9.2233720368547758e18)
      return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

FieldReader::FieldReader(const RequestJson& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

std::string FieldReader::field(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const RequestJson* FieldReader::find(const char* key) {
  known_.insert(key);
  if (error_) return nullptr;
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

const RequestJson* FieldReader::raw(const char* key) { return find(key); }

void FieldReader::fail(ApiError e) {
  if (!error_) error_ = std::move(e);
}

void FieldReader::fail_type(const char* key, const char* expected, const RequestJson& got) {
  std::string f = field(key);
  fail(bad_request("`" + f + "` must be " + expected + ", got " + json_type_phrase(got) + ".", f));
}

void FieldReader::get(const char* key, bool& out) {
  std::optional<bool> v;
  get(key, v);
  if (v) out = *v;
}

void FieldReader::get(const char* key, std::optional<bool>& out) {
  const RequestJson* v = find(key);
  if (!v) return;
  if (!v->is_boolean()) return fail_type(key, "a boolean", *v);
  out = v->get<bool>();
}

void FieldReader::get(const char* key, std::optional<int64_t>& out) {
  const RequestJson* v = find(key);
  if (!v) return;
  if (!v->is_number()) return fail_type(key, "an integer", *v);
  auto i = json_to_int64(*v);
  if (!i) {
    std::string f = field(key);
    return fail(bad_request("`" + f + "` must be an integer in the 64-bit range, got " + v->dump() +
                            ".", f));
  }
  out = *i;
}

void FieldReader::get(const char* key, std::optional<double>& out) {
  const RequestJson* v = find(key);
  if (!v) return;
  if (!v->is_number()) return fail_type(key, "a number", *v);
  out = v->get<double>();
}

void FieldReader::get(const char* key, std::optional<std::string>& out) {
  const RequestJson* v = find(key);
  if (!v) return;
  if (!v->is_string()) return fail_type(key, "a string", *v);
  out = v->get<std::string>();
}

std::vector<std::string> FieldReader::unknown_fields() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : obj_.items())
    if (!known_.count(k)) out.push_back(k);
  return out;
}

}  // namespace sparkserve
