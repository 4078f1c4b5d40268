#include "text/json_schema_compiler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace sparkserve {
namespace {

using Kind = JsonNode::Kind;

bool is_annotation(const std::string& k) {
  static const std::set<std::string> names = {
      "title", "description", "default", "examples", "example", "format", "$schema", "$id", "$comment",
      "$anchor", "deprecated", "readOnly", "writeOnly", "discriminator", "contentEncoding", "contentMediaType",
      "propertyOrdering", "$defs", "definitions", "strict"};
  return names.count(k) > 0 || k.rfind("x-", 0) == 0;
}

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> names = {
      "type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
      "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
      "anyOf", "oneOf", "allOf", "$ref", "nullable", "unevaluatedProperties"};
  return names;
}

// Keywords that constrain a value (everything known except the combinators and type).
bool is_constraint(const std::string& k) {
  return known_keywords().count(k) > 0 && k != "type" && k != "nullable" && k != "$ref" && k != "anyOf" &&
         k != "oneOf" && k != "allOf";
}

std::string pointer_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const OrderedJson& root, JsonGrammar& g) : root_(root), g_(g) {}

  Expected<int32_t> compile(const OrderedJson& s, const std::string& path) {
    if (++depth_ > 256) return err(path, "schema nesting is too deep");
    auto r = compile_inner(s, path);
    --depth_;
    return r;
  }

  Status check_cycles() {
    // An anyOf chain that comes back to itself without reading a byte (a $ref to itself) would
    // recurse forever when a value starts.
    std::vector<uint8_t> mark(g_.nodes.size(), 0);
    std::function<bool(int32_t)> visit = [&](int32_t i) {
      const auto u = static_cast<size_t>(i);
      if (g_.nodes[u].kind != Kind::kAnyOf) return true;
      if (mark[u] == 1) return false;
      if (mark[u] == 2) return true;
      mark[u] = 1;
      for (int32_t a : g_.nodes[u].alternatives)
        if (!visit(a)) return false;
      mark[u] = 2;
      return true;
    };
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (!visit(static_cast<int32_t>(i))) return make_error("the schema refers to itself ($ref) without a value in between");
    return Status::Ok();
  }

  // Every node must admit some finite value (a required property that can only hold itself
  // cannot be written).
  Status check_finite() {
    std::vector<uint8_t> ok(g_.nodes.size(), 0);
    bool changed = true;
    while (changed) {
      changed = false;
      for (size_t i = 0; i < g_.nodes.size(); ++i) {
        if (ok[i]) continue;
        const JsonNode& n = g_.nodes[i];
        bool v = false;
        switch (n.kind) {
          case Kind::kObject:
            v = std::all_of(n.properties.begin(), n.properties.end(),
                            [&](const auto& p) { return !p.required || ok[static_cast<size_t>(p.value)]; });
            break;
          case Kind::kArray:
            v = n.min_items == 0 || ok[static_cast<size_t>(n.items)];
            break;
          case Kind::kAnyOf:
            v = std::any_of(n.alternatives.begin(), n.alternatives.end(),
                            [&](int32_t a) { return ok[static_cast<size_t>(a)] != 0; });
            break;
          default:
            v = true;
        }
        if (v) {
          ok[i] = 1;
          changed = true;
        }
      }
    }
    if (!ok[static_cast<size_t>(g_.root)]) return make_error("the schema admits no finite JSON value");
    return Status::Ok();
  }

 private:
  static Error err(const std::string& path, const std::string& what) {
    return make_error(what + " (at " + path + ")");
  }

  int32_t literals(std::vector<std::string> lits) {
    std::sort(lits.begin(), lits.end());
    lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
    JsonNode n;
    n.kind = Kind::kLiterals;
    n.literals = std::move(lits);
    return g_.add(std::move(n));
  }

  int32_t any_of(std::vector<int32_t> alts) {
    if (alts.size() == 1) return alts[0];
    JsonNode n;
    n.kind = Kind::kAnyOf;
    n.alternatives = std::move(alts);
    return g_.add(std::move(n));
  }

  Expected<int32_t> resolve_ref(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#')
      return err(path, "$ref \"" + ref + "\" is not a local reference (only \"#...\" references are supported)");
    const std::string pointer = ref.substr(1);
    auto it = refs_.find(pointer);
    if (it != refs_.end()) return it->second;
    const OrderedJson* target = &root_;
    if (!pointer.empty()) {
      try {
        target = &root_.at(OrderedJson::json_pointer(pointer));
      } catch (const std::exception&) {
        return err(path, "$ref \"" + ref + "\" does not point into the schema");
      }
    }
    // A placeholder first, so that recursive references resolve to it.
    JsonNode ph;
    ph.kind = Kind::kAnyOf;
    const int32_t id = g_.add(std::move(ph));
    refs_[pointer] = id;
    auto t = compile(*target, "#" + pointer);
    if (!t.ok()) return t.error();
    g_.nodes[static_cast<size_t>(id)].alternatives = {*t};
    return id;
  }

  Expected<int32_t> compile_inner(const OrderedJson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return g_.any_value();
      return err(path, "the schema false admits no value");
    }
    if (!s.is_object()) return err(path, "a schema must be an object or a boolean");
    std::vector<std::string> constraints;
    for (const auto& [k, v] : s.items()) {
      if (is_annotation(k)) continue;
      if (!known_keywords().count(k))
        return err(path, "unsupported JSON Schema keyword \"" + k + "\"");
      if (is_constraint(k)) constraints.push_back(k);
    }
    if (auto u = s.find("unevaluatedProperties"); u != s.end() && !(u->is_boolean() && !u->get<bool>()))
      return err(path, "unsupported JSON Schema keyword \"unevaluatedProperties\" (only false is supported)");
    auto others = [&](std::initializer_list<const char*> allowed) -> std::string {
      for (const auto& c : constraints)
        if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return c == a; })) return c;
      if (s.contains("type") && std::none_of(allowed.begin(), allowed.end(), [](const char* a) { return std::string(a) == "type"; }))
        return "type";
      return "";
    };

    if (auto r = s.find("$ref"); r != s.end()) {
      if (!r->is_string()) return err(path, "$ref must be a string");
      if (auto o = others({}); !o.empty() || s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf"))
        return err(path, "\"$ref\" next to other constraints (\"" + (o.empty() ? std::string("anyOf/oneOf/allOf") : o) +
                             "\") is not supported");
      auto id = resolve_ref(r->get<std::string>(), path + "/$ref");
      if (!id.ok()) return id;
      return nullable(s, *id);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      auto a = s.find(comb);
      if (a == s.end()) continue;
      if (!a->is_array() || a->empty()) return err(path, std::string(comb) + " must be a non-empty array");
      if (auto o = others({}); !o.empty())
        return err(path, "\"" + std::string(comb) + "\" next to other constraints (\"" + o + "\") is not supported");
      if (s.contains("allOf") || (std::string(comb) == "anyOf" && s.contains("oneOf")))
        return err(path, "combining anyOf / oneOf / allOf in one schema is not supported");
      std::vector<int32_t> alts;
      for (size_t i = 0; i < a->size(); ++i) {
        auto id = compile((*a)[i], path + "/" + comb + "/" + std::to_string(i));
        if (!id.ok()) return id;
        alts.push_back(*id);
      }
      return nullable(s, any_of(std::move(alts)));
    }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1)
        return err(path, "allOf is supported with exactly one schema");
      if (auto o = others({}); !o.empty())
        return err(path, "\"allOf\" next to other constraints (\"" + o + "\") is not supported");
      auto id = compile((*a)[0], path + "/allOf/0");
      if (!id.ok()) return id;
      return nullable(s, *id);
    }

    // The types this schema allows.
    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string()) {
        types.push_back(t->get<std::string>());
      } else if (t->is_array() && !t->empty()) {
        for (const auto& x : *t) {
          if (!x.is_string()) return err(path, "type must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return err(path, "type must be a string or a non-empty list of strings");
      }
      for (const auto& x : types)
        if (x != "object" && x != "array" && x != "string" && x != "number" && x != "integer" && x != "boolean" && x != "null")
          return err(path, "unknown type \"" + x + "\"");
    }

    if (s.contains("enum") || s.contains("const")) {
      if (auto o = others({"enum", "const", "type"}); !o.empty())
        return err(path, "\"enum\"/\"const\" next to \"" + o + "\" is not supported");
      std::vector<OrderedJson> values;
      if (auto e = s.find("enum"); e != s.end()) {
        if (!e->is_array() || e->empty()) return err(path, "enum must be a non-empty array");
        for (const auto& v : *e) values.push_back(v);
      }
      if (auto c = s.find("const"); c != s.end()) {
        if (s.contains("enum")) {
          const OrderedJson cv = *c;
          std::erase_if(values, [&](const OrderedJson& v) { return v != cv; });
        } else {
          values.push_back(*c);
        }
      }
      std::vector<std::string> lits;
      for (const auto& v : values)
        if (types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(v, t); }))
          lits.push_back(v.is_string() ? py_json_quote(v.get<std::string>()) : py_json_dumps(v));
      if (lits.empty()) return err(path, "no value of enum/const has the schema's type");
      if (lits.size() > 65535) return err(path, "enum has too many values (at most 65535)");
      return nullable(s, literals(std::move(lits)));
    }

    if (types.empty()) {
      // No type: the one its keywords are about (any value when there are none).
      auto has = [&](std::initializer_list<const char*> ks) {
        return std::any_of(ks.begin(), ks.end(), [&](const char* k) { return s.contains(k); });
      };
      if (has({"properties", "required", "additionalProperties", "unevaluatedProperties"})) types = {"object"};
      else if (has({"items", "minItems", "maxItems"})) types = {"array"};
      else if (has({"minLength", "maxLength", "pattern"})) types = {"string"};
      else if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types = {"number"};
      else return nullable(s, g_.any_value());
    }
    std::vector<int32_t> alts;
    for (const auto& t : types) {
      auto id = compile_typed(s, t, path);
      if (!id.ok()) return id;
      alts.push_back(*id);
    }
    return nullable(s, any_of(std::move(alts)));
  }

  static bool has_type(const OrderedJson& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    return false;
  }

  Expected<int32_t> nullable(const OrderedJson& s, int32_t id) {
    auto n = s.find("nullable");
    if (n == s.end()) return id;
    if (!n->is_boolean()) return err("#", "nullable must be a boolean");
    if (!n->get<bool>()) return id;
    return any_of({id, literals({"null"})});
  }

  static Expected<uint32_t> count_field(const OrderedJson& s, const char* key, const std::string& path, uint32_t dflt) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number() || it->get<double>() < 0 || std::floor(it->get<double>()) != it->get<double>())
      return err(path, std::string(key) + " must be a non-negative integer");
    const double v = it->get<double>();
    return v >= static_cast<double>(JsonNode::kUnbounded) ? JsonNode::kUnbounded - 1 : static_cast<uint32_t>(v);
  }

  Expected<int32_t> compile_typed(const OrderedJson& s, const std::string& type, const std::string& path) {
    if (type == "null") return literals({"null"});
    if (type == "boolean") return literals({"false", "true"});
    if (type == "string") return compile_string(s, path);
    if (type == "number" || type == "integer") return compile_number(s, type == "integer", path);
    if (type == "array") return compile_array(s, path);
    return compile_object(s, path);
  }

  Expected<int32_t> compile_string(const OrderedJson& s, const std::string& path) {
    JsonNode n;
    n.kind = Kind::kString;
    auto mn = count_field(s, "minLength", path, 0);
    if (!mn.ok()) return mn.error();
    auto mx = count_field(s, "maxLength", path, JsonNode::kUnbounded);
    if (!mx.ok()) return mx.error();
    n.min_length = *mn;
    n.max_length = *mx;
    if (n.min_length > n.max_length) return err(path, "minLength is larger than maxLength");
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) return err(path, "pattern must be a string");
      auto re = RegexNfa::compile(p->get<std::string>(), RegexNfa::Mode::kSearch);
      if (!re.ok()) return err(path + "/pattern", re.message());
      g_.regexes.push_back(std::move(*re));
      n.regex = static_cast<int32_t>(g_.regexes.size() - 1);
    }
    return g_.add(std::move(n));
  }

  Expected<int32_t> compile_number(const OrderedJson& s, bool integer, const std::string& path) {
    JsonNode n;
    n.kind = Kind::kNumber;
    n.integer = integer;
    auto bound = [&](const char* key, std::optional<double>& out) -> Status {
      auto it = s.find(key);
      if (it == s.end()) return Status::Ok();
      if (!it->is_number()) return err(path, std::string(key) + " must be a number");
      out = it->get<double>();
      return Status::Ok();
    };
    SS_RETURN_IF_ERROR(bound("minimum", n.minimum));
    SS_RETURN_IF_ERROR(bound("maximum", n.maximum));
    // exclusiveMinimum / exclusiveMaximum: a number (2019+), or a boolean next to minimum /
    // maximum (draft 4). With both a bound and an exclusive bound, the tighter one wins.
    auto exclusive = [&](const char* key, std::optional<double>& lim, bool& excl, bool is_min) -> Status {
      auto it = s.find(key);
      if (it == s.end()) return Status::Ok();
      if (it->is_boolean()) {
        excl = it->get<bool>() && lim.has_value();
        return Status::Ok();
      }
      if (!it->is_number()) return err(path, std::string(key) + " must be a number or a boolean");
      const double v = it->get<double>();
      if (!lim || (is_min ? v >= *lim : v <= *lim)) {
        lim = v;
        excl = true;
      }
      return Status::Ok();
    };
    SS_RETURN_IF_ERROR(exclusive("exclusiveMinimum", n.minimum, n.exclusive_minimum, true));
    SS_RETURN_IF_ERROR(exclusive("exclusiveMaximum", n.maximum, n.exclusive_maximum, false));
    if (n.minimum && n.maximum) {
      const double a = *n.minimum, b = *n.maximum;
      if (a > b || (a == b && (n.exclusive_minimum || n.exclusive_maximum)))
        return err(path, "no number lies between the minimum and the maximum");
    }
    if (integer && (n.minimum || n.maximum)) {
      // Some integer must fit.
      long double lo = n.minimum ? (n.exclusive_minimum ? std::floor(static_cast<long double>(*n.minimum)) + 1
                                                        : std::ceil(static_cast<long double>(*n.minimum)))
                                 : -1e18L;
      long double hi = n.maximum ? (n.exclusive_maximum ? std::ceil(static_cast<long double>(*n.maximum)) - 1
                                                        : std::floor(static_cast<long double>(*n.maximum)))
                                 : 1e18L;
      if (lo > hi) return err(path, "no integer lies between the minimum and the maximum");
      if (lo > 999999999999999999.0L || hi < -999999999999999999.0L)
        return err(path, "integer bounds beyond 18 digits are not supported");
    }
    return g_.add(std::move(n));
  }

  Expected<int32_t> compile_array(const OrderedJson& s, const std::string& path) {
    JsonNode n;
    n.kind = Kind::kArray;
    auto mn = count_field(s, "minItems", path, 0);
    if (!mn.ok()) return mn.error();
    auto mx = count_field(s, "maxItems", path, JsonNode::kUnbounded);
    if (!mx.ok()) return mx.error();
    n.min_items = *mn;
    n.max_items = *mx;
    if (n.min_items > n.max_items) return err(path, "minItems is larger than maxItems");
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return err(path, "the array form of \"items\" (tuples) is not supported");
      auto id = compile(*it, path + "/items");
      if (!id.ok()) return id;
      n.items = *id;
    } else {
      n.items = g_.any_value();
    }
    return g_.add(std::move(n));
  }

  Expected<int32_t> compile_object(const OrderedJson& s, const std::string& path) {
    JsonNode n;
    n.kind = Kind::kObject;
    // Reserve the id first: properties may refer back through $ref.
    std::vector<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) return err(path, "required must be an array of strings");
      for (const auto& x : *r) {
        if (!x.is_string()) return err(path, "required must be an array of strings");
        required.push_back(x.get<std::string>());
      }
    }
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (!(a->is_boolean() && !a->get<bool>())) {
        auto id = compile(*a, path + "/additionalProperties");
        if (!id.ok()) return id;
        n.additional = *id;
      }
    }
    std::set<std::string> names;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) return err(path, "properties must be an object");
      if (p->size() > 64) return err(path, "objects with more than 64 properties are not supported");
      for (const auto& [name, sub] : p->items()) {
        auto id = compile(sub, path + "/properties/" + pointer_escape(name));
        if (!id.ok()) return id;
        JsonNode::Property prop;
        prop.key_json = py_json_quote(name);
        prop.value = *id;
        prop.required = std::find(required.begin(), required.end(), name) != required.end();
        n.properties.push_back(std::move(prop));
        names.insert(name);
      }
    }
    for (const auto& r : required) {
      if (names.count(r)) continue;
      // A required key that is not a property: written with the additional schema, if any.
      if (n.additional < 0)
        return err(path, "required property \"" + r + "\" is not in properties and additionalProperties is not allowed");
      if (n.properties.size() >= 64) return err(path, "objects with more than 64 properties are not supported");
      JsonNode::Property prop;
      prop.key_json = py_json_quote(r);
      prop.value = n.additional;
      prop.required = true;
      n.properties.push_back(std::move(prop));
      names.insert(r);
    }
    return g_.add(std::move(n));
  }

  const OrderedJson& root_;
  JsonGrammar& g_;
  std::map<std::string, int32_t> refs_;
  int depth_ = 0;
};

}  // namespace

Expected<std::shared_ptr<const JsonGrammar>> compile_json_schema(const OrderedJson& schema) {
  auto g = std::make_shared<JsonGrammar>();
  SchemaCompiler c(schema, *g);
  auto root = c.compile(schema, "#");
  if (!root.ok()) return root.error();
  g->root = *root;
  SS_RETURN_IF_ERROR(c.check_cycles());
  SS_RETURN_IF_ERROR(c.check_finite());
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

std::shared_ptr<const JsonGrammar> json_object_grammar() {
  auto g = std::make_shared<JsonGrammar>();
  JsonNode obj;
  obj.kind = Kind::kObject;
  obj.additional = g->any_value();
  g->root = g->add(std::move(obj));
  return g;
}

Expected<std::shared_ptr<const JsonGrammar>> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error("choice must list at least one string");
  if (choices.size() > 65535) return make_error("choice lists too many strings");
  auto g = std::make_shared<JsonGrammar>();
  JsonNode n;
  n.kind = Kind::kLiterals;
  n.literals = choices;
  std::sort(n.literals.begin(), n.literals.end());
  n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
  g->root = g->add(std::move(n));
  g->raw = true;
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

Expected<std::shared_ptr<const JsonGrammar>> regex_grammar(std::string_view pattern) {
  auto re = RegexNfa::compile(pattern, RegexNfa::Mode::kFullMatch);
  if (!re.ok()) return re.error();
  auto g = std::make_shared<JsonGrammar>();
  g->regexes.push_back(std::move(*re));
  JsonNode n;
  n.kind = Kind::kText;
  n.regex = 0;
  g->root = g->add(std::move(n));
  g->raw = true;
  return std::shared_ptr<const JsonGrammar>(std::move(g));
}

}  // namespace sparkserve
