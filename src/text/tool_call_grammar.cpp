#include "text/tool_call_grammar.h"

#include <algorithm>
#include <array>

namespace sparkserve {
namespace {

using Phase = ToolCallState::Phase;
using Literal = ToolCallState::Literal;

constexpr std::string_view kOpenText = "<tool_call>\n<function=";
constexpr std::string_view kEndText = "</function>\n</tool_call>";
constexpr std::string_view kParamCloseText = "\n</parameter>\n";
constexpr uint8_t kMaxNewlines = 2;  // between </think> or </tool_call> and <tool_call>
constexpr uint8_t kMaxIntDigits = 18, kMaxFracDigits = 18, kMaxExpDigits = 2;  // 1e99 * 10^18 stays finite

// Free-text regions end at their terminator and may not contain any forbidden tag.
struct TailPatterns {
  std::vector<std::string_view> terminators;
  std::vector<std::string_view> forbidden;
  size_t max_len = 0;
};

const TailPatterns& reasoning_patterns() {
  static const TailPatterns p{{"</think>"}, {"<tool_call>"}, 11};
  return p;
}
const TailPatterns& text_patterns() {
  static const TailPatterns p{{"\n</parameter>"},
                              {"</parameter>", "<parameter=", "</function>", "<function=", "<tool_call>", "</tool_call>"},
                              13};
  return p;
}

std::string lower_strip(std::string s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && ws(s[i])) ++i;
  s.erase(0, i);
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The type name the tool parser converts by (convert_tool_param_value): "type" when it is a
// string, else the first non-null string type of anyOf, else "string".
std::string schema_type(const OrderedJson& prop) {
  auto t = prop.find("type");
  if (t != prop.end() && t->is_string()) return lower_strip(t->get<std::string>());
  if (t != prop.end()) return "";  // a type list: the parser literal_evals; keep it free text
  auto any = prop.find("anyOf");
  if (any != prop.end() && any->is_array())
    for (const auto& alt : *any)
      if (alt.is_object()) {
        auto at = alt.find("type");
        if (at != alt.end() && at->is_string() && lower_strip(at->get<std::string>()) != "null")
          return lower_strip(at->get<std::string>());
      }
  return "string";
}

ToolParamSpec param_spec(const std::string& name, const OrderedJson& prop) {
  ToolParamSpec p;
  p.name = name;
  if (!prop.is_object()) return p;
  const std::string type = schema_type(prop);
  auto en = prop.find("enum");
  const bool stringish = type == "string" || type == "str" || type == "text" || type == "enum";
  if (en != prop.end() && en->is_array() && !en->empty()) {
    // Values the parser converts back to the same JSON value: strings for string types,
    // integers for integer types. Other combinations stay free text.
    std::vector<std::string> lits;
    bool ok = true;
    for (const auto& v : *en) {
      if (v.is_string() && stringish) lits.push_back(v.get<std::string>());
      else if (v.is_number_integer() && starts_with(type, "int")) lits.push_back(v.dump());
      else ok = false;
    }
    if (ok) {
      p.kind = ToolValueKind::kLiterals;
      p.literals = std::move(lits);
      return p;
    }
  }
  if (starts_with(type, "int") || starts_with(type, "uint") || starts_with(type, "long") ||
      starts_with(type, "short") || starts_with(type, "unsigned")) {
    p.kind = ToolValueKind::kInteger;
  } else if (starts_with(type, "num") || starts_with(type, "float")) {
    p.kind = ToolValueKind::kNumber;
  } else if (type == "boolean" || type == "bool") {
    p.kind = ToolValueKind::kLiterals;
    p.literals = {"true", "false"};
  } else if (type == "null") {
    p.kind = ToolValueKind::kLiterals;
    p.literals = {"null"};
  }
  return p;
}

// The tool parser drops functions whose name could not be an identifier.
bool valid_function_name(const std::string& n) {
  if (n.empty()) return false;
  for (char c : n)
    if (c == '{' || c == '}' || c == '<' || c == '>' || c == '"' || c == '\'' || c == ' ' || c == '\t' ||
        c == '\n' || c == '\r')
      return false;
  return true;
}

bool valid_param_name(const std::string& n) {
  return !n.empty() && n.find_first_of(">\n") == std::string::npos;
}

}  // namespace

Expected<ToolCallGrammar> ToolCallGrammar::build(const OrderedJson& tools, const ToolCallGrammarOptions& options) {
  ToolCallGrammar g;
  g.thinking_ = options.thinking;
  g.single_call_ = options.only_function.has_value() || !options.parallel_tool_calls;
  if (!tools.is_array() || tools.empty()) return make_error("no tools to call");
  for (const auto& tool : tools) {
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) continue;
    const OrderedJson& fn = tool["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) continue;
    ToolFunctionSpec spec;
    spec.name = fn["name"].get<std::string>();
    if (options.only_function && spec.name != *options.only_function) continue;
    if (!valid_function_name(spec.name))
      return make_error("function name \"" + spec.name +
                             "\" cannot be written in a qwen3_coder tool call (it must not be empty or contain "
                             "braces, angle brackets, quotes or whitespace)");
    auto params = fn.find("parameters");
    if (params != fn.end() && params->is_object()) {
      auto props = params->find("properties");
      if (props != params->end() && props->is_object()) {
        if (props->size() > 64)
          return make_error("function \"" + spec.name + "\" has " + std::to_string(props->size()) +
                                 " properties; a constrained call supports at most 64");
        for (const auto& [pname, prop] : props->items()) {
          if (!valid_param_name(pname))
            return make_error("parameter name \"" + pname + "\" of function \"" + spec.name +
                                   "\" cannot be written in a qwen3_coder tool call (empty, '>' or newline)");
          spec.params.push_back(param_spec(pname, prop));
        }
      }
      auto req = params->find("required");
      if (req != params->end() && req->is_array())
        for (const auto& r : *req) {
          if (!r.is_string()) continue;
          for (size_t i = 0; i < spec.params.size(); ++i)
            if (spec.params[i].name == r.get<std::string>()) spec.required_mask |= uint64_t{1} << i;
          // A required name that is not a property can never be written: the call could not
          // close, so the request is refused instead of looping to max_tokens.
          if (std::none_of(spec.params.begin(), spec.params.end(),
                           [&](const ToolParamSpec& p) { return p.name == r.get<std::string>(); }))
            return make_error("function \"" + spec.name + "\" requires \"" + r.get<std::string>() +
                                   "\", which is not among its parameters' properties");
        }
    }
    // Same name offered twice: the first definition wins, as in the tool parser's schemas.
    if (std::any_of(g.functions_.begin(), g.functions_.end(), [&](const auto& f) { return f.name == spec.name; }))
      continue;
    g.allowed_functions_.push_back(static_cast<int16_t>(g.functions_.size()));
    g.functions_.push_back(std::move(spec));
  }
  if (g.functions_.empty()) {
    if (options.only_function)
      return make_error("function \"" + *options.only_function + "\" is not among the tools");
    return make_error("no tool has a function name");
  }
  return g;
}

ToolCallState ToolCallGrammar::initial() const {
  ToolCallState s;
  s.phase = thinking_ ? Phase::kReasoning : Phase::kGap;
  return s;
}

bool ToolCallGrammar::accepting(const ToolCallState& s) const {
  return s.phase == Phase::kDone || (s.phase == Phase::kGap && s.calls > 0 && s.newlines == 0);
}

void ToolCallGrammar::literal_options(const ToolCallState& s, std::vector<Option>& out) const {
  out.clear();
  switch (s.literal) {
    case Literal::kOpen:
      out.push_back({std::string(kOpenText), 0});
      break;
    case Literal::kFunctionName:
      for (int16_t f : allowed_functions_) out.push_back({functions_[static_cast<size_t>(f)].name + ">\n", f});
      break;
    case Literal::kParamOrEnd: {
      const ToolFunctionSpec& fn = functions_[static_cast<size_t>(s.function)];
      for (size_t i = 0; i < fn.params.size(); ++i)
        if (!(s.seen >> i & 1)) out.push_back({"<parameter=" + fn.params[i].name + ">\n", static_cast<int>(i)});
      if ((fn.required_mask & ~s.seen) == 0) out.push_back({std::string(kEndText), -1});
      break;
    }
    case Literal::kValue: {
      const ToolParamSpec& p = functions_[static_cast<size_t>(s.function)].params[static_cast<size_t>(s.param)];
      for (size_t i = 0; i < p.literals.size(); ++i)
        out.push_back({p.literals[i] + std::string(kParamCloseText), static_cast<int>(i)});
      break;
    }
    case Literal::kParamClose:
      out.push_back({std::string(kParamCloseText), 0});
      break;
    case Literal::kNewline:
      out.push_back({"\n", 0});
      break;
  }
}

void ToolCallGrammar::after_call(ToolCallState& s) const {
  ++s.calls;
  s.function = -1;
  s.param = -1;
  s.seen = 0;
  s.newlines = 0;
  s.phase = single_call_ ? Phase::kDone : Phase::kGap;
}

void ToolCallGrammar::enter_value(ToolCallState& s) const {
  const ToolParamSpec& p = functions_[static_cast<size_t>(s.function)].params[static_cast<size_t>(s.param)];
  s.buf.clear();
  switch (p.kind) {
    case ToolValueKind::kText:
      s.phase = Phase::kText;
      break;
    case ToolValueKind::kInteger:
    case ToolValueKind::kNumber:
      s.phase = Phase::kNumber;
      s.number = 0;
      s.digits = 0;
      break;
    case ToolValueKind::kLiterals:
      s.phase = Phase::kLiteral;
      s.literal = Literal::kValue;
      break;
  }
}

void ToolCallGrammar::complete_literal(ToolCallState& s, int tag) const {
  s.buf.clear();
  switch (s.literal) {
    case Literal::kOpen:
      s.literal = Literal::kFunctionName;
      break;
    case Literal::kFunctionName:
      s.function = static_cast<int16_t>(tag);
      s.seen = 0;
      s.literal = Literal::kParamOrEnd;
      break;
    case Literal::kParamOrEnd:
      if (tag < 0) {
        after_call(s);
      } else {
        s.param = static_cast<int16_t>(tag);
        enter_value(s);
      }
      break;
    case Literal::kValue:
    case Literal::kParamClose:
    case Literal::kNewline:
      s.seen |= uint64_t{1} << s.param;
      s.param = -1;
      s.literal = Literal::kParamOrEnd;
      break;
  }
}

bool ToolCallGrammar::step_literal(ToolCallState& s, uint8_t byte) const {
  thread_local std::vector<Option> options;
  literal_options(s, options);
  const size_t n = s.buf.size();
  int complete = 0;
  bool any = false, done = false;
  for (const Option& o : options) {
    if (o.text.size() <= n || static_cast<uint8_t>(o.text[n]) != byte || o.text.compare(0, n, s.buf) != 0) continue;
    any = true;
    if (o.text.size() == n + 1 && !done) {
      done = true;
      complete = o.tag;
    }
  }
  if (!any) return false;
  if (done) complete_literal(s, complete);
  else s.buf.push_back(static_cast<char>(byte));
  return true;
}

bool ToolCallGrammar::step_tail(ToolCallState& s, uint8_t byte) const {
  const TailPatterns& pat = s.phase == Phase::kReasoning ? reasoning_patterns() : text_patterns();
  std::string t = s.buf;
  t.push_back(static_cast<char>(byte));
  const std::string_view tv(t);
  // A pattern completed at this byte is a suffix of the tail + byte (the tail is the longest
  // suffix that is a pattern prefix). Longest first, so "\n</parameter>" beats "</parameter>".
  for (size_t k = std::min(tv.size(), pat.max_len); k >= 1; --k) {
    const std::string_view suf = tv.substr(tv.size() - k);
    for (std::string_view p : pat.terminators)
      if (suf == p) {
        s.buf.clear();
        if (s.phase == Phase::kReasoning) {
          s.phase = Phase::kGap;
          s.newlines = 0;
        } else {
          s.phase = Phase::kLiteral;  // the "\n" after </parameter>
          s.literal = Literal::kNewline;
        }
        return true;
      }
    for (std::string_view p : pat.forbidden)
      if (suf == p) return false;
  }
  for (size_t k = std::min(tv.size(), pat.max_len - 1); k >= 1; --k) {
    const std::string_view suf = tv.substr(tv.size() - k);
    auto is_prefix = [&](std::string_view p) { return p.size() > k && starts_with(p, suf); };
    if (std::any_of(pat.terminators.begin(), pat.terminators.end(), is_prefix) ||
        std::any_of(pat.forbidden.begin(), pat.forbidden.end(), is_prefix)) {
      s.buf.assign(suf);
      return true;
    }
  }
  s.buf.clear();
  return true;
}

// Number grammar positions: 0 start, 1 after '-', 2 after a leading 0, 3 integer digits,
// 4 after '.', 5 fraction digits, 6 after e/E, 7 after the exponent sign, 8 exponent digits.
bool ToolCallGrammar::step_number(ToolCallState& s, uint8_t byte) const {
  const bool integer =
      functions_[static_cast<size_t>(s.function)].params[static_cast<size_t>(s.param)].kind == ToolValueKind::kInteger;
  const bool digit = byte >= '0' && byte <= '9';
  const bool can_end = s.number == 2 || s.number == 3 || s.number == 5 || s.number == 8;
  if (byte == '\n' && can_end) {
    s.phase = Phase::kLiteral;
    s.literal = Literal::kParamClose;
    s.buf = "\n";
    return true;
  }
  auto go = [&](uint8_t to, bool counts) {
    if (counts) {
      s.digits = s.number == to ? static_cast<uint8_t>(s.digits + 1) : 1;
    } else {
      s.digits = 0;
    }
    s.number = to;
    return true;
  };
  switch (s.number) {
    case 0:
      if (byte == '-') return go(1, false);
      [[fallthrough]];
    case 1:
      if (byte == '0') return go(2, false);
      if (digit) return go(3, true);
      return false;
    case 2:
    case 3:
      if (digit && s.number == 3 && s.digits < kMaxIntDigits) return go(3, true);
      if (integer) return false;
      if (byte == '.') return go(4, false);
      if (byte == 'e' || byte == 'E') return go(6, false);
      return false;
    case 4:
    case 5:
      if (digit && (s.number == 4 || s.digits < kMaxFracDigits)) return go(5, true);
      if (s.number == 5 && (byte == 'e' || byte == 'E')) return go(6, false);
      return false;
    case 6:
      if (byte == '+' || byte == '-') return go(7, false);
      [[fallthrough]];
    case 7:
    case 8:
      if (digit && (s.number != 8 || s.digits < kMaxExpDigits)) return go(8, true);
      return false;
    default:
      return false;
  }
}

bool ToolCallGrammar::step(ToolCallState& s, uint8_t byte) const {
  switch (s.phase) {
    case Phase::kReasoning:
    case Phase::kText:
      if (s.buf.empty() && byte != '<' && byte != '\n') return true;
      return step_tail(s, byte);
    case Phase::kGap:
      if (byte == '\n' && s.newlines < kMaxNewlines) {
        ++s.newlines;
        return true;
      }
      if (byte == '<') {
        s.phase = Phase::kLiteral;
        s.literal = Literal::kOpen;
        s.buf = "<";
        return true;
      }
      return false;
    case Phase::kLiteral:
      return step_literal(s, byte);
    case Phase::kNumber:
      return step_number(s, byte);
    case Phase::kDone:
    case Phase::kDead:
      return false;
  }
  return false;
}

bool ToolCallGrammar::step_all(ToolCallState& s, std::string_view text) const {
  ToolCallState t = s;
  for (char c : text)
    if (!step(t, static_cast<uint8_t>(c))) return false;
  s = std::move(t);
  return true;
}

}  // namespace sparkserve
