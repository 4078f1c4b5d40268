"""Random small templates (expressions, filters, tests, methods, loops) over the feature-case
variables, generated deterministically from a seed: a differential test against jinja2 on inputs
nobody hand-picked."""

import random

ATOMS = ["s", "u", "n", "f", "neg", "t", "fa", "nul", "lst", "strs", "d", "nested", "users", "mixed", "empty",
         "edict", "ws", "floats", "q", "undefined_var", "0", "1", "-2", "2.5", "1e-05", "'abc'", "'  x y  '",
         "'é中'", "''", "[1, 2, 3]", "['b', 'a']", "{'k': 1, 'j': [2]}", "none", "true", "false", "(1, 'a')", "'a\\nb'"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"]
FILTERS = ["trim", "length", "string", "upper", "lower", "title", "capitalize", "first", "last", "list", "reverse",
           "sort", "unique", "join", "join(', ')", "tojson", "default('dflt')", "int", "float", "abs", "round",
           "round(1)", "items", "dictsort", "min", "max", "sum", "wordcount", "center(9)", "indent(2)",
           "replace('a', 'X')", "batch(2)", "map('string')", "select", "reject('none')", "tojson(indent=1)",
           "safe", "escape", "count", "d(0, true)", "selectattr('age')", "map(attribute='name')"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "odd", "even", "boolean", "true", "false", "callable", "lower", "upper", "divisibleby 2", "in [1, 'abc']",
         "eq 1", "gt 0"]
METHODS = ["strip()", "split()", "split(',')", "startswith('a')", "endswith('c')", "upper()", "lower()",
           "replace('b', '-')", "lstrip('a ')", "rstrip()", "title()", "find('b')", "count('a')", "get('k')",
           "items()", "keys()", "values()", "index(1)", "rsplit(None, 1)", "capitalize()"]
SLICES = ["[0]", "[-1]", "[1:]", "[:-1]", "[::-1]", "[::2]", "['k']", ".k", "[5]", "[1:3]"]


def expr(rng, depth=0):
    if depth >= 3 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    k = rng.randrange(8)
    if k == 0:
        return f"({expr(rng, depth + 1)} {rng.choice(BINOPS)} {expr(rng, depth + 1)})"
    if k == 1:
        return f"({expr(rng, depth + 1)}|{rng.choice(FILTERS)})"
    if k == 2:
        return f"({expr(rng, depth + 1)} is {'not ' if rng.random() < 0.3 else ''}{rng.choice(TESTS)})"
    if k == 3:
        return f"({expr(rng, depth + 1)}).{rng.choice(METHODS)}"
    if k == 4:
        return f"({expr(rng, depth + 1)}){rng.choice(SLICES)}"
    if k == 5:
        return f"({expr(rng, depth + 1)} if {expr(rng, depth + 1)} else {expr(rng, depth + 1)})"
    if k == 6:
        return f"(not {expr(rng, depth + 1)})"
    return f"[{expr(rng, depth + 1)}, {expr(rng, depth + 1)}]"


def template(seed):
    rng = random.Random(seed)
    k = rng.randrange(4)
    if k == 0:
        return "{{ " + expr(rng) + " }}"
    if k == 1:
        return ("{% for x in " + expr(rng) + " %}{{ loop.index }}:{{ x }}{{ ',' if not loop.last }}{% else %}"
                "empty{% endfor %}")
    if k == 2:
        return "{% set v = " + expr(rng) + " %}{% if v %}T{{ v }}{% elif v is defined %}F{% endif %}"
    return "{{ " + expr(rng) + " }}|{{ " + expr(rng) + " }}"


def all_templates(n=300, seed=777):
    return {f"rand_tpl_{i:03d}": template(seed + i) for i in range(n)}
