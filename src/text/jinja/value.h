// The values a template computes with, with Python's semantics where they show in the output:
// str()/repr() spellings, truthiness, ==, ordering. Lists and dicts are shared and immutable once
// built (the sandbox forbids mutating them); only a namespace's attributes change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/py_json.h"

namespace sparkserve::jinja {

class Interpreter;
class Value;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable, Namespace, Loop };

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  // A one-shot Python iterator (what map/select/unique/... return in jinja2): always truthy, no
  // len(), not subscriptable, empty once iterated. `iterator_type` is its Python type name.
  std::string iterator_type;
  mutable bool consumed = false;
};

// Insertion-ordered, as Python dicts are. Keys compare with Python == (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

enum class CallableKind { Builtin, Macro, Method };

struct Callable {
  std::string name;
  CallableKind kind = CallableKind::Builtin;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

// The `loop` variable of a for loop.
struct LoopData {
  std::shared_ptr<const ListData> items;
  size_t index0 = 0;
  int depth0 = 0;
  std::shared_ptr<std::vector<Value>> last_changed;  // loop.changed() memory, shared by iterations
};

class Value {
 public:
  Value() = default;  // undefined with no hint
  static Value undefined(std::string hint);
  static Value none();
  Value(bool b);                                    // NOLINT
  Value(int v) : Value(static_cast<int64_t>(v)) {}  // NOLINT
  Value(int64_t v);                                 // NOLINT
  Value(double v);                                  // NOLINT
  Value(std::string s, bool markup = false);        // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(DictData data);
  static Value iterator(std::vector<Value> items, std::string type_name = "generator");
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn,
                        CallableKind kind = CallableKind::Builtin);
  static Value namespace_(DictData attrs);
  static Value loop(std::shared_ptr<LoopData> data);
  // Fails (OverflowError) on integers beyond int64 and on nesting deeper than 512.
  static Value from_json(const OrderedJson& j, int depth = 0);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && list_data().is_tuple; }
  bool is_iterator() const { return kind_ == Kind::List && !list_data().iterator_type.empty(); }
  bool is_sequence_list() const { return kind_ == Kind::List && list_data().iterator_type.empty(); }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_callable() const { return kind_ == Kind::Callable; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_loop() const { return kind_ == Kind::Loop; }
  bool is_markup() const { return kind_ == Kind::String && markup_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }  // Int or Bool
  double as_double() const;  // any number
  const std::string& str() const;  // String; for Undefined: the error hint
  const ListData& list_data() const { return *std::static_pointer_cast<const ListData>(obj_); }
  const std::vector<Value>& items() const { return list_data().items; }
  std::shared_ptr<const ListData> list_ptr() const { return std::static_pointer_cast<const ListData>(obj_); }
  const DictData& dict_data() const { return *std::static_pointer_cast<const DictData>(obj_); }
  DictData& namespace_data() const { return *std::static_pointer_cast<DictData>(obj_); }
  const Callable& callable_data() const { return *std::static_pointer_cast<const Callable>(obj_); }
  LoopData& loop_data() const { return *std::static_pointer_cast<LoopData>(obj_); }

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  // Immutable and shared: copying a Value (a variable, an attribute, an argument) does not copy
  // its text (a chat template passes an agent's ~50 KB of messages and system prompt around).
  std::shared_ptr<const std::string> s_;  // null: ""
  std::shared_ptr<void> obj_;
};

// Python semantics.
bool truthy(const Value& v);
std::string py_str(const Value& v);   // str(v); Undefined -> "" (raises nothing)
std::string py_repr(const Value& v);  // repr(v)
std::string py_repr_string(const std::string& s);
bool py_equal(const Value& a, const Value& b);
// a < b, raising TypeError as Python does for unorderable types.
bool py_less(const Value& a, const Value& b, const char* op = "<");
// Raises Python's TypeError for `a op b` when the two cannot be ordered (message in that order).
void check_orderable(const Value& a, const Value& b, const char* op);
// Python's type name, as used in its error messages ("str", "int", "NoneType", ...).
std::string py_type_name(const Value& v);
// jinja2's object_type_repr, used in undefined-attribute messages ("dict object", "None").
std::string object_type_repr(const Value& v);
// Iterates as Python's iter(): lists and tuples their items, dicts their keys, strings their
// characters, undefined nothing; anything else is a TypeError.
std::vector<Value> iterate(const Value& v);
// Raises the UndefinedError an undefined value carries when it is used in an operation.
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace sparkserve::jinja
