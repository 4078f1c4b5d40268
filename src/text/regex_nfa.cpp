#include "text/regex_nfa.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <memory>
#include <string>

#include "text/utf8.h"

namespace sparkserve {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;
constexpr size_t kMaxBuildStates = 16384;  // epsilon states included, before pruning

struct Node {
  enum class Kind { kSet, kConcat, kAlt, kRepeat, kEmpty };
  Kind kind = Kind::kEmpty;
  int set = -1;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
  std::vector<std::unique_ptr<Node>> kids;
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make(Node::Kind k) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  return n;
}

}  // namespace

// Parses the pattern into a tree, then builds the NFA (Thompson's construction) and keeps only
// the states with a character transition plus the accepting one.
class RegexBuilder {
 public:
  RegexBuilder(std::string_view p, RegexNfa& out) : p_(p), out_(out) {}

  Status parse_top(RegexNfa::Mode mode, NodePtr& root) {
    // Top-level alternatives, each with its own anchors.
    auto alt = make(Node::Kind::kAlt);
    while (true) {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) {
        ++i_;
        anchored_start = true;
      }
      NodePtr branch;
      SS_RETURN_IF_ERROR(parse_concat(branch, &anchored_end));
      if (mode == RegexNfa::Mode::kSearch) {
        auto seq = make(Node::Kind::kConcat);
        if (!anchored_start) seq->kids.push_back(any_star());
        seq->kids.push_back(std::move(branch));
        if (!anchored_end) seq->kids.push_back(any_star());
        branch = std::move(seq);
      }
      alt->kids.push_back(std::move(branch));
      if (i_ >= p_.size()) break;
      if (p_[i_] == '|') {
        ++i_;
        continue;
      }
      return fail("unbalanced ')'");
    }
    root = std::move(alt);
    return Status::Ok();
  }

  Status build(const Node& root) {
    auto [s, e] = emit(root);
    if (!s.ok()) return s;
    if (states_.size() > kMaxBuildStates) return too_large();
    accept_ = e;
    return finish(start_state_);
  }

  int start_state_ = -1;

 private:
  struct BuildState {
    int set = -1;  // -1: epsilon state
    int next = -1;
    std::vector<int> eps;
  };

  Status fail(const std::string& what) const {
    return make_error("regular expression \"" + std::string(p_) + "\": " + what + " (at offset " +
                      std::to_string(i_) + ")");
  }
  Status too_large() const {
    return make_error("regular expression \"" + std::string(p_) + "\" is too large to constrain decoding with (more than " +
                      std::to_string(RegexNfa::kMaxStates) + " NFA states)");
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

  int add_set(RegexNfa::CharSet cs) {
    // Normalise: sort and merge ranges.
    std::sort(cs.ranges.begin(), cs.ranges.end(), [](auto a, auto b) { return a.lo < b.lo; });
    std::vector<RegexNfa::Range> merged;
    for (auto r : cs.ranges) {
      if (!merged.empty() && r.lo <= merged.back().hi + 1) merged.back().hi = std::max(merged.back().hi, r.hi);
      else merged.push_back(r);
    }
    cs.ranges = std::move(merged);
    out_.sets_.push_back(std::move(cs));
    return static_cast<int>(out_.sets_.size() - 1);
  }
  int set_of(std::vector<RegexNfa::Range> ranges, bool negated = false) {
    RegexNfa::CharSet cs;
    cs.ranges = std::move(ranges);
    cs.negated = negated;
    return add_set(std::move(cs));
  }
  NodePtr set_node(int set) {
    auto n = make(Node::Kind::kSet);
    n->set = set;
    return n;
  }
  NodePtr any_star() {
    auto n = make(Node::Kind::kRepeat);
    n->min = 0;
    n->max = -1;
    n->kids.push_back(set_node(set_of({{0, kMaxCodePoint}})));
    return n;
  }

  // concat := repeat*, up to '|' or ')' or the end. A '$' is accepted only right before one of
  // those at the top level (anchored_end set).
  Status parse_concat(NodePtr& out, bool* anchored_end) {
    auto seq = make(Node::Kind::kConcat);
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        const bool at_end = i_ + 1 == p_.size() || p_[i_ + 1] == '|';
        if (!anchored_end || !at_end) return fail("'$' is supported only at the end of the pattern or of a top-level alternative");
        ++i_;
        *anchored_end = true;
        break;
      }
      if (p_[i_] == '^') return fail("'^' is supported only at the start of the pattern or of a top-level alternative");
      NodePtr atom;
      SS_RETURN_IF_ERROR(parse_atom(atom));
      SS_RETURN_IF_ERROR(parse_quantifier(atom));
      seq->kids.push_back(std::move(atom));
    }
    out = std::move(seq);
    return Status::Ok();
  }

  Status parse_alternation(NodePtr& out) {
    auto alt = make(Node::Kind::kAlt);
    while (true) {
      NodePtr branch;
      SS_RETURN_IF_ERROR(parse_concat(branch, nullptr));
      alt->kids.push_back(std::move(branch));
      if (!peek('|')) break;
      ++i_;
    }
    out = std::move(alt);
    return Status::Ok();
  }

  bool read_int(int& v) {
    size_t j = i_;
    long long x = 0;
    while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && j - i_ < 6) x = x * 10 + (p_[j++] - '0');
    if (j == i_) return false;
    i_ = j;
    v = static_cast<int>(x);
    return true;
  }

  Status parse_quantifier(NodePtr& atom) {
    while (i_ < p_.size()) {
      int lo = 0, hi = 0;
      const char c = p_[i_];
      if (c == '*') {
        lo = 0, hi = -1, ++i_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c == '{') {
        const size_t save = i_;
        ++i_;
        if (!read_int(lo)) {  // a literal '{' (ECMA Annex B)
          i_ = save;
          return Status::Ok();
        }
        hi = lo;
        if (peek(',')) {
          ++i_;
          hi = -1;
          if (!peek('}') && !read_int(hi)) return fail("bad {n,m} quantifier");
        }
        if (!peek('}')) return fail("bad {n,m} quantifier");
        ++i_;
        if (lo > kMaxRepeat || hi > kMaxRepeat) return fail("repeat count above " + std::to_string(kMaxRepeat));
        if (hi >= 0 && hi < lo) return fail("{n,m} with m < n");
      } else {
        return Status::Ok();
      }
      if (peek('?')) ++i_;  // lazy: same language
      if (peek('+')) return fail("possessive quantifiers are not supported");
      auto rep = make(Node::Kind::kRepeat);
      rep->min = lo;
      rep->max = hi;
      rep->kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return Status::Ok();
  }

  // The code point at i_ (UTF-8), advancing past it.
  Status next_code_point(char32_t& cp) {
    Utf8Stepper u;
    while (i_ < p_.size()) {
      const auto r = u.feed(static_cast<uint8_t>(p_[i_++]));
      if (r == Utf8Stepper::kBad) break;
      if (r == Utf8Stepper::kChar) {
        cp = u.cp;
        return Status::Ok();
      }
    }
    return fail("invalid UTF-8");
  }

  static std::vector<RegexNfa::Range> digit() { return {{'0', '9'}}; }
  static std::vector<RegexNfa::Range> word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
  static std::vector<RegexNfa::Range> space() {
    return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
            {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  }
  static std::vector<RegexNfa::Range> complement(const std::vector<RegexNfa::Range>& r) {
    std::vector<RegexNfa::Range> out;
    char32_t next = 0;
    for (auto x : r) {
      if (x.lo > next) out.push_back({next, x.lo - 1});
      next = x.hi + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
  }

  Status read_hex(int digits, char32_t& v) {
    v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) return fail("bad hex escape");
      const char c = p_[i_++];
      v = v * 16 + static_cast<char32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return Status::Ok();
  }

  // An escape after '\': either one code point (cp) or a class (ranges). in_class: inside [...].
  Status parse_escape(bool in_class, char32_t& cp, std::vector<RegexNfa::Range>& ranges, bool& is_class) {
    if (i_ >= p_.size()) return fail("trailing backslash");
    is_class = false;
    const char c = p_[i_++];
    switch (c) {
      case 'd': is_class = true; ranges = digit(); return Status::Ok();
      case 'D': is_class = true; ranges = complement(digit()); return Status::Ok();
      case 'w': is_class = true; ranges = word(); return Status::Ok();
      case 'W': is_class = true; ranges = complement(word()); return Status::Ok();
      case 's': is_class = true; ranges = space(); return Status::Ok();
      case 'S': is_class = true; ranges = complement(space()); return Status::Ok();
      case 'n': cp = '\n'; return Status::Ok();
      case 'r': cp = '\r'; return Status::Ok();
      case 't': cp = '\t'; return Status::Ok();
      case 'f': cp = '\f'; return Status::Ok();
      case 'v': cp = '\v'; return Status::Ok();
      case '0': cp = 0; return Status::Ok();
      case 'x': return read_hex(2, cp);
      case 'u':
        if (peek('{')) {
          ++i_;
          cp = 0;
          size_t n = 0;
          while (i_ < p_.size() && p_[i_] != '}' && n < 6) {
            char32_t d;
            SS_RETURN_IF_ERROR(read_hex(1, d));
            cp = cp * 16 + d;
            ++n;
          }
          if (!peek('}') || n == 0 || cp > kMaxCodePoint) return fail("bad \\u{...} escape");
          ++i_;
          return Status::Ok();
        }
        return read_hex(4, cp);
      case 'b':
        if (in_class) {
          cp = '\b';
          return Status::Ok();
        }
        return fail("word boundaries (\\b) are not supported");
      case 'B': return fail("word boundaries (\\B) are not supported");
      case 'p':
      case 'P': return fail("Unicode property classes (\\p{...}) are not supported");
      case 'k': return fail("named backreferences are not supported");
      case 'c': return fail("control escapes (\\cX) are not supported");
      default:
        if (c >= '1' && c <= '9') return fail("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) return fail(std::string("unknown escape \\") + c);
        --i_;
        return next_code_point(cp);  // escaped punctuation (or any non-alphanumeric) is itself
    }
  }

  Status parse_class(NodePtr& out) {
    // After '['.
    bool negated = false;
    if (peek('^')) {
      negated = true;
      ++i_;
    }
    std::vector<RegexNfa::Range> ranges;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) return fail("unterminated character class");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      if (p_[i_] == ']') {  // "[]" matches nothing in ECMA; "[^]" anything
        ++i_;
        break;
      }
      first = false;
      char32_t lo = 0;
      bool is_class = false;
      std::vector<RegexNfa::Range> cls;
      if (p_[i_] == '\\') {
        ++i_;
        SS_RETURN_IF_ERROR(parse_escape(true, lo, cls, is_class));
      } else if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        return fail("POSIX classes ([:alpha:]) are not supported");
      } else {
        SS_RETURN_IF_ERROR(next_code_point(lo));
      }
      if (is_class) {
        ranges.insert(ranges.end(), cls.begin(), cls.end());
        continue;
      }
      char32_t hi = lo;
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          SS_RETURN_IF_ERROR(parse_escape(true, hi, cls, is_class));
          if (is_class) return fail("a class escape cannot end a range");
        } else {
          SS_RETURN_IF_ERROR(next_code_point(hi));
        }
        if (hi < lo) return fail("range out of order in character class");
      }
      ranges.push_back({lo, hi});
    }
    out = set_node(set_of(std::move(ranges), negated));
    return Status::Ok();
  }

  Status parse_atom(NodePtr& out) {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          if (!peek('>')) return fail("unterminated group name");
          ++i_;
        } else if (peek('P') && i_ + 1 < p_.size() && p_[i_ + 1] == '<') {
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          if (!peek('>')) return fail("unterminated group name");
          ++i_;
        } else {
          return fail("lookaround and inline flags ((?=, (?!, (?<=, (?i) are not supported");
        }
      }
      SS_RETURN_IF_ERROR(parse_alternation(out));
      if (!peek(')')) return fail("missing ')'");
      ++i_;
      return Status::Ok();
    }
    if (c == '[') {
      ++i_;
      return parse_class(out);
    }
    if (c == '.') {
      ++i_;
      out = set_node(set_of({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true));
      return Status::Ok();
    }
    if (c == '*' || c == '+' || c == '?') return fail(std::string("nothing to repeat before '") + c + "'");
    if (c == '\\') {
      ++i_;
      char32_t cp = 0;
      bool is_class = false;
      std::vector<RegexNfa::Range> cls;
      SS_RETURN_IF_ERROR(parse_escape(false, cp, cls, is_class));
      out = set_node(is_class ? set_of(std::move(cls)) : set_of({{cp, cp}}));
      return Status::Ok();
    }
    char32_t cp = 0;
    SS_RETURN_IF_ERROR(next_code_point(cp));
    out = set_node(set_of({{cp, cp}}));
    return Status::Ok();
  }

  int new_state() {
    states_.emplace_back();
    return static_cast<int>(states_.size() - 1);
  }

  // Thompson fragment of n: returns (status, {start, end}); end is an epsilon state without outs.
  struct Frag {
    int start, end;
  };
  std::pair<Status, int> emit(const Node& n) {
    Frag f{};
    Status st = emit_frag(n, f);
    start_state_ = f.start;
    return {st, f.end};
  }

  Status emit_frag(const Node& n, Frag& f) {
    if (states_.size() > kMaxBuildStates) return too_large();
    switch (n.kind) {
      case Node::Kind::kEmpty: {
        const int s = new_state();
        f = {s, s};
        return Status::Ok();
      }
      case Node::Kind::kSet: {
        const int s = new_state(), e = new_state();
        states_[s].set = n.set;
        states_[s].next = e;
        f = {s, e};
        return Status::Ok();
      }
      case Node::Kind::kConcat: {
        const int s = new_state();
        int cur = s;
        for (const auto& k : n.kids) {
          Frag kf{};
          SS_RETURN_IF_ERROR(emit_frag(*k, kf));
          states_[cur].eps.push_back(kf.start);
          cur = kf.end;
        }
        f = {s, cur};
        return Status::Ok();
      }
      case Node::Kind::kAlt: {
        const int s = new_state(), e = new_state();
        for (const auto& k : n.kids) {
          Frag kf{};
          SS_RETURN_IF_ERROR(emit_frag(*k, kf));
          states_[s].eps.push_back(kf.start);
          states_[kf.end].eps.push_back(e);
        }
        f = {s, e};
        return Status::Ok();
      }
      case Node::Kind::kRepeat: {
        const Node& body = *n.kids[0];
        const int s = new_state();
        int cur = s;
        for (int k = 0; k < n.min; ++k) {
          Frag kf{};
          SS_RETURN_IF_ERROR(emit_frag(body, kf));
          states_[cur].eps.push_back(kf.start);
          cur = kf.end;
        }
        if (n.max < 0) {
          Frag kf{};
          SS_RETURN_IF_ERROR(emit_frag(body, kf));
          const int e = new_state();
          states_[cur].eps.push_back(kf.start);
          states_[cur].eps.push_back(e);
          states_[kf.end].eps.push_back(kf.start);
          states_[kf.end].eps.push_back(e);
          f = {s, e};
          return Status::Ok();
        }
        const int e = new_state();
        for (int k = n.min; k < n.max; ++k) {
          Frag kf{};
          SS_RETURN_IF_ERROR(emit_frag(body, kf));
          states_[cur].eps.push_back(e);
          states_[cur].eps.push_back(kf.start);
          cur = kf.end;
        }
        states_[cur].eps.push_back(e);
        f = {s, e};
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  // Keeps character states and the accept state; computes epsilon closures over them.
  Status finish(int start) {
    std::vector<int> keep_index(states_.size(), -1);
    int kept = 0;
    for (size_t i = 0; i < states_.size(); ++i)
      if (states_[i].set >= 0 || static_cast<int>(i) == accept_) keep_index[i] = kept++;
    if (static_cast<size_t>(kept) > RegexNfa::kMaxStates) return too_large();
    auto closure = [&](int from) {
      RegexNfa::States out;
      std::vector<int> stack{from};
      std::vector<uint8_t> seen(states_.size(), 0);
      seen[static_cast<size_t>(from)] = 1;
      while (!stack.empty()) {
        const int s = stack.back();
        stack.pop_back();
        if (keep_index[static_cast<size_t>(s)] >= 0) out.set(static_cast<size_t>(keep_index[static_cast<size_t>(s)]));
        for (int t : states_[static_cast<size_t>(s)].eps)
          if (!seen[static_cast<size_t>(t)]) {
            seen[static_cast<size_t>(t)] = 1;
            stack.push_back(t);
          }
      }
      return out;
    };
    out_.char_set_.assign(static_cast<size_t>(kept), -1);
    out_.next_.assign(static_cast<size_t>(kept), -1);
    out_.closure_.assign(static_cast<size_t>(kept), {});
    for (size_t i = 0; i < states_.size(); ++i) {
      const int k = keep_index[i];
      if (k < 0) continue;
      out_.char_set_[static_cast<size_t>(k)] = states_[i].set;
      if (states_[i].set >= 0) out_.closure_[static_cast<size_t>(k)] = closure(states_[i].next);
    }
    out_.accept_ = keep_index[static_cast<size_t>(accept_)];
    out_.start_ = closure(start);
    return Status::Ok();
  }

  std::string_view p_;
  size_t i_ = 0;
  RegexNfa& out_;
  std::vector<BuildState> states_;
  int accept_ = -1;
};

bool RegexNfa::CharSet::contains(char32_t cp) const {
  // Few ranges: a linear scan beats a binary search.
  bool in = false;
  for (const Range& r : ranges) {
    if (cp < r.lo) break;
    if (cp <= r.hi) {
      in = true;
      break;
    }
  }
  return in != negated;
}

bool RegexNfa::CharSet::intersects(char32_t lo, char32_t hi) const {
  if (!negated) {
    for (const Range& r : ranges)
      if (r.lo <= hi && lo <= r.hi) return true;
    return false;
  }
  // Negated: some point of [lo, hi] lies outside every range.
  char32_t next = lo;
  for (const Range& r : ranges) {
    if (r.hi < next) continue;
    if (r.lo > next) return true;
    if (r.hi >= hi) return false;
    next = r.hi + 1;
  }
  return next <= hi;
}

Expected<RegexNfa> RegexNfa::compile(std::string_view pattern, Mode mode) {
  RegexNfa nfa;
  RegexBuilder b(pattern, nfa);
  NodePtr root;
  SS_RETURN_IF_ERROR(b.parse_top(mode, root));
  SS_RETURN_IF_ERROR(b.build(*root));
  return nfa;
}

bool RegexNfa::step(States& s, char32_t cp) const {
  States next;
  for (size_t w = 0; w < char_set_.size(); ++w) {
    if (!s.test(w)) continue;
    const int set = char_set_[w];
    if (set >= 0 && sets_[static_cast<size_t>(set)].contains(cp)) next |= closure_[w];
  }
  if (next.none()) return false;
  s = next;
  return true;
}

bool RegexNfa::can_step_range(const States& s, char32_t lo, char32_t hi) const {
  for (size_t w = 0; w < char_set_.size(); ++w) {
    if (!s.test(w)) continue;
    const int set = char_set_[w];
    if (set >= 0 && sets_[static_cast<size_t>(set)].intersects(lo, hi)) return true;
  }
  return false;
}

}  // namespace sparkserve
