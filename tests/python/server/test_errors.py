"""Every invalid request gets a 4xx with OpenAI's error object naming what is wrong, and the
server stays up; the API key; SIGTERM exits cleanly."""
import json
import os

import httpx
import pytest

from conftest import MODEL_NAME, Server

MSGS = [{"role": "user", "content": "hi"}]


def post(server, path, body, raw=False, headers=None):
    kw = {"content": body} if raw else {"json": body}
    return httpx.post(server.url + path, timeout=60, headers=headers, **kw)


def assert_error(r, status, *words):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status
    assert isinstance(err["type"], str) and err["type"]
    for w in words:
        assert w in err["message"], err["message"]
    return err


CASES = [
    ("malformed json", "/v1/chat/completions", '{"model": "tiny", "messages": [', True, 400, ()),
    ("not an object", "/v1/chat/completions", "[1, 2]", True, 400, ()),
    ("messages wrong type", "/v1/chat/completions", {"model": MODEL_NAME, "messages": "hi"}, False, 400, ("messages",)),
    ("max_tokens wrong type", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "max_tokens": "8"}, False, 400, ("max_tokens",)),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-9", "messages": MSGS}, False, 404, ("gpt-9",)),
    ("empty messages", "/v1/chat/completions", {"model": MODEL_NAME, "messages": []}, False, 400, ("messages",)),
    ("bad role", "/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "wizard", "content": "x"}]}, False, 400, ("role",)),
    ("temperature", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "temperature": 5}, False, 400, ("temperature",)),
    ("top_p", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "top_p": 0}, False, 400, ("top_p",)),
    ("top_k", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "top_k": -5}, False, 400, ("top_k",)),
    ("presence", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "presence_penalty": 3}, False, 400, ("presence_penalty",)),
    ("top_logprobs", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "logprobs": True, "top_logprobs": 50}, False, 400, ("top_logprobs",)),
    ("max_tokens zero", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 0}, False, 400, ("max_tokens",)),
    ("max_tokens beyond context", "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 100000}, False, 400, ("512",)),
    ("prompt longer than context", "/v1/completions", {"model": MODEL_NAME, "prompt": "word " * 2000}, False, 400, ("512",)),
    ("token outside vocab", "/v1/completions", {"model": MODEL_NAME, "prompt": [1, 999999]}, False, 400, ("999999",)),
    ("n too large", "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "n": 1000}, False, 400, ("n",)),
    ("completions missing prompt", "/v1/completions", {"model": MODEL_NAME}, False, 400, ("prompt",)),
    ("detokenize bad ids", "/detokenize", {"model": MODEL_NAME, "tokens": [-1]}, False, 400, ()),
    ("tokenize wrong type", "/tokenize", {"model": MODEL_NAME, "prompt": 5}, False, 400, ("prompt",)),
]


@pytest.mark.parametrize("name,path,body,raw,status,words", CASES, ids=[c[0] for c in CASES])
def test_invalid_request(server, name, path, body, raw, status, words):
    assert_error(post(server, path, json.dumps(body) if raw and not isinstance(body, str) else body, raw=raw), status, *words)


def test_body_over_the_limit_is_413(server):
    body = json.dumps({"model": MODEL_NAME, "prompt": "a" * 100000})
    assert_error(post(server, "/v1/completions", body, raw=True, headers={"Content-Type": "application/json"}), 413, "65536")


def test_unknown_route_is_404(server):
    assert_error(httpx.get(server.url + "/v1/nothing"), 404)


def test_sdk_raises_typed_errors(client):
    import openai
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSGS)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=MSGS, temperature=-1)
    assert "temperature" in str(e.value)


def test_server_still_healthy_after_errors(server, client):
    assert httpx.get(server.url + "/health").status_code == 200
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSGS, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_api_key(tiny_model):
    import openai
    s = Server(tiny_model, env={"SPARKSERVE_API_KEY": "sekret"})
    try:
        assert_error(httpx.get(s.url + "/v1/models"), 401, "API key")
        assert_error(httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        assert httpx.get(s.url + "/health").status_code == 200
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert [m.id for m in good.models.list().data] == [MODEL_NAME]
    finally:
        assert s.stop() == 0


def test_sigterm_during_a_stream_exits_cleanly(tiny_model):
    s = Server(tiny_model)
    with httpx.stream("POST", s.url + "/v1/completions", timeout=60,
                      json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 400, "stream": True,
                            "temperature": 0, "ignore_eos": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert s.stop(timeout=20) == 0
    assert "stopped" in s.output()
