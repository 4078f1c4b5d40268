#include "text/tool_parser.h"

#include "text/python_literal.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>

namespace sparkserve {
namespace {

constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParam = "<parameter=";
constexpr std::string_view kParamEnd = "</parameter>";
constexpr size_t npos = std::string_view::npos;

size_t find_in(std::string_view s, std::string_view tag, size_t from, size_t limit) {
  if (from > s.size()) return npos;
  size_t p = s.find(tag, from);
  if (p == npos || p + tag.size() > limit) return npos;
  return p;
}

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag_overlap(std::string_view s, std::string_view tag) {
  size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t len = max; len > 0; --len) {
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

bool valid_function_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    switch (c) {
      case '{': case '}': case '<': case '>': case '"': case '\'': case ' ': case '\t':
      case '\n': case '\r':
        return false;
      default:
        break;
    }
  }
  return true;
}

// Python's `$` (no MULTILINE) also matches before a final "\n", and the lazy groups in vLLM's
// regexes stop there: a region running to the end of the text loses one trailing newline.
size_t dollar_end(std::string_view s, size_t begin, size_t end) {
  if (end > begin && s[end - 1] == '\n') return end - 1;
  return end;
}

std::string strip_one_newline_each_side(std::string_view v) {
  if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
  if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
  return std::string(v);
}

// --- Python number parsing, as int() and float() accept strings -----------------------------

std::string_view py_strip(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// Digits with single underscores between digits (PEP 515, as int()/float() accept them).
bool take_py_digits(std::string_view s, size_t& i, std::string& out) {
  size_t start = i;
  while (i < s.size()) {
    char c = s[i];
    if (c >= '0' && c <= '9') {
      out += c;
      ++i;
    } else if (c == '_' && i > start && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9' &&
               s[i - 1] != '_') {
      ++i;
    } else {
      break;
    }
  }
  return i > start;
}

// Python int(s) for base 10; nullopt when Python raises or the value is outside 64 bits.
std::optional<OrderedJson> py_int(std::string_view s) {
  s = py_strip(s);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  std::string digits;
  if (!take_py_digits(s, i, digits) || i != s.size()) return std::nullopt;
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  if (!neg) {
    if (v <= static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
      return OrderedJson(static_cast<int64_t>(v));
    return OrderedJson(static_cast<uint64_t>(v));
  }
  if (v <= static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
    return OrderedJson(-static_cast<int64_t>(v));
  if (v == (1ULL << 63)) return OrderedJson(std::numeric_limits<int64_t>::min());
  return std::nullopt;
}

// Python float(s); nullopt when Python raises.
std::optional<double> py_float(std::string_view s) {
  s = py_strip(s);
  size_t i = 0;
  std::string text;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) text += s[i++];
  std::string rest(s.substr(i));
  std::string lower = rest;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "inf" || lower == "infinity") return text == "-" ? -INFINITY : INFINITY;
  if (lower == "nan") return NAN;
  bool int_part = take_py_digits(s, i, text);
  bool frac_part = false;
  if (i < s.size() && s[i] == '.') {
    text += '.';
    ++i;
    frac_part = take_py_digits(s, i, text);
  }
  if (!int_part && !frac_part) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    text += 'e';
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) text += s[i++];
    if (!take_py_digits(s, i, text)) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return std::strtod(text.c_str(), nullptr);
}

std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// str(prop["type"]).strip().lower() when it is a string; "string" when there is no type; the
// first non-null type of an anyOf; "" for other shapes (lists), which take the literal_eval path.
std::string schema_type(const OrderedJson& prop) {
  if (!prop.is_object()) return "string";
  auto it = prop.find("type");
  if (it != prop.end()) {
    if (it->is_string()) return lower_ascii(std::string(py_strip(it->get<std::string>())));
    return "";
  }
  auto any = prop.find("anyOf");
  if (any != prop.end() && any->is_array()) {
    for (const auto& option : *any) {
      if (option.is_object()) {
        auto t = option.find("type");
        if (t != option.end() && t->is_string()) {
          std::string ty = lower_ascii(std::string(py_strip(t->get<std::string>())));
          if (ty != "null") return ty;
        }
      }
    }
  }
  return "string";
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

// --- Schemas ---------------------------------------------------------------------------------

ToolSchemas ToolSchemas::from_openai_tools(const OrderedJson& tools) {
  ToolSchemas out;
  if (!tools.is_array()) return out;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    OrderedJson props = OrderedJson::object();
    auto params = fn->find("parameters");
    if (params != fn->end() && params->is_object()) {
      auto p = params->find("properties");
      if (p != params->end() && p->is_object()) props = *p;
    }
    out.props_.emplace_back(name->get<std::string>(), std::move(props));
  }
  return out;
}

ToolSchemas ToolSchemas::from_openai_tools(const nlohmann::json& tools) {
  return from_openai_tools(OrderedJson::parse(tools.dump()));
}

const OrderedJson* ToolSchemas::properties(std::string_view name) const {
  for (const auto& [n, p] : props_)
    if (n == name) return &p;
  return nullptr;
}

// --- Value conversion --------------------------------------------------------------------------

OrderedJson convert_tool_param_value(const std::string& value, const std::string& name,
                                     const OrderedJson* properties) {
  if (lower_ascii(value) == "null") return nullptr;
  if (properties == nullptr || !properties->is_object()) return value;
  auto it = properties->find(name);
  if (it == properties->end()) return value;
  const std::string type = schema_type(*it);

  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" ||
      type == "enum")
    return value;
  if (starts_with(type, "int") || starts_with(type, "uint") || starts_with(type, "long") ||
      starts_with(type, "short") || starts_with(type, "unsigned")) {
    if (auto v = py_int(value)) return *v;
    return value;
  }
  if (starts_with(type, "num") || starts_with(type, "float")) {
    auto f = py_float(value);
    // nan/inf: Python's int() raises there, so the value stays a string.
    if (!f || !std::isfinite(*f)) return value;
    double d = *f;
    if (d != std::trunc(d)) return d;
    if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) return static_cast<int64_t>(d);
    if (d >= 0 && d < 18446744073709551616.0) return static_cast<uint64_t>(d);
    return d;  // Python writes the exact integer here; 64-bit JSON cannot (documented gap)
  }
  if (type == "boolean" || type == "bool" || type == "binary") return lower_ascii(value) == "true";
  bool container = type == "object" || type == "array" || type == "arr" || starts_with(type, "dict") ||
                   starts_with(type, "list");
  if (container) {
    OrderedJson parsed = OrderedJson::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed;
  }
  if (auto lit = parse_python_literal(value)) return *lit;
  return value;
}

// --- Calls -------------------------------------------------------------------------------------

OrderedJson ToolCall::to_openai() const {
  OrderedJson j = OrderedJson::object();
  j["id"] = id;
  j["type"] = "function";
  j["function"] = {{"name", name}, {"arguments", arguments}};
  return j;
}

OrderedJson ToolCallDelta::to_openai() const {
  OrderedJson j = OrderedJson::object();
  j["index"] = index;
  if (id) {
    j["id"] = *id;
    j["type"] = "function";
  }
  OrderedJson fn = OrderedJson::object();
  if (name) fn["name"] = *name;
  fn["arguments"] = arguments;
  j["function"] = std::move(fn);
  return j;
}

ToolCallIdGenerator random_tool_call_id_generator() {
  return [] {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static constexpr char kHex[] = "0123456789abcdef";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
    return id;
  };
}

namespace {

// One argument fragment: `{"name": value` for the first parameter, `, "name": value` after.
std::string param_fragment(bool first, const std::string& name, const OrderedJson& value) {
  return (first ? "{" : ", ") + py_json_quote(name) + ": " + py_json_dumps(value);
}

struct FunctionText {
  std::string_view text;  // after `<function=`, up to `</function>` (excluded) or region end
  bool to_region_end;     // true when no `</function>` closed it
};

// Parses one function's text; returns nullopt when the call is dropped.
std::optional<ToolCall> parse_function(std::string_view f, const ToolSchemas& schemas,
                                       const ToolCallIdGenerator& ids) {
  size_t gt = f.find('>');
  if (gt == npos) return std::nullopt;
  std::string name(f.substr(0, gt));
  if (!valid_function_name(name)) return std::nullopt;
  const OrderedJson* props = schemas.properties(name);
  OrderedJson params = OrderedJson::object();
  size_t q = gt + 1;
  while (true) {
    size_t s = f.find(kParam, q);
    if (s == npos) break;
    size_t ts = s + kParam.size();
    size_t t1 = f.find(kParamEnd, ts), t2 = f.find(kParam, ts), t3 = f.find(kFunctionEnd, ts);
    size_t end = std::min({t1, t2, t3});
    std::string_view match;
    if (end == npos) {
      match = f.substr(ts, dollar_end(f, ts, f.size()) - ts);
      q = f.size();
    } else {
      match = f.substr(ts, end - ts);
      q = end == t1 ? end + kParamEnd.size() : end;
    }
    size_t pgt = match.find('>');
    if (pgt == npos) break;
    std::string pname(match.substr(0, pgt));
    if (!params.contains(pname))
      params[pname] = convert_tool_param_value(strip_one_newline_each_side(match.substr(pgt + 1)), pname, props);
    if (end == npos) break;
  }
  ToolCall call;
  call.id = ids();
  call.name = std::move(name);
  call.arguments = py_json_dumps(params);
  return call;
}

}  // namespace

ToolParseResult parse_tool_calls(std::string_view text, const ToolSchemas& schemas,
                                 const ToolCallIdGenerator& ids) {
  ToolParseResult result;
  const size_t n = text.size();
  // Find the first call.
  size_t cut = npos;
  size_t p = 0;
  while (p <= n) {
    size_t a = text.find(kToolCall, p), b = text.find(kFunction, p);
    if (b == npos) break;
    if (a != npos && a < b) {
      size_t e = text.find(kToolCallEnd, a + kToolCall.size());
      if (e == npos || b < e) {
        cut = a;
        break;
      }
      p = e + kToolCallEnd.size();  // a block without a function stays content
    } else {
      cut = b;
      break;
    }
  }
  if (cut == npos) {
    if (n > 0) result.content = std::string(text);
    return result;
  }
  if (cut > 0) result.content = std::string(text.substr(0, cut));

  auto parse_and_add = [&](std::string_view f) {
    if (auto call = parse_function(f, schemas, ids)) result.tool_calls.push_back(std::move(*call));
  };
  p = cut;
  while (p < n) {
    size_t a = text.find(kToolCall, p), b = text.find(kFunction, p);
    if (a == npos && b == npos) break;
    if (a != npos && (b == npos || a < b)) {
      size_t start = a + kToolCall.size();
      size_t e = text.find(kToolCallEnd, start);
      std::string_view region =
          e != npos ? text.substr(start, e - start) : text.substr(start, dollar_end(text, start, n) - start);
      size_t q = 0;
      while (true) {
        size_t f = region.find(kFunction, q);
        if (f == npos) break;
        size_t body = f + kFunction.size();
        size_t fe = region.find(kFunctionEnd, body);
        if (fe == npos) {
          parse_and_add(region.substr(body));
          break;
        }
        parse_and_add(region.substr(body, fe - body));
        q = fe + kFunctionEnd.size();
      }
      p = e != npos ? e + kToolCallEnd.size() : n;
    } else {
      size_t body = b + kFunction.size();
      size_t fe = text.find(kFunctionEnd, body);
      if (fe == npos) {
        parse_and_add(text.substr(body));
        break;
      }
      parse_and_add(text.substr(body, fe - body));
      p = fe + kFunctionEnd.size();
    }
  }
  return result;
}

// --- Streaming ---------------------------------------------------------------------------------

StreamingToolParser::StreamingToolParser(ToolSchemas schemas, ToolCallIdGenerator ids)
    : schemas_(std::move(schemas)), ids_(std::move(ids)) {}

ToolStreamDelta StreamingToolParser::feed(std::string_view text) {
  ToolStreamDelta out;
  if (finished_) return out;
  buf_.append(text);
  process(false, out);
  compact();
  return out;
}

ToolStreamDelta StreamingToolParser::finish() {
  ToolStreamDelta out;
  if (finished_) return out;
  process(true, out);
  finished_ = true;
  buf_.clear();
  pos_ = 0;
  return out;
}

void StreamingToolParser::compact() {
  // Keep indices small: drop what is fully consumed (everything before pos_).
  if (pos_ == 0) return;
  if (fn_) {
    fn_->body_start -= pos_;
    fn_->params_pos -= pos_;
  }
  buf_.erase(0, pos_);
  pos_ = 0;
}

void StreamingToolParser::process(bool at_end, ToolStreamDelta& out) {
  while (true) {
    bool progressed = mode_ == Mode::kContent ? process_content(at_end, out) : process_calls(at_end, out);
    if (!progressed) break;
  }
}

bool StreamingToolParser::process_content(bool at_end, ToolStreamDelta& out) {
  const std::string_view s = buf_;
  const size_t n = s.size();
  size_t a = s.find(kToolCall, pos_), b = s.find(kFunction, pos_);
  if (a != npos && (b == npos || a < b)) {
    size_t e = s.find(kToolCallEnd, a + kToolCall.size());
    if (b != npos && (e == npos || b < e)) {
      out.content.append(s.substr(pos_, a - pos_));
      pos_ = a + kToolCall.size();
      mode_ = Mode::kCalls;
      in_block_ = true;
      return true;
    }
    if (e != npos) {  // a block without a function: content
      size_t end = e + kToolCallEnd.size();
      out.content.append(s.substr(pos_, end - pos_));
      pos_ = end;
      return true;
    }
    // An open block that may still receive a function: hold it.
    size_t end = at_end ? n : a;
    out.content.append(s.substr(pos_, end - pos_));
    pos_ = end;
    return false;
  }
  if (b != npos) {
    out.content.append(s.substr(pos_, b - pos_));
    pos_ = b;
    mode_ = Mode::kCalls;
    in_block_ = false;
    return true;
  }
  size_t hold = at_end ? 0 : std::max(partial_tag_overlap(s, kToolCall), partial_tag_overlap(s, kFunction));
  size_t end = std::max(pos_, n - hold);
  out.content.append(s.substr(pos_, end - pos_));
  pos_ = end;
  return false;
}

bool StreamingToolParser::process_calls(bool at_end, ToolStreamDelta& out) {
  const std::string_view s = buf_;
  const size_t n = s.size();
  if (fn_) {
    // The region that bounds the function: its block, or the whole text for a bare function.
    size_t region_end = npos;
    bool region_closed = false;
    if (in_block_) {
      region_end = s.find(kToolCallEnd, fn_->body_start);
      region_closed = region_end != npos;
    }
    if (!region_closed) region_end = at_end ? (in_block_ ? dollar_end(s, fn_->body_start, n) : n) : npos;
    return advance_function(region_end, region_closed, at_end, out);
  }
  // Next event: inside a block its `</tool_call>` or a `<function=`; outside, a `<tool_call>`
  // or a bare `<function=`. Whichever comes first.
  const std::string_view block_tag = in_block_ ? kToolCallEnd : kToolCall;
  const size_t t = s.find(block_tag, pos_), f = s.find(kFunction, pos_);
  if (t != npos && (f == npos || t < f)) {
    pos_ = t + block_tag.size();
    in_block_ = !in_block_;
    return true;
  }
  if (f != npos) {
    fn_ = OpenFunction{};
    fn_->body_start = f + kFunction.size();
    pos_ = f;
    return true;
  }
  if (in_block_) {
    if (at_end) pos_ = n;
    return false;
  }
  // Text between calls is dropped; keep only what could begin a tag.
  size_t hold = at_end ? 0 : std::max(partial_tag_overlap(s, kToolCall), partial_tag_overlap(s, kFunction));
  pos_ = std::max(pos_, n - hold);
  return false;
}

bool StreamingToolParser::advance_function(size_t region_end, bool region_closed, bool at_end,
                                           ToolStreamDelta& out) {
  const std::string_view s = buf_;
  OpenFunction& fn = *fn_;
  // The function's text ends at its `</function>` (inside the region) or at the region's end.
  size_t fe = s.find(kFunctionEnd, fn.body_start);
  if (fe != npos && region_end != npos && fe + kFunctionEnd.size() > region_end) fe = npos;
  size_t fn_end = fe != npos ? fe : region_end;  // npos: not known yet
  const bool known_end = fn_end != npos;

  if (!fn.header_sent && !fn.dropped) {
    size_t gt = s.find('>', fn.body_start);
    if (gt != npos && (!known_end || gt < fn_end)) {
      std::string name(s.substr(fn.body_start, gt - fn.body_start));
      if (valid_function_name(name)) {
        fn.header_sent = true;
        fn.index = static_cast<int>(calls_.size());
        ToolCall call;
        call.id = ids_();
        call.name = name;
        calls_.push_back(call);
        ToolCallDelta d;
        d.index = fn.index;
        d.id = call.id;
        d.name = name;
        out.tool_calls.push_back(std::move(d));
      } else {
        fn.dropped = true;
      }
      fn.params_pos = gt + 1;
    } else if (known_end) {
      fn.dropped = true;
      fn.params_done = true;
    } else {
      return false;  // name not complete yet
    }
  }

  // Parameters, each emitted once its end is known.
  while (!fn.params_done) {
    size_t limit = known_end ? fn_end : s.size();
    size_t ps = find_in(s, kParam, fn.params_pos, limit);
    if (ps == npos) {
      if (known_end) fn.params_done = true;
      break;
    }
    size_t ts = ps + kParam.size();
    size_t t1 = find_in(s, kParamEnd, ts, limit), t2 = find_in(s, kParam, ts, limit),
           t3 = find_in(s, kFunctionEnd, ts, limit);
    size_t end = std::min({t1, t2, t3});
    std::string_view match;
    if (end != npos) {
      match = s.substr(ts, end - ts);
      fn.params_pos = end == t1 ? end + kParamEnd.size() : end;
    } else if (known_end) {
      match = s.substr(ts, dollar_end(s, ts, fn_end) - ts);
      fn.params_done = true;
    } else {
      break;  // value still streaming
    }
    size_t pgt = match.find('>');
    if (pgt == npos) {
      fn.params_done = true;
      break;
    }
    if (!fn.dropped) emit_param(std::string(match.substr(0, pgt)), strip_one_newline_each_side(match.substr(pgt + 1)), out);
  }

  if (!known_end) return false;
  if (!fn.dropped) close_function(out);
  fn_.reset();
  if (fe != npos) {
    pos_ = fe + kFunctionEnd.size();
  } else if (region_closed) {
    pos_ = region_end + kToolCallEnd.size();
    in_block_ = false;
  } else {
    pos_ = s.size();  // end of output
  }
  (void)at_end;
  return true;
}

void StreamingToolParser::append_arguments(int index, std::string frag, ToolStreamDelta& out) {
  calls_[static_cast<size_t>(index)].arguments += frag;
  // Appends to this call's last argument delta, never to its header (whose arguments stay "").
  if (!out.tool_calls.empty() && out.tool_calls.back().index == index && !out.tool_calls.back().id) {
    out.tool_calls.back().arguments += frag;
  } else {
    ToolCallDelta d;
    d.index = index;
    d.arguments = std::move(frag);
    out.tool_calls.push_back(std::move(d));
  }
}

void StreamingToolParser::emit_param(const std::string& name, std::string value, ToolStreamDelta& out) {
  OpenFunction& fn = *fn_;
  if (fn.params.contains(name)) return;  // first value wins
  ToolCall& call = calls_[static_cast<size_t>(fn.index)];
  OrderedJson v = convert_tool_param_value(value, name, schemas_.properties(call.name));
  std::string frag = param_fragment(fn.params.empty(), name, v);
  fn.params[name] = std::move(v);
  append_arguments(fn.index, std::move(frag), out);
}

void StreamingToolParser::close_function(ToolStreamDelta& out) {
  append_arguments(fn_->index, fn_->params.empty() ? "{}" : "}", out);
}

}  // namespace sparkserve
