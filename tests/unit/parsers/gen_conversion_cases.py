#!/usr/bin/env python3
"""Generates tests/unit/parsers/data/param_conversions.json: tool-parameter values converted the
way vLLM's qwen3_coder parser does it (serving-api.md §3.2), computed with CPython's own int(),
float(), json.loads, ast.literal_eval and json.dumps(ensure_ascii=False) as the oracle.

Run: python3 tests/unit/parsers/gen_conversion_cases.py   (deterministic; CPython >= 3.10)

Each case: {"type": schema type or null (parameter not in the schema), "value": text,
"expected": json.dumps of the converted value, "gap": reason or ""}. A non-empty "gap" marks a
documented deviation (64-bit integers, Unicode digits, values json.dumps cannot write, ...);
the C++ test checks those cases only for "no crash, some JSON".
"""
import ast
import json
import os
import random
import re

STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def convert(value, ptype):
    if value.lower() == "null":
        return None
    if ptype is None:
        return value
    t = ptype
    if t in STRING_TYPES:
        return value
    if t.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except (ValueError, TypeError):
            return value
    if t.startswith(("num", "float")):
        try:
            f = float(value)
            return f if f - int(f) != 0 else int(f)
        except (ValueError, TypeError, OverflowError):
            return value
    if t in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = t in ("object", "array", "arr") or t.startswith(("dict", "list"))
    if container:
        try:
            return json.loads(value)
        except (json.JSONDecodeError, TypeError, ValueError):
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def int_out_of_range(x):
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return not (-(2**63) <= x < 2**64)
    if isinstance(x, (list, tuple)):
        return any(int_out_of_range(v) for v in x)
    if isinstance(x, dict):
        return any(int_out_of_range(v) for v in x.values())
    return False


def gap_of(value, ptype, result):
    numeric = ptype is not None and ptype.startswith(("int", "uint", "long", "short", "unsigned", "num", "float"))
    if numeric and not isinstance(result, str) and any(ord(c) > 127 for c in value):
        return "Unicode digits/whitespace in int()/float()"
    if int_out_of_range(result):
        return "integer outside 64 bits"
    if re.search(r"\d{19,}", value):
        return "integer outside 64 bits"
    if re.search(r"NaN|Infinity", value) and ptype and not ptype in STRING_TYPES:
        return "json.loads NaN/Infinity"
    if re.search(r"True\s*:|False\s*:|1\s*:|0\s*:", value) and isinstance(result, dict):
        return "bool/int dict key collision"
    try:
        json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return "json.dumps cannot write the value (vLLM's parse fails)"
    if isinstance(result, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in result):
        return "lone surrogate"
    return ""


HAND = [
    "", " ", "0", "-0", "+0", "42", " 42 ", "-17", "+8", "1_000", "1__0", "_1", "1_", "007", "0x1f", "0o7", "0b11",
    "3.14", "-2.5", "1e3", "1E-3", "1.", ".5", "5.0", "-0.0", "1e400", "-1e400", "inf", "-Infinity", "nan", "NaN",
    "1_0.5", "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551615",
    "true", "True", "TRUE", "false", "False", "yes", "no", "1", "null", "NULL", "Null", "None", "none",
    "[]", "{}", "[1, 2, 3]", "[1,2,3,]", "['a', 'b']", '["a", "b"]', "(1, 2)", "(1,)", "()", "{1, 2}",
    '{"a": 1}', "{'a': 1}", "{'a': True, 'b': None}", '{"a": {"b": [1, {"c": null}]}}', "{'k': (1, 2)}",
    '"quoted"', "'single'", "'it''s'", "'''triple'''", 'r"\\d+"', "b'bytes'", "1j", "1+2j", "-'x'",
    '{"b": 2, "a": 1}', '{"a": 1, "a": 2}', "{'a': 1, 'a': 2}", "[1, [2, [3, [4]]]]", "[1.5, -0.25, 1e-07]",
    "hello world", "Paris", "São Paulo", "日本語", "🙂", "a\nb", "\n", "\t5\t", "5\n", "'\\u00e9'", "'\\x41'",
    '"\\u00e9"', '"\\ud83d\\ude00"', "'\\ud800'", "[1, 2", "{'a': }", "x = 1", "__import__('os')", "1 if 1 else 2",
    "[1, 2] # comment", "  [1]", "\t[1]", "[\n1,\n2\n]", "{1: 'x', 2.5: 'y', None: 3}", "{(1, 2): 3}",
    "--5", "-(5)", "+-5", "-True", "1e", "e5", "1e+5", "0.1", "0.30000000000000004", "123456789012345678",
    "1.7976931348623157e308", "5e-324", "2.5e-5", "100000000000000000.0", "1e16", "1e15", "123.0",
]

TYPES = [None, "string", "text", "enum", "integer", "int", "uint32", "long", "number", "float", "num",
         "boolean", "bool", "binary", "object", "array", "arr", "dict", "list", "['integer', 'null']", "any"]


def random_values(rng, n):
    atoms = ["1", "2", "0", "-", "+", ".", "e", "_", "'", '"', "[", "]", "{", "}", "(", ")", ",", ":", " ",
             "True", "None", "null", "true", "a", "é", "\\n", "\\", "x", "#", "\n", "0x", "j"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 7)
        out.append("".join(rng.choice(atoms) for _ in range(k)))
    return out


def main():
    rng = random.Random(1234)
    values = HAND + random_values(rng, 300)
    cases = []
    for ptype in TYPES:
        for v in values:
            result = convert(v, ptype)
            gap = gap_of(v, ptype, result)
            try:
                expected = json.dumps(result, ensure_ascii=False)
            except (TypeError, ValueError):
                expected = None
            if expected is not None:
                try:
                    expected.encode("utf-8")
                except UnicodeEncodeError:
                    expected = None
            cases.append({"type": ptype, "value": v, "expected": expected, "gap": gap})
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "data", "param_conversions.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]\n")
    print(f"{len(cases)} cases, {sum(1 for c in cases if c['gap'])} marked as gaps -> {path}")


if __name__ == "__main__":
    main()
