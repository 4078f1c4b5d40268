// The language of structured outputs (response_format json_schema / json_object,
// structured_outputs json / choice / regex) as a graph of value nodes, and a byte-level matcher
// that constrained decoding walks alongside the model (runtime/token_constraint.h). The
// JSON-Schema compiler (json_schema_compiler.h) builds the graph.
//
// What the matcher accepts for a JSON root: optional whitespace, then one value of the root
// node, then nothing (end of output). Between tokens of a JSON value (after '{', '[', ':', ',',
// before '}' / ']' / ':' / ',') whitespace of the forms JSON writers use: at most one newline
// (two before the root value: "</think>\n\n{"), then at most kMaxIndent spaces or tabs; no \r.
// That covers compact and indented output and never lets a model (a random-weight one above
// all) spend its tokens on whitespace. Values:
//  - object: its properties in schema order, each optional one may be left out, a required one
//    never; then, when `additional` is set, further keys (not equal to a declared name, without
//    escapes) with values of that node. Keys are written exactly as their JSON encoding
//    (json.dumps(name, ensure_ascii=False)).
//  - array: min_items..max_items values of `items`.
//  - string: a JSON string of min_length..max_length code points (an escape is one), valid UTF-8,
//    no \u surrogate escapes; with `regex`, the decoded text must match it (\u escapes are then
//    refused).
//  - number: JSON number syntax (at most 18 integer and 18 fraction digits, 2 exponent digits: always
//    finite); integer: -?(0|[1-9][0-9]*); bounds (minimum/maximum, exclusive or not) are exact for
//    integers, and for numbers restrict the form to at most 15 integer and 6 fraction digits
//    without exponent, the value checked with strtod at its end.
//  - literals: exactly one of the given texts (enum / const / true / false / null, as JSON).
//  - any_of: one of the alternatives (oneOf is compiled to this too).
// A raw root (choice / regex) is text, not JSON: no surrounding whitespace; `text` nodes match
// the whole output against a regular expression.
// Nesting deeper than kMaxDepth values is refused (a recursive schema then keeps to its
// non-recursive alternatives).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/regex_nfa.h"
#include "text/utf8.h"

namespace sparkserve {

struct JsonNode {
  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kLiterals, kAnyOf, kText };
  static constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

  Kind kind = Kind::kAnyOf;
  // kObject
  struct Property {
    std::string key_json;  // the key as JSON text, quotes included
    int32_t value = -1;
    bool required = false;
  };
  std::vector<Property> properties;  // at most 64
  int32_t additional = -1;           // node of other keys' values; -1: none allowed
  // kArray
  int32_t items = -1;
  uint32_t min_items = 0, max_items = kUnbounded;
  // kString (and kText: regex only)
  uint32_t min_length = 0, max_length = kUnbounded;
  int32_t regex = -1;  // index into JsonGrammar::regexes
  // kNumber
  bool integer = false;
  std::optional<double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
  // kLiterals: distinct, sorted (byte order)
  std::vector<std::string> literals;
  // kAnyOf
  std::vector<int32_t> alternatives;
};

struct JsonGrammar {
  std::vector<JsonNode> nodes;
  std::vector<RegexNfa> regexes;
  int32_t root = -1;
  bool raw = false;  // the root is raw text (choice / regex), not a JSON value

  int32_t add(JsonNode n) {
    nodes.push_back(std::move(n));
    return static_cast<int32_t>(nodes.size() - 1);
  }
  // The node accepting any JSON value (made on first use).
  int32_t any_value();
  int32_t any_value_ = -1;
};

// One nondeterministic branch of the matcher: a stack of open values and the state of the
// innermost string / number / text.
struct JsonFrame {
  int32_t node = -1;   // -1: the root pseudo-value
  uint8_t phase = 0;
  uint8_t ws = 0;      // whitespace in the current gap: newlines << 6 | spaces and tabs
  uint16_t prop = 0;   // object: index of the next property that may be written
  uint16_t lo = 0, hi = 0, pos = 0;  // literals: range still matching, bytes matched; object key: pos
  int32_t value = -1;  // object: node of the value after the current key
  uint32_t count = 0;  // array: values so far
  uint64_t keys = 0;   // object key: declared names whose JSON text still matches
  bool free_key = false;  // object key: an additional (undeclared) key is still possible
  bool operator==(const JsonFrame&) const = default;
};

struct JsonLeaf {
  // string / text
  uint32_t chars = 0;
  uint8_t esc = 0;         // 0: none, 1: after '\', 2..5: \u hex digits read + 2
  uint32_t esc_cp = 0;
  Utf8Stepper utf8;
  RegexNfa::States re;
  // number
  uint8_t num = 0, digits = 0;
  bool neg = false;
  uint64_t mag = 0;        // integer part so far (bounded numbers)
  std::string text;        // the number so far (bounded non-integers only)
  bool operator==(const JsonLeaf&) const = default;
};

struct JsonThread {
  std::vector<JsonFrame> stack;
  JsonLeaf leaf;
  bool operator==(const JsonThread&) const = default;
};

struct JsonMatchState {
  std::vector<JsonThread> threads;  // empty: dead
};

class JsonMatcher {
 public:
  static constexpr int kMaxIndent = 32;
  static constexpr size_t kMaxDepth = 32;
  static constexpr size_t kMaxThreads = 64;

  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  JsonMatchState initial() const;
  // Advances by one byte; false (state unchanged) when the byte leaves the language.
  bool step(JsonMatchState& s, uint8_t byte) const;
  bool step_all(JsonMatchState& s, std::string_view bytes) const;
  // The output may end here.
  bool accepting(const JsonMatchState& s) const;
  // When the state is inside a plain JSON string (one branch, no escape or partial UTF-8
  // character pending, no regex; or an undeclared object key no declared name matches any
  // more): how many more code points it may take. Any bytes without '"',
  // '\', control characters and with well-formed UTF-8 keep it there (the mask's fast path).
  std::optional<uint32_t> plain_string_room(const JsonMatchState& s) const;

  const JsonGrammar& grammar() const { return *g_; }

 private:
  const JsonNode& node(int32_t i) const { return g_->nodes[static_cast<size_t>(i)]; }
  void step_thread(JsonThread t, uint8_t b, std::vector<JsonThread>& out) const;
  void begin_value(JsonThread t, int32_t node, uint8_t b, std::vector<JsonThread>& out) const;
  void end_value(JsonThread& t) const;
  bool can_finish(JsonThread t) const;
  bool may_end(const JsonThread& t) const;  // a pending number / literal / text can end here
  void step_object(JsonThread& t, uint8_t b, std::vector<JsonThread>& out) const;
  void step_array(JsonThread& t, uint8_t b, std::vector<JsonThread>& out) const;
  bool step_string_body(JsonThread& t, const JsonNode& n, uint8_t b, bool& closed) const;
  bool step_number(JsonThread& t, const JsonNode& n, uint8_t b) const;
  bool step_literal(JsonFrame& f, const JsonNode& n, uint8_t b) const;
  bool step_text(JsonThread& t, const JsonNode& n, uint8_t b) const;
  bool step_key(JsonFrame& f, JsonLeaf& leaf, const JsonNode& n, uint8_t b, bool& closed) const;
  bool number_in_bounds(const JsonLeaf& l, const JsonNode& n) const;
  bool number_feasible(const JsonLeaf& l, const JsonNode& n) const;

  std::shared_ptr<const JsonGrammar> g_;
};

}  // namespace sparkserve
