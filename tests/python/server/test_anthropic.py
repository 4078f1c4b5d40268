"""Anthropic Messages API (/v1/messages) through the official `anthropic` SDK, on the tiny
random-weight model: plain text streaming and not, thinking blocks, tools (a forced qwen3_coder
tool call, and tool_choice "any" under the tool-call constraint with real sampling),
count_tokens, errors in Anthropic's shape, x-api-key, and a request shaped like Claude Code's
(system blocks with cache_control, thinking, tool history, a server tool, ?beta=true)."""
import json
import os

import anthropic
import httpx
import pytest

from conftest import MODEL_NAME, Server

HERE = os.path.dirname(__file__)
WEATHER_TOOL = {"name": "get_weather", "description": "Weather forecast",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                                 "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "4096", "--api-key", "sekret")
    yield s
    s.stop()


def client(server, key="sekret"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, timeout=120, max_retries=0)


def test_text_message_and_stream_agree(server):
    c = client(server)
    greedy = {"temperature": 0}  # the SDK no longer takes sampling arguments: sent as extra fields
    msg = c.messages.create(model=MODEL_NAME, max_tokens=12, extra_body=greedy,
                            system="Answer briefly.", messages=[{"role": "user", "content": "Hello"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]  # no thinking unless asked, as the API defines
    assert msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 12 and msg.usage.input_tokens > 0
    with c.messages.stream(model=MODEL_NAME, max_tokens=12, extra_body=greedy, system="Answer briefly.",
                           messages=[{"role": "user", "content": "Hello"}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    # Greedy: the stream and the one-shot answer are the same tokens.
    assert streamed == msg.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12


def test_thinking_blocks_streamed_and_not(server):
    c = client(server)
    kw = dict(model=MODEL_NAME, max_tokens=10, extra_body={"temperature": 0}, thinking={"type": "enabled", "budget_tokens": 1024},
              messages=[{"role": "user", "content": "Think about it."}])
    msg = c.messages.create(**kw)
    # Random weights never close the thought within 10 tokens: everything is thinking.
    assert [b.type for b in msg.content] == ["thinking"]
    assert msg.content[0].thinking and msg.content[0].signature == ""
    events = []
    with c.messages.stream(**kw) as stream:
        for ev in stream:
            events.append(ev.type)
        final = stream.get_final_message()
    assert final.content[0].thinking == msg.content[0].thinking
    assert events[0] == "message_start" and "content_block_start" in events and events[-1] == "message_stop"
    assert "thinking" in events  # the SDK's own event for thinking deltas


def test_forced_tool_call(scripted_server):
    c = anthropic.Anthropic(base_url=scripted_server.url, api_key="x", timeout=120, max_retries=0)
    kw = dict(model=MODEL_NAME, max_tokens=200, tools=[WEATHER_TOOL], thinking={"type": "enabled", "budget_tokens": 500},
              messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}])
    msg = c.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    assert msg.content[0].thinking == "The user wants the weather, so I call the tool.\n"
    tool = msg.content[1]
    assert tool.name == "get_weather" and tool.input == {"city": "Paris", "days": 3} and tool.id.startswith("toolu_")
    assert msg.stop_reason == "tool_use"
    with c.messages.stream(**kw) as stream:
        partial = [ev.partial_json for ev in stream if ev.type == "input_json"]
        final = stream.get_final_message()
    assert json.loads("".join(partial)) == {"city": "Paris", "days": 3}
    assert final.content[1].input == tool.input and final.stop_reason == "tool_use"
    # The tool result goes back in the next turn (tool_use -> tool_result round trip renders).
    follow = c.messages.count_tokens(model=MODEL_NAME, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris for 3 days?"},
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]}])
    assert follow.input_tokens > 0


def test_tool_choice_any_constrains_sampling(server):
    c = client(server)
    msg = c.messages.create(model=MODEL_NAME, max_tokens=300, extra_body={"temperature": 1.0}, tools=[WEATHER_TOOL],
                            tool_choice={"type": "any", "disable_parallel_tool_use": True},
                            messages=[{"role": "user", "content": "Weather?"}])
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and "city" in uses[0].input
    assert isinstance(uses[0].input["city"], str)
    assert msg.stop_reason == "tool_use"


def test_count_tokens_matches_tokenize(server):
    c = client(server)
    n = c.messages.count_tokens(model=MODEL_NAME, system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    tok = httpx.post(server.url + "/tokenize", headers={"Authorization": "Bearer sekret"},
                     json={"model": MODEL_NAME, "messages": [{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi"}],
                           "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert n.input_tokens == tok["count"]


def test_errors_in_anthropic_shape(server):
    c = client(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL_NAME, max_tokens=10, messages=[{"role": "system", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].role" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-opus-4", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert "claude-opus-4" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        client(server, key="wrong").messages.create(model=MODEL_NAME, max_tokens=5,
                                                    messages=[{"role": "user", "content": "x"}])
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sekret"},
                   json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sekret"},
                   json={"model": MODEL_NAME, "max_tokens": 5, "messages": [{"role": "user", "content": [
                       {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]})
    assert r.status_code == 400 and "image" in r.json()["error"]["message"]


def sse_events(text):
    out = []
    for block in text.split("\n\n"):
        lines = block.strip().split("\n")
        if len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "):
            out.append((lines[0][7:], json.loads(lines[1][6:])))
        else:
            assert not block.strip(), block
    return out


def test_claude_code_shaped_request(server):
    with open(os.path.join(HERE, "data", "claude_code_request.json")) as f:
        body = json.load(f)
    headers = {"x-api-key": "sekret", "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"}
    # max_tokens 32000 is more than the 4096-token context leaves: lowered to what is left.
    body["max_tokens"] = 32000
    body["temperature"] = 0
    with httpx.stream("POST", server.url + "/v1/messages?beta=true", headers=headers, json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        # Stop early: an agent's long answer; the rest is cancelled on disconnect.
        text = ""
        for chunk in r.iter_text():
            text += chunk
            if text.count("content_block_delta") >= 5:
                break
    events = sse_events(text[:text.rfind("\n\n") + 2])
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert events[2][1]["content_block"]["type"] == "thinking"
    assert all(d["type"] == n for n, d in events)
    start = events[0][1]["message"]
    assert start["model"] == MODEL_NAME and start["usage"]["input_tokens"] > 300
    # The same body, non-streaming and short, is one complete message.
    body.update(stream=False, max_tokens=8)
    msg = httpx.post(server.url + "/v1/messages?beta=true", headers=headers, json=body, timeout=300).json()
    assert msg["type"] == "message" and msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == 8
    assert "skipped tool tools[4] of type \"web_search_20250305\"" in server.output()
