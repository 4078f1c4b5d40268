"""Structured outputs on the tiny random-weight model, validated by the `jsonschema` package
(Draft 2020-12): a corpus of generated schemas (objects with required / optional properties,
nested objects and arrays with bounds, strings with enum / const / pattern / lengths, numbers
and integers with bounds, booleans, null, nullable types, anyOf / oneOf, $defs / $ref) sampled
with random seeds, thinking on and off, streamed and not. Random weights put no preference on
JSON at all, so every document that validates does so only because the constraint masked
everything else. With thinking on, a logit bias ends the thought at once: the JSON must then
land in `content`, after </think>, never in the reasoning. Strings and arrays in the corpus are
bounded so that each document ends within max_tokens (unbounded ones are covered by the C++
tests of the grammar). Also: json_object, choice, regex, guided_json on completions, and the 400
that names an unsupported keyword."""
import concurrent.futures
import json
import random

import httpx
import jsonschema
import pytest

from conftest import MODEL_NAME, Server

CORPUS_SIZE = 20
PATTERNS = [r"^[a-z]{1,4}$", r"^\d{3}-\d{2}$", r"^(red|green|blue)$", r"^[A-Z][a-z]{0,3}$", r"^x+y?$"]


def gen_value(rng, depth, defs):
    kinds = ["str_len", "str_enum", "str_pattern", "const", "integer", "int_bounds", "number", "num_bounds",
             "boolean", "null", "nullable", "any_of", "one_of"]
    if depth < 2:
        kinds += ["array", "object", "object", "ref"]
    k = rng.choice(kinds)
    if k == "str_len":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 5)}
    if k == "str_enum":
        return {"type": "string", "enum": rng.sample(["alpha", "beta", "gamma", "delta", "x y", "é", 'q"t'], rng.randint(1, 4))}
    if k == "str_pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS), "maxLength": 8}
    if k == "const":
        return {"const": rng.choice(["fixed", 7, True, None, 2.5])}
    if k == "integer":
        return {"type": "integer"}
    if k == "int_bounds":
        lo = rng.randint(-20, 20)
        s = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
        if rng.random() < 0.3:
            s["exclusiveMaximum"] = s.pop("maximum")
        return s
    if k == "number":
        return {"type": "number"}
    if k == "num_bounds":
        lo = round(rng.uniform(-5, 5), 2)
        return {"type": "number", "minimum": lo, "exclusiveMaximum": lo + rng.choice([0.5, 3, 100])}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "null":
        return {"type": "null"}
    if k == "nullable":
        return {"type": [rng.choice(["string", "integer", "boolean"]), "null"], "maxLength": 4}
    if k == "any_of":
        return {"anyOf": [gen_value(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    if k == "one_of":  # alternatives of different JSON types, so exactly one can match
        return {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}, {"type": "array", "maxItems": 0}]}
    if k == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": gen_value(rng, depth + 1, defs), "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
    if k == "ref":
        name = f"Def{len(defs)}"
        defs[name] = gen_object(rng, depth + 1, defs)
        return {"$ref": f"#/$defs/{name}"}
    return gen_object(rng, depth + 1, defs)


def gen_object(rng, depth, defs):
    names = rng.sample(["id", "name", "tags", "score", "ok", "when", "nested", "kind", "n", "note"], rng.randint(1, 4))
    props = {n: gen_value(rng, depth, defs) for n in names}
    required = [n for n in names if rng.random() < 0.6]
    s = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        s["required"] = required
    return s


def corpus():
    rng = random.Random(2026)
    out = []
    for _ in range(CORPUS_SIZE):
        defs = {}
        root = gen_object(rng, 0, defs)
        if defs:
            root["$defs"] = defs
        out.append(root)
    return out


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "2048", "--max-num-seqs", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def think_end(server):
    (tid,) = httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": "</think>"}).json()["tokens"]
    return tid


def chat(server, body):
    """(reasoning, content, finish_reason), streamed or not as body["stream"] says."""
    if not body.get("stream"):
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["message"].get("reasoning_content") or "", c["message"]["content"] or "", c["finish_reason"]
    reasoning, content, finish = "", "", None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:])["choices"]:
                reasoning += ch["delta"].get("reasoning_content") or ""
                content += ch["delta"].get("content") or ""
                finish = ch.get("finish_reason") or finish
    return reasoning, content, finish


def test_generated_schema_corpus_validates(server, think_end):
    cases = []
    for i, schema in enumerate(corpus()):
        jsonschema.Draft202012Validator.check_schema(schema)
        for thinking in (False, True):
            for stream in (False, True):
                body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Answer in JSON."}],
                        "max_tokens": 600, "temperature": 1.0, "seed": 1000 * i + 2 * thinking + stream,
                        "stream": stream, "chat_template_kwargs": {"enable_thinking": thinking},
                        "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                                   "strict": True}}}
                if thinking:
                    body["logit_bias"] = {str(think_end): 100}
                cases.append((i, thinking, stream, schema, body))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: chat(server, c[4]), cases))
    failures = []
    for (i, thinking, stream, schema, _), (reasoning, content, finish) in zip(cases, results):
        where = f"schema {i} thinking={thinking} stream={stream}: {json.dumps(schema)}\ncontent {content!r}"
        if finish != "stop":
            failures.append(f"finish_reason {finish}: {where}")
            continue
        try:
            jsonschema.validate(json.loads(content), schema, cls=jsonschema.Draft202012Validator)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{e}: {where}")
        if thinking and "{" in reasoning:
            failures.append(f"JSON in the reasoning {reasoning!r}: {where}")
    assert not failures, f"{len(failures)} of {len(cases)} failed:\n" + "\n".join(failures[:5])


def test_json_object_choice_and_regex(server):
    base = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Go"}], "temperature": 1.0,
            "chat_template_kwargs": {"enable_thinking": False}}
    # json_object: any object; random weights may nest it deep, so give it room and check the
    # ones that end (each must be an object).
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda seed: chat(server, {**base, "seed": seed, "max_tokens": 300,
                                                         "response_format": {"type": "json_object"}}), range(6)))
    ended = 0
    for _, content, finish in outs:
        if finish == "stop":
            assert isinstance(json.loads(content), dict), content
            ended += 1
    assert ended >= 1, outs
    choices = ["Paris", "Rome", "Tokyo"]
    for seed in range(3):
        _, content, finish = chat(server, {**base, "seed": seed, "max_tokens": 20, "structured_outputs": {"choice": choices}})
        assert content in choices and finish == "stop"
    for seed in range(3):
        _, content, finish = chat(server, {**base, "seed": seed, "max_tokens": 30,
                                           "structured_outputs": {"regex": r"(yes|no), [0-9]{2,3}"}})
        assert finish == "stop" and content.split(", ")[0] in ("yes", "no") and 2 <= len(content.split(", ")[1]) <= 3
    # Completions take vLLM's older guided_json too.
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["a"],
              "additionalProperties": False}
    r = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "model": MODEL_NAME, "prompt": "JSON:", "max_tokens": 100, "temperature": 1.0, "seed": 3, "guided_json": schema}).json()
    jsonschema.validate(json.loads(r["choices"][0]["text"]), schema)


@pytest.mark.parametrize("schema,words", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, ["uniqueItems", "(at #)"]),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "email", "not": {"const": "x"}}}},
     ['"not"', "#/properties/a"]),
    ({"type": "object", "patternProperties": {"^x": {}}}, ["patternProperties"]),
    ({"type": "string", "pattern": "(a)\\1"}, ["backreferences"]),
])
def test_unsupported_keywords_are_named(server, schema, words):
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema"
    for w in words:
        assert w in err["message"], err["message"]
