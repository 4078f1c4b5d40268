"""Reasoning, tool calls and stop strings through the output parser, on the server with a scripted
fake model runner (tests/serve_scripted; random weights never write a tool call): every request
generates the tokens of conftest.SCRIPTED_TOOL_TEXT, then EOS, through the real engine, sampler,
detokenizer and parsers."""
import json

import httpx
import pytest

from conftest import MODEL_NAME, collect_chat_stream

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
REASONING = "The user wants the weather, so I call the tool.\n"


@pytest.fixture
def fclient(scripted_server):
    import openai
    return openai.OpenAI(base_url=scripted_server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_tool_call_non_streaming(fclient):
    r = fclient.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=TOOLS, max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.reasoning_content.strip() == REASONING.strip()
    assert (c.message.content or "").strip() == ""  # vLLM keeps the "\n\n" before <tool_call>
    (call,) = c.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("call_")


def test_tool_call_streaming(fclient):
    stream = fclient.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=TOOLS, max_tokens=200,
                                             stream=True)
    reasoning, content, calls, finish = collect_chat_stream(stream)
    assert finish == "tool_calls"
    assert reasoning.strip() == REASONING.strip()
    assert content.strip() == ""
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}


def test_tool_choice_none_leaves_text_as_content(fclient):
    r = fclient.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="none",
                                        max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert not c.message.tool_calls
    assert "<function=get_weather>" in c.message.content


def test_stop_string(fclient, scripted_server):
    stops_before = scripted_server.metric("sparkserve:request_success_total")
    r = fclient.completions.create(model=MODEL_NAME, prompt="x", max_tokens=200, stop=["so I"])
    c = r.choices[0]
    assert c.text == "The user wants the weather, "
    assert c.finish_reason == "stop"
    assert c.model_extra.get("stop_reason") == "so I"
    # The engine frees the request and counts it once, as "stop" (not "abort").
    import time
    for _ in range(100):
        if scripted_server.metric("sparkserve:request_success_total") == stops_before + 1:
            break
        time.sleep(0.05)
    text = __import__("httpx").get(scripted_server.url + "/metrics").text
    assert 'finished_reason="abort"} 0' in text


def test_max_tokens_cuts_scripted_output(fclient):
    r = fclient.completions.create(model=MODEL_NAME, prompt="x", max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
