#include "text/py_json.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

// Expected strings are what CPython 3.11 prints for repr(float) / json.dumps(..., ensure_ascii=False).
TEST(PyJson, FloatRepr) {
  EXPECT_EQ(py_float_repr(2.0), "2.0");
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1e-05), "1e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(py_float_repr(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(py_float_repr(123.456), "123.456");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
}

TEST(PyJson, Dumps) {
  auto v = OrderedJson::parse(R"({"b": 1, "a": [true, null, 2.5, "x\"y\n"], "ü": {"k": -3}})");
  EXPECT_EQ(py_json_dumps(v), "{\"b\": 1, \"a\": [true, null, 2.5, \"x\\\"y\\n\"], \"ü\": {\"k\": -3}}");
  EXPECT_EQ(py_json_dumps(OrderedJson::parse("[]")), "[]");
  EXPECT_EQ(py_json_dumps(OrderedJson::parse("{}")), "{}");
  EXPECT_EQ(py_json_quote(std::string("\x01\x7f", 2)), "\"\\u0001\x7f\"");
}

}  // namespace
}  // namespace sparkserve
