"""OpenAI Responses API (/v1/responses) through the official `openai` SDK on the tiny model:
text and reasoning streamed and not, function tools (a forced qwen3_coder call; tool_choice
"required" under the constraint), function_call / function_call_output / reasoning items in
the input, structured text.format, a Codex-shaped request with non-function tools (skipped with
a note, not a 400), and previous_response_id refused."""
import json
import os

import httpx
import openai
import pytest

from conftest import MODEL_NAME, Server

HERE = os.path.dirname(__file__)
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "4096")
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_reasoning_and_text_stream_and_not(server):
    c = client(server)
    r = c.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=10, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["reasoning"]  # thinking on by default (Qwen3.5)
    reasoning = r.output[0].content[0].text
    assert reasoning and r.usage.output_tokens == 10 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events, deltas = [], ""
    with c.responses.stream(model=MODEL_NAME, input="Hello", max_output_tokens=10, temperature=0) as stream:
        for ev in stream:
            events.append(ev)
            if ev.type == "response.reasoning_text.delta":
                deltas += ev.delta
    # A response cut by max_output_tokens ends with response.incomplete (get_final_response is for
    # response.completed), carrying the same output.
    final = events[-1].response
    assert deltas == reasoning == final.output[0].content[0].text
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Thinking off: the answer is a message with output_text.
    r = c.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=6, reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.output_text


def test_function_call_forced(scripted_server):
    c = client(scripted_server)
    r = c.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=200)
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": 3}
    assert call.call_id.startswith("call_") and r.status == "completed"
    args = ""
    with c.responses.stream(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=200) as s:
        for ev in s:
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        final = s.get_final_response()
    assert json.loads(args) == {"city": "Paris", "days": 3}
    assert final.output[1].arguments == call.arguments
    # The next turn: the call and its output go back as input items.
    r2 = c.responses.create(model=MODEL_NAME, tools=[WEATHER], max_output_tokens=5, input=[
        {"role": "user", "content": "Weather in Paris?"},
        r.output[0].model_dump(exclude_none=True), call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert r2.usage.input_tokens > r.usage.input_tokens + 20  # the call, its output and the reasoning were rendered


def test_required_tool_choice_under_the_constraint(server):
    c = client(server)
    r = c.responses.create(model=MODEL_NAME, input="Weather?", tools=[WEATHER], tool_choice="required",
                           parallel_tool_calls=False, max_output_tokens=300, temperature=1.0,
                           reasoning={"effort": "none"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert isinstance(args["city"], str) and set(args) <= {"city", "days"}


def test_codex_shaped_request_with_other_tool_types(server):
    with open(os.path.join(HERE, "data", "codex_request.json")) as f:
        body = json.load(f)
    body["max_output_tokens"] = 8
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append(json.loads(data[6:]))
        assert events[-1]["type"] == name[7:]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.incomplete"
    resp = events[-1]["response"]
    assert [t["name"] for t in resp["tools"]] == ["shell", "update_plan"]
    assert resp["parallel_tool_calls"] is False and resp["store"] is False
    log = server.output()
    for kind in ("custom", "web_search", "local_shell", "image_generation", "namespace"):
        assert f'of type "{kind}"' in log, kind
    assert 'skipped input item input[6] of type "web_search_call"' in log


def test_structured_text_format(server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "n"], "additionalProperties": False}
    r = client(server).responses.create(
        model=MODEL_NAME, input="Reply in JSON.", max_output_tokens=300, reasoning={"effort": "none"},
        text={"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}})
    assert r.status == "completed"
    doc = json.loads(r.output_text)
    assert set(doc) == {"answer", "n"} and len(doc["answer"]) <= 5 and 0 <= doc["n"] <= 9


def test_refusals(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_NAME, input="x", previous_response_id="resp_123")
    assert "does not store responses" in e.value.body["message"] or "previous_response_id" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_NAME, input="x", text={"format": {"type": "json_schema", "name": "x",
                                                                        "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in str(e.value)
