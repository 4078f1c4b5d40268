"""Speculative decoding through the HTTP API (official openai client) on the tiny random-weight model
with its MTP layer: greedy chat outputs, a tool_choice "required" call and a stop string equal to
a server without speculation; the vLLM-named spec_decode counters; the per-request opt-out
(num_speculative_tokens: 0); flag errors. Random MTP weights accept almost no drafts: the
acceptance paths are covered by the engine tests (tests/unit/engine/speculative_test.cpp)."""
import subprocess

import pytest

from conftest import BIN, MODEL_NAME, Server
from test_tool_choice import MSGS, NO_THINK, TOOLS


@pytest.fixture(scope="module")
def plain(tiny_model):
    s = Server(tiny_model, "--max-model-len", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spec(tiny_model):
    s = Server(tiny_model, "--max-model-len", "1024", "--speculative-config",
               '{"method": "mtp", "num_speculative_tokens": 3}')
    yield s
    s.stop()


def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_greedy_tool_choice_and_stop_match_plain(plain, spec):
    drafts0 = spec.metric("sparkserve:spec_decode_num_draft_tokens_total")
    msgs = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    for kw in [dict(messages=msgs, max_tokens=24),
               dict(messages=msgs, max_tokens=24, stop=["e"]),
               dict(messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=48, extra_body=NO_THINK)]:
        a = client(plain).chat.completions.create(model=MODEL_NAME, temperature=0, **kw)
        b = client(spec).chat.completions.create(model=MODEL_NAME, temperature=0, **kw)
        assert b.choices[0].message.content == a.choices[0].message.content
        calls = [[(c.function.name, c.function.arguments) for c in (r.choices[0].message.tool_calls or [])]
                 for r in (a, b)]
        assert calls[1] == calls[0]
        assert b.choices[0].finish_reason == a.choices[0].finish_reason
        assert b.usage.completion_tokens == a.usage.completion_tokens
    drafted = spec.metric("sparkserve:spec_decode_num_draft_tokens_total") - drafts0
    assert drafted > 0
    assert spec.metric("sparkserve:spec_decode_num_drafts_total") > 0
    assert 0 <= spec.metric("sparkserve:spec_decode_num_accepted_tokens_total") <= \
        spec.metric("sparkserve:spec_decode_num_draft_tokens_total")


def test_request_opt_out(spec):
    drafts0 = spec.metric("sparkserve:spec_decode_num_draft_tokens_total")
    client(spec).completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=8, temperature=0,
                                    extra_body={"num_speculative_tokens": 0})
    assert spec.metric("sparkserve:spec_decode_num_draft_tokens_total") == drafts0


@pytest.mark.parametrize("args,message", [
    (["--speculative-tokens", "9"], "--speculative-tokens must be in [0, 8]"),
    (["--speculative-config", "{"], "--speculative-config is not valid JSON"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'], "is not supported"),
    (["--speculative-config", '{"method": "mtp"}'], "needs num_speculative_tokens"),
    (["--speculative-config", '{"num_speculative_tokens": 2, "model": "x"}'], "unknown key 'model'"),
])
def test_bad_flags(tiny_model, args, message):
    proc = subprocess.run([BIN, "serve", "--model", tiny_model, "--port", "0", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
