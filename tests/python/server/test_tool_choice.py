"""tool_choice "required" and a named function through the openai SDK on the tiny random-weight
model: real sampling under the tool-call constraint (no scripted output). Random weights never
write a tool call by themselves, so every call below exists only because the constraint masked
everything else; each must parse into a call of an offered (or the named) function whose
arguments satisfy the schema (enum, integer, boolean, required)."""
import json

import httpx
import pytest

from conftest import MODEL_NAME, Server, collect_chat_stream

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "set_alarm",
        "parameters": {"type": "object", "properties": {
            "hour": {"type": "integer"}, "enabled": {"type": "boolean"}},
            "required": ["hour", "enabled"]}}},
]
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "1024")  # the tools make a ~380-token prompt
    yield s
    s.stop()


@pytest.fixture
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def check_call(name, arguments):
    args = json.loads(arguments)
    if name == "get_weather":
        assert args["city"] in ("Paris", "Rome", "Tokyo")
        assert set(args) <= {"city", "days", "unit"}
        if "days" in args:
            assert isinstance(args["days"], int)
        if "unit" in args:
            assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert name == "set_alarm"
        assert set(args) == {"hour", "enabled"}
        assert isinstance(args["hour"], int) and isinstance(args["enabled"], bool)


def create(client, **kw):
    args = dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, max_tokens=300, temperature=1.0)
    args.update(kw)
    return client.chat.completions.create(**args)


def think_end_bias(server):
    (tid,) = httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": "</think>"}).json()["tokens"]
    return {str(tid): 100}


def collect_stream(stream):
    reasoning, content, calls, finish = collect_chat_stream(stream)
    return reasoning, content, [{"name": calls[i]["name"], "arguments": calls[i]["arguments"]} for i in sorted(calls)], finish


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_required_single_call_non_streaming(client, seed):
    r = create(client, tool_choice="required", parallel_tool_calls=False, seed=seed, extra_body=NO_THINK)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert (c.message.content or "").strip() == ""  # at most the blank lines before <tool_call>
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    check_call(call.function.name, call.function.arguments)
    assert r.usage.completion_tokens < 300


def test_required_parallel_calls_are_all_valid(client):
    names = set()
    for seed in range(5):
        r = create(client, tool_choice="required", seed=100 + seed, extra_body=NO_THINK)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        assert len(c.message.tool_calls) >= 1
        complete = r.usage.completion_tokens < 300  # else the last call may be cut off
        for call in c.message.tool_calls[: None if complete else -1]:
            check_call(call.function.name, call.function.arguments)
            names.add(call.function.name)
    assert names <= {"get_weather", "set_alarm"}


@pytest.mark.parametrize("thinking", [False, True])
def test_named_function_streaming_equals_non_streaming(client, server, thinking):
    extra = {} if thinking else dict(NO_THINK)
    kw = dict(tool_choice={"type": "function", "function": {"name": "set_alarm"}}, seed=7)
    if thinking:
        kw["logit_bias"] = think_end_bias(server)  # random weights would think until max_tokens
    full = create(client, extra_body=extra, **kw)
    c = full.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls
    assert call.function.name == "set_alarm"
    check_call(call.function.name, call.function.arguments)
    assert (c.message.content or "").strip() == ""
    assert not getattr(c.message, "reasoning_content", None)  # the thought ended at once
    reasoning, content, calls, finish = collect_stream(create(client, stream=True, extra_body=extra, **kw))
    assert finish == "tool_calls"
    assert content == (c.message.content or "") and reasoning == ""
    assert calls == [{"name": "set_alarm", "arguments": call.function.arguments}]


def test_required_streaming_with_thinking(client, server):
    kw = dict(tool_choice="required", parallel_tool_calls=False, seed=11, logit_bias=think_end_bias(server))
    reasoning, content, calls, finish = collect_stream(create(client, stream=True, **kw))
    assert finish == "tool_calls"
    (call,) = calls
    check_call(call["name"], call["arguments"])


def test_thinking_comes_first(client):
    # Without help, random weights keep thinking; no call may appear inside the reasoning.
    r = create(client, tool_choice="required", max_tokens=12, seed=5)
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert not c.message.tool_calls
    assert "<tool_call>" not in (getattr(c.message, "reasoning_content", None) or "")


def test_named_free_text_parameter(client):
    # A string parameter is free text: random weights never close it, so the call is cut off at
    # max_tokens, but it is still a call of the named function and its value holds no tag.
    r = create(client, tools=TOOLS + [SEARCH], tool_choice={"type": "function", "function": {"name": "search"}},
               max_tokens=24, seed=3, extra_body=NO_THINK)
    c = r.choices[0]
    assert r.usage.completion_tokens == 24
    (call,) = c.message.tool_calls
    assert call.function.name == "search"
    args = json.loads(call.function.arguments)
    assert set(args) <= {"query"}
    for tag in ("</parameter>", "<parameter=", "</function>", "<tool_call>"):
        assert tag not in args.get("query", "")


def test_greedy_request_unchanged_by_a_constrained_neighbour(client):
    import concurrent.futures
    plain = dict(model=MODEL_NAME, messages=MSGS, max_tokens=16, temperature=0, extra_body={"return_token_ids": True})
    alone = client.chat.completions.create(**plain).choices[0].token_ids
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(create, client, tool_choice="required", seed=s, extra_body=NO_THINK) for s in range(3)]
        mixed = pool.submit(lambda: client.chat.completions.create(**plain)).result().choices[0].token_ids
        for f in futs:
            assert f.result().choices[0].finish_reason == "tool_calls"
    assert mixed == alone


@pytest.mark.parametrize("body,message", [
    ({"tool_choice": "required"}, "no `tools` were given"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "no `tools` were given"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "names the function \"nope\", which is not among `tools`"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "A named `tool_choice` must be"),
    ({"tools": TOOLS, "tool_choice": "required", "min_tokens": 2}, "min_tokens cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}], "tool_choice": "required"},
     "\"two words\" cannot be written"),
])
def test_tool_choice_errors(server, body, message):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL_NAME, "messages": MSGS, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"], err
    assert err["type"] == "BadRequestError"
