#include "text/json_grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace sparkserve {
namespace {

using Kind = JsonNode::Kind;

// Phases of each kind of frame.
enum : uint8_t { kRootStart = 0, kRootDone = 1 };
enum : uint8_t { kObjOpen = 0, kObjFirst, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNext };
enum : uint8_t { kArrOpen = 0, kArrFirst, kArrAfter, kArrNext };
enum : uint8_t { kStrOpen = 0, kStrBody };

constexpr uint8_t kMaxIntDigits = 18, kMaxFracDigits = 18, kMaxExpDigits = 2;  // 1e99 * 10^18 stays finite
constexpr uint8_t kBoundedIntDigits = 15, kBoundedFracDigits = 6;

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

// Whitespace in a gap between JSON tokens: at most `max_newlines` newlines, then at most
// kMaxIndent spaces / tabs (ws = newlines << 6 | indent). "\n    ", " ", "" and (at the root)
// "\n\n" are written; runs such as "\r\n\r\n\r\n" are not.
bool gap_whitespace(JsonFrame& f, uint8_t b, int max_newlines) {
  const int nl = f.ws >> 6, indent = f.ws & 63;
  if (b == '\n') {
    if (indent != 0 || nl >= max_newlines) return false;
    f.ws = static_cast<uint8_t>((nl + 1) << 6);
    return true;
  }
  if (b == ' ' || b == '\t') {
    if (indent >= JsonMatcher::kMaxIndent) return false;
    ++f.ws;
    return true;
  }
  return false;  // '\r'
}

bool is_bounded(const JsonNode& n) { return n.minimum.has_value() || n.maximum.has_value(); }

// Whether a property at index >= from is required.
bool required_from(const JsonNode& n, size_t from) {
  for (size_t j = from; j < n.properties.size(); ++j)
    if (n.properties[j].required) return true;
  return false;
}

// Properties that may be written next: from `from` up to and including the first required one.
uint64_t key_range(const JsonNode& n, size_t from) {
  uint64_t m = 0;
  for (size_t j = from; j < n.properties.size(); ++j) {
    m |= uint64_t{1} << j;
    if (n.properties[j].required) break;
  }
  return m;
}

// The code points a partly read UTF-8 character can still become: the bits read so far, the
// range the next byte may take (this excludes overlongs and surrogates: after E0 only U+0800..,
// not U+0000..), then any continuation bytes. Refusing a byte that no code point the pattern
// takes can complete keeps the decoder from getting stuck inside a character.
void partial_range(const Utf8Stepper& u, char32_t& lo, char32_t& hi) {
  const unsigned rest = 6u * (u.need - 1u);
  lo = ((u.cp << 6) | (u.lo & 0x3Fu)) << rest;
  hi = (((u.cp << 6) | (u.hi & 0x3Fu)) << rest) | ((char32_t{1} << rest) - 1);
}

// One byte of a character (UTF-8 checked); with a pattern, the code point must continue it, and
// a partial character must still be able to.
bool step_char_byte(JsonLeaf& l, const RegexNfa* re, uint8_t b) {
  const auto r = l.utf8.feed(b);
  if (r == Utf8Stepper::kBad) return false;
  if (!re) return true;
  if (r == Utf8Stepper::kChar) return re->step(l.re, l.utf8.cp);
  char32_t lo = 0, hi = 0;
  partial_range(l.utf8, lo, hi);
  return re->can_step_range(l.re, lo, hi);
}

// Whether some value in [a, b] satisfies the node's bounds. The values a number prefix can
// still become form a grid (integers, or 10^-kBoundedFracDigits steps) from a to b with both
// ends on it, so comparing the ends with the bounds, exclusive or not, is exact.
bool interval_meets_bounds(long double a, long double b, const JsonNode& n) {
  if (n.minimum) {
    const long double m = *n.minimum;
    if (n.exclusive_minimum ? !(b > m) : !(b >= m)) return false;
  }
  if (n.maximum) {
    const long double m = *n.maximum;
    if (n.exclusive_maximum ? !(a < m) : !(a <= m)) return false;
  }
  return true;
}

}  // namespace

int32_t JsonGrammar::any_value() {
  if (any_value_ >= 0) return any_value_;
  any_value_ = add(JsonNode{});  // kAnyOf, alternatives below
  JsonNode obj;
  obj.kind = Kind::kObject;
  obj.additional = any_value_;
  JsonNode arr;
  arr.kind = Kind::kArray;
  arr.items = any_value_;
  JsonNode str;
  str.kind = Kind::kString;
  JsonNode num;
  num.kind = Kind::kNumber;
  JsonNode lit;
  lit.kind = Kind::kLiterals;
  lit.literals = {"false", "null", "true"};
  std::vector<int32_t> alts = {add(std::move(obj)), add(std::move(arr)), add(std::move(str)), add(std::move(num)),
                               add(std::move(lit))};
  nodes[static_cast<size_t>(any_value_)].alternatives = std::move(alts);
  return any_value_;
}

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar) : g_(std::move(grammar)) {}

JsonMatchState JsonMatcher::initial() const {
  JsonThread t;
  t.stack.push_back(JsonFrame{});  // the root pseudo-value
  if (g_->raw) {
    // Raw text starts at once (no whitespace before it, and it may be empty).
    const JsonNode& n = node(g_->root);
    JsonFrame f;
    f.node = g_->root;
    if (n.kind == Kind::kLiterals) f.hi = static_cast<uint16_t>(n.literals.size());
    t.stack.push_back(f);
    if (n.regex >= 0) t.leaf.re = g_->regexes[static_cast<size_t>(n.regex)].initial();
  }
  JsonMatchState s;
  s.threads.push_back(std::move(t));
  return s;
}

bool JsonMatcher::step(JsonMatchState& s, uint8_t byte) const {
  std::vector<JsonThread> out;
  for (const JsonThread& t : s.threads) step_thread(t, byte, out);
  if (out.empty()) return false;
  // Branches that met again (alternatives accepting the same value) are merged.
  std::vector<JsonThread> unique;
  unique.reserve(out.size());
  for (auto& t : out)
    if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(std::move(t));
  if (unique.size() > kMaxThreads) unique.resize(kMaxThreads);  // fewer branches: a subset of the language
  s.threads = std::move(unique);
  return true;
}

bool JsonMatcher::step_all(JsonMatchState& s, std::string_view bytes) const {
  JsonMatchState t = s;
  for (char c : bytes)
    if (!step(t, static_cast<uint8_t>(c))) return false;
  s = std::move(t);
  return true;
}

bool JsonMatcher::accepting(const JsonMatchState& s) const {
  return std::any_of(s.threads.begin(), s.threads.end(), [&](const JsonThread& t) { return can_finish(t); });
}

std::optional<uint32_t> JsonMatcher::plain_string_room(const JsonMatchState& s) const {
  if (s.threads.size() != 1) return std::nullopt;
  const JsonThread& t = s.threads[0];
  const JsonFrame& f = t.stack.back();
  if (f.node < 0) return std::nullopt;
  const JsonNode& n = node(f.node);
  // An undeclared object key that no declared name matches any more: free text up to '"'.
  if (n.kind == Kind::kObject && f.phase == kObjKey && f.keys == 0 && f.free_key && t.leaf.utf8.need == 0)
    return JsonNode::kUnbounded;
  if (n.kind != Kind::kString || f.phase != kStrBody || n.regex >= 0 || t.leaf.esc != 0 || t.leaf.utf8.need != 0)
    return std::nullopt;
  return n.max_length == JsonNode::kUnbounded ? JsonNode::kUnbounded : n.max_length - t.leaf.chars;
}

void JsonMatcher::end_value(JsonThread& t) const {
  t.stack.pop_back();
  t.leaf = JsonLeaf{};
  JsonFrame& p = t.stack.back();
  p.ws = 0;
  if (p.node < 0) {
    p.phase = kRootDone;
    return;
  }
  const JsonNode& n = node(p.node);
  if (n.kind == Kind::kObject) {
    p.phase = kObjAfter;
    p.value = -1;
  } else {  // array
    ++p.count;
    p.phase = kArrAfter;
  }
}

bool JsonMatcher::may_end(const JsonThread& t) const {
  const JsonFrame& f = t.stack.back();
  if (f.node < 0) return false;
  const JsonNode& n = node(f.node);
  const JsonLeaf& l = t.leaf;
  switch (n.kind) {
    case Kind::kNumber:
      return (l.num == 2 || l.num == 3 || l.num == 5 || l.num == 8) && number_in_bounds(l, n);
    case Kind::kLiterals:
      return f.lo < f.hi && n.literals[f.lo].size() == f.pos;
    case Kind::kText:
      return l.utf8.need == 0 && g_->regexes[static_cast<size_t>(n.regex)].accepting(l.re);
    default:
      return false;
  }
}

bool JsonMatcher::can_finish(JsonThread t) const {
  while (true) {
    const JsonFrame& f = t.stack.back();
    if (f.node < 0) return f.phase == kRootDone;
    if (!may_end(t)) return false;
    end_value(t);
  }
}

void JsonMatcher::begin_value(JsonThread t, int32_t id, uint8_t b, std::vector<JsonThread>& out) const {
  const JsonNode& n = node(id);
  if (n.kind == Kind::kAnyOf) {
    for (int32_t alt : n.alternatives) begin_value(t, alt, b, out);
    return;
  }
  if (t.stack.size() > kMaxDepth) return;  // the root pseudo-frame does not count
  JsonFrame f;
  f.node = id;
  if (n.kind == Kind::kLiterals) f.hi = static_cast<uint16_t>(n.literals.size());
  t.stack.push_back(f);
  t.leaf = JsonLeaf{};
  if (n.regex >= 0) t.leaf.re = g_->regexes[static_cast<size_t>(n.regex)].initial();
  step_thread(std::move(t), b, out);
}

void JsonMatcher::step_thread(JsonThread t, uint8_t b, std::vector<JsonThread>& out) const {
  JsonFrame& f = t.stack.back();
  if (f.node < 0) {
    if (f.phase != kRootStart) return;
    if (!g_->raw && is_ws(b)) {
      if (gap_whitespace(f, b, 2)) out.push_back(std::move(t));
      return;
    }
    begin_value(std::move(t), g_->root, b, out);
    return;
  }
  const JsonNode& n = node(f.node);
  switch (n.kind) {
    case Kind::kObject:
      step_object(t, b, out);
      return;
    case Kind::kArray:
      step_array(t, b, out);
      return;
    case Kind::kString: {
      if (f.phase == kStrOpen) {
        if (b != '"') return;
        f.phase = kStrBody;
        out.push_back(std::move(t));
        return;
      }
      bool closed = false;
      if (!step_string_body(t, n, b, closed)) return;
      if (closed) end_value(t);
      out.push_back(std::move(t));
      return;
    }
    case Kind::kNumber: {
      JsonThread c = t;
      if (step_number(c, n, b)) {
        out.push_back(std::move(c));
      } else if (may_end(t)) {  // the byte belongs to the enclosing value
        end_value(t);
        step_thread(std::move(t), b, out);
      }
      return;
    }
    case Kind::kLiterals: {
      JsonThread c = t;
      if (step_literal(c.stack.back(), n, b)) {
        const JsonFrame& cf = c.stack.back();
        if (cf.hi - cf.lo == 1 && n.literals[cf.lo].size() == cf.pos) end_value(c);
        out.push_back(std::move(c));
      } else if (may_end(t)) {
        end_value(t);
        step_thread(std::move(t), b, out);
      }
      return;
    }
    case Kind::kText:
      if (step_text(t, n, b)) out.push_back(std::move(t));
      return;
    case Kind::kAnyOf:
      return;  // expanded by begin_value, never on the stack
  }
}

void JsonMatcher::step_object(JsonThread& t, uint8_t b, std::vector<JsonThread>& out) const {
  JsonFrame& f = t.stack.back();
  const JsonNode& n = node(f.node);
  const bool gap = f.phase == kObjFirst || f.phase == kObjColon || f.phase == kObjValue || f.phase == kObjAfter ||
                   f.phase == kObjNext;
  if (gap && is_ws(b)) {
    if (gap_whitespace(f, b, 1)) out.push_back(std::move(t));
    return;
  }
  const bool may_close = !required_from(n, f.prop);
  switch (f.phase) {
    case kObjOpen:
      if (b != '{') return;
      f.phase = kObjFirst;
      f.ws = 0;
      out.push_back(std::move(t));
      return;
    case kObjFirst:
    case kObjNext:
      if (b == '"') {
        const bool free_key = n.additional >= 0 && may_close;
        if (key_range(n, f.prop) == 0 && !free_key) return;
        f.phase = kObjKey;
        f.pos = 1;
        f.keys = n.properties.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n.properties.size()) - 1;
        f.free_key = free_key;
        t.leaf = JsonLeaf{};
        out.push_back(std::move(t));
      } else if (b == '}' && f.phase == kObjFirst && may_close) {
        end_value(t);
        out.push_back(std::move(t));
      }
      return;
    case kObjKey: {
      bool closed = false;
      if (!step_key(f, t.leaf, n, b, closed)) return;
      if (closed) {
        f.phase = kObjColon;
        f.ws = 0;
        f.keys = 0;
        f.pos = 0;
        f.free_key = false;
        t.leaf = JsonLeaf{};
      }
      out.push_back(std::move(t));
      return;
    }
    case kObjColon:
      if (b != ':') return;
      f.phase = kObjValue;
      f.ws = 0;
      out.push_back(std::move(t));
      return;
    case kObjValue: {
      const int32_t v = f.value;
      begin_value(std::move(t), v, b, out);
      return;
    }
    case kObjAfter:
      if (b == ',') {
        if (f.prop >= n.properties.size() && n.additional < 0) return;  // nothing left to write
        f.phase = kObjNext;
        f.ws = 0;
        out.push_back(std::move(t));
      } else if (b == '}' && may_close) {
        end_value(t);
        out.push_back(std::move(t));
      }
      return;
    default:
      return;
  }
}

bool JsonMatcher::step_key(JsonFrame& f, JsonLeaf& leaf, const JsonNode& n, uint8_t b, bool& closed) const {
  closed = false;
  uint64_t keys = 0;
  int complete = -1;
  for (uint64_t m = f.keys; m != 0; m &= m - 1) {
    const auto j = static_cast<size_t>(__builtin_ctzll(m));
    const std::string& k = n.properties[j].key_json;
    if (f.pos >= k.size() || static_cast<uint8_t>(k[f.pos]) != b) continue;
    if (f.pos + 1u == k.size()) complete = static_cast<int>(j);
    else keys |= uint64_t{1} << j;
  }
  if (complete >= 0) {
    // A declared key, written in full: usable only if it may come next (not repeated, not
    // skipping a required one); it also rules out an undeclared key with the same name.
    if (!(key_range(n, f.prop) >> complete & 1)) return false;
    f.value = n.properties[static_cast<size_t>(complete)].value;
    f.prop = static_cast<uint16_t>(complete + 1);
    closed = true;
    return true;
  }
  bool free_key = f.free_key;
  if (free_key) {
    if (b == '"') {
      if (leaf.utf8.need != 0) return false;
      f.value = n.additional;
      f.prop = static_cast<uint16_t>(n.properties.size());
      closed = true;
      return true;
    }
    free_key = b >= 0x20 && b != '\\' && leaf.utf8.feed(b) != Utf8Stepper::kBad;
  }
  if ((keys & key_range(n, f.prop)) == 0 && !free_key) return false;
  f.keys = keys;
  f.free_key = free_key;
  ++f.pos;
  return true;
}

void JsonMatcher::step_array(JsonThread& t, uint8_t b, std::vector<JsonThread>& out) const {
  JsonFrame& f = t.stack.back();
  const JsonNode& n = node(f.node);
  if (f.phase != kArrOpen && is_ws(b)) {
    if (gap_whitespace(f, b, 1)) out.push_back(std::move(t));
    return;
  }
  switch (f.phase) {
    case kArrOpen:
      if (b != '[') return;
      f.phase = kArrFirst;
      f.ws = 0;
      out.push_back(std::move(t));
      return;
    case kArrFirst:
      if (b == ']') {
        if (n.min_items > 0) return;
        end_value(t);
        out.push_back(std::move(t));
        return;
      }
      if (n.max_items == 0) return;
      begin_value(std::move(t), n.items, b, out);
      return;
    case kArrAfter:
      if (b == ',' && f.count < n.max_items) {
        f.phase = kArrNext;
        f.ws = 0;
        out.push_back(std::move(t));
      } else if (b == ']' && f.count >= n.min_items) {
        end_value(t);
        out.push_back(std::move(t));
      }
      return;
    case kArrNext:
      begin_value(std::move(t), n.items, b, out);
      return;
    default:
      return;
  }
}

bool JsonMatcher::step_string_body(JsonThread& t, const JsonNode& n, uint8_t b, bool& closed) const {
  JsonLeaf& l = t.leaf;
  const RegexNfa* re = n.regex >= 0 ? &g_->regexes[static_cast<size_t>(n.regex)] : nullptr;
  closed = false;
  if (l.esc == 1) {
    char32_t cp = 0;
    switch (b) {
      case '"': cp = '"'; break;
      case '\\': cp = '\\'; break;
      case '/': cp = '/'; break;
      case 'b': cp = '\b'; break;
      case 'f': cp = '\f'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'u':
        if (re) return false;  // a pattern sees single escapes only (see can_escape below)
        l.esc = 2;
        l.esc_cp = 0;
        return true;
      default:
        return false;
    }
    l.esc = 0;
    return !re || re->step(l.re, cp);
  }
  if (l.esc >= 2) {
    int d = -1;
    if (b >= '0' && b <= '9') d = b - '0';
    else if ((b | 0x20) >= 'a' && (b | 0x20) <= 'f') d = (b | 0x20) - 'a' + 10;
    if (d < 0) return false;
    l.esc_cp = l.esc_cp * 16 + static_cast<uint32_t>(d);
    if (++l.esc == 6) {
      if (l.esc_cp >= 0xD800 && l.esc_cp <= 0xDFFF) return false;  // surrogates: decoders disagree on halves
      l.esc = 0;
      l.esc_cp = 0;
    }
    return true;
  }
  if (l.utf8.need > 0) return step_char_byte(l, re, b);
  if (b == '"') {
    if (l.chars < n.min_length) return false;
    if (re && !re->accepting(l.re)) return false;
    closed = true;
    return true;
  }
  if (b < 0x20) return false;
  if (l.chars >= n.max_length) return false;
  if (b == '\\') {
    if (re) {
      // Refuse the backslash unless some single escape can continue the pattern.
      bool any = false;
      for (char32_t cp : {U'"', U'\\', U'/', U'\b', U'\f', U'\n', U'\r', U'\t'}) any = any || re->can_step_range(l.re, cp, cp);
      if (!any) return false;
    }
    l.esc = 1;
    ++l.chars;
    return true;
  }
  ++l.chars;
  return step_char_byte(l, re, b);
}

bool JsonMatcher::step_text(JsonThread& t, const JsonNode& n, uint8_t b) const {
  return step_char_byte(t.leaf, &g_->regexes[static_cast<size_t>(n.regex)], b);
}

bool JsonMatcher::step_literal(JsonFrame& f, const JsonNode& n, uint8_t b) const {
  // Literals in [lo, hi) share their first `pos` bytes; those of length pos come first, the
  // rest are ordered by their byte at pos.
  const auto& lits = n.literals;
  const size_t pos = f.pos;
  auto begin = lits.begin() + f.lo, end = lits.begin() + f.hi;
  auto first = std::partition_point(begin, end, [&](const std::string& s) {
    return s.size() <= pos || static_cast<uint8_t>(s[pos]) < b;
  });
  auto last = std::partition_point(first, end, [&](const std::string& s) { return static_cast<uint8_t>(s[pos]) == b; });
  if (first == last) return false;
  f.lo = static_cast<uint16_t>(first - lits.begin());
  f.hi = static_cast<uint16_t>(last - lits.begin());
  ++f.pos;
  return true;
}

// Number grammar positions: 0 start, 1 after '-', 2 after a leading 0, 3 integer digits,
// 4 after '.', 5 fraction digits, 6 after e/E, 7 after the exponent sign, 8 exponent digits.
bool JsonMatcher::step_number(JsonThread& t, const JsonNode& n, uint8_t b) const {
  JsonLeaf& l = t.leaf;
  const bool bounded = is_bounded(n);
  const bool bounded_real = bounded && !n.integer;
  const uint8_t max_int = bounded_real ? kBoundedIntDigits : kMaxIntDigits;
  const uint8_t max_frac = bounded_real ? kBoundedFracDigits : kMaxFracDigits;
  const bool digit = b >= '0' && b <= '9';
  auto go = [&](uint8_t to, bool counts) {
    l.digits = counts ? (l.num == to ? static_cast<uint8_t>(l.digits + 1) : 1) : 0;
    l.num = to;
    if (bounded_real) l.text.push_back(static_cast<char>(b));
    if (bounded && (to == 3 || to == 2)) l.mag = l.mag * 10 + static_cast<uint64_t>(b - '0');
    return !bounded || number_feasible(l, n);
  };
  switch (l.num) {
    case 0:
      if (b == '-') {
        l.neg = true;
        return go(1, false);
      }
      [[fallthrough]];
    case 1:
      if (b == '0') return go(2, false);
      if (digit) return go(3, true);
      return false;
    case 2:
    case 3:
      if (digit && l.num == 3 && l.digits < max_int) return go(3, true);
      if (n.integer) return false;
      if (b == '.') return go(4, false);
      if ((b == 'e' || b == 'E') && !bounded_real) return go(6, false);
      return false;
    case 4:
    case 5:
      if (digit && (l.num == 4 || l.digits < max_frac)) return go(5, true);
      if (l.num == 5 && (b == 'e' || b == 'E') && !bounded_real) return go(6, false);
      return false;
    case 6:
      if (b == '+' || b == '-') return go(7, false);
      [[fallthrough]];
    case 7:
    case 8:
      if (digit && (l.num != 8 || l.digits < kMaxExpDigits)) return go(8, true);
      return false;
    default:
      return false;
  }
}

// Whether some continuation of the number read so far can satisfy the bounds (closed bounds;
// exclusivity is checked on the final value).
bool JsonMatcher::number_feasible(const JsonLeaf& l, const JsonNode& n) const {
  const int sign = l.neg ? -1 : 1;
  auto meets = [&](long double a, long double b) {  // magnitudes [a, b] with the sign applied
    return sign > 0 ? interval_meets_bounds(a, b, n) : interval_meets_bounds(-b, -a, n);
  };
  const uint8_t max_int = n.integer ? kMaxIntDigits : kBoundedIntDigits;
  // What fraction digits can still add: nothing for integers, else up to 1 - 10^-6.
  const long double ulp = n.integer ? 1.0L : std::pow(10.0L, -static_cast<int>(kBoundedFracDigits));
  switch (l.num) {
    case 0:
    case 1:
      return meets(n.integer ? 1.0L : 0.0L, std::pow(10.0L, max_int) - ulp);
    case 2:
      return meets(0.0L, n.integer ? 0.0L : 1.0L - ulp);
    case 3: {
      // More integer digits: [v * 10^d, (v + 1) * 10^d - ulp] for d = 0 .. max_int - digits.
      long double lo = static_cast<long double>(l.mag);
      for (int d = 0; d + l.digits <= max_int; ++d) {
        const long double p = std::pow(10.0L, d);
        if (meets(lo, lo + p - ulp)) return true;
        lo *= 10;
      }
      return false;
    }
    case 4:
    case 5: {
      const long double x = std::strtold(l.text.c_str() + (l.neg ? 1 : 0), nullptr);
      const long double room = std::pow(10.0L, -static_cast<int>(l.num == 4 ? 0 : l.digits));
      return meets(x, x + room - ulp);
    }
    default:
      return true;
  }
}

bool JsonMatcher::number_in_bounds(const JsonLeaf& l, const JsonNode& n) const {
  if (!is_bounded(n)) return true;
  long double v = 0;
  if (n.integer) v = static_cast<long double>(l.mag) * (l.neg ? -1 : 1);
  else v = std::strtod(l.text.c_str(), nullptr);  // the double Python's float() gives
  return interval_meets_bounds(v, v, n);
}

}  // namespace sparkserve
