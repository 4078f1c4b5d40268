"""Chat and text completions through the official openai SDK on the tiny random-weight model:
the normal path (real sampling through the model), streaming == non-streaming for greedy,
usage, return_token_ids, logprobs, seeds, /v1/models, /tokenize and /detokenize (checked against
HF `tokenizers` on the same tokenizer.json)."""
import os

import httpx
import pytest

from conftest import MODEL_NAME

MSGS = [{"role": "user", "content": "Name three colours."}]


def chat(client, **kw):
    args = dict(model=MODEL_NAME, messages=MSGS, max_tokens=8, temperature=0)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_chat_non_streaming(client):
    r = chat(client, extra_body={"return_token_ids": True})
    assert r.object == "chat.completion"
    assert r.model == MODEL_NAME
    c = r.choices[0]
    assert c.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens == len(c.token_ids) >= 1
    assert r.usage.prompt_tokens == len(r.prompt_token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Thinking is on by default: the generated text lands in reasoning until a </think>.
    text = (c.message.content or "") + (getattr(c.message, "reasoning_content", None) or "")
    assert text or c.finish_reason == "stop"
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 8


def test_chat_prompt_is_the_rendered_template(client, server):
    r = chat(client, max_tokens=1, extra_body={"return_token_ids": True})
    tok = httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "messages": MSGS}).json()
    assert r.prompt_token_ids == tok["tokens"]
    text = httpx.post(server.url + "/detokenize", json={"model": MODEL_NAME, "tokens": tok["tokens"]}).json()
    assert text["prompt"] == "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_chat_streaming_equals_non_streaming_for_greedy(client):
    full = chat(client, max_tokens=12, extra_body={"return_token_ids": True})
    stream = chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True},
                  extra_body={"return_token_ids": True})
    reasoning, content, ids, finish, usage, roles = "", "", [], None, None, 0
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            roles += d.role == "assistant"
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            ids += getattr(ch, "token_ids", None) or []
            finish = ch.finish_reason or finish
    m = full.choices[0].message
    assert roles == 1
    assert ids == full.choices[0].token_ids
    assert content == (m.content or "")
    assert reasoning == (getattr(m, "reasoning_content", None) or "")
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_thinking_disabled_gives_content(client):
    r = chat(client, max_tokens=6, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) in (None, "")


def test_seeded_sampling_is_reproducible(client):
    a = chat(client, temperature=1.0, seed=1234, max_tokens=10, extra_body={"return_token_ids": True})
    b = chat(client, temperature=1.0, seed=1234, max_tokens=10, extra_body={"return_token_ids": True})
    assert a.choices[0].token_ids == b.choices[0].token_ids


def test_logprobs(client):
    r = chat(client, max_tokens=4, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert len(t.top_logprobs) == 3
        assert t.logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6


def test_completions(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=6, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == len(r.choices[0].token_ids)
    s = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=6, temperature=0,
                                  stream=True, stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in s:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    assert text == r.choices[0].text
    assert finish == r.choices[0].finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens


def test_completions_token_prompt(client):
    r = client.completions.create(model=MODEL_NAME, prompt=[1, 2, 3], max_tokens=3, temperature=0)
    assert r.usage.prompt_tokens == 3


def test_models(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert httpx.get(server.url + "/health").status_code == 200


def test_tokenize_matches_hf_tokenizers(server, tiny_model):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(os.path.join(tiny_model, "tokenizer.json"))
    text = "Hello, wörld! 你好 <|im_start|> 12345"
    r = httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": text, "return_token_strs": True}).json()
    assert r["tokens"] == hf.encode(text).ids
    assert r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 512
    assert r["token_strs"] == [hf.id_to_token(i) for i in r["tokens"]]
    d = httpx.post(server.url + "/detokenize", json={"model": MODEL_NAME, "tokens": r["tokens"]}).json()
    assert d["prompt"] == text


def test_metrics_counts_tokens(server, client):
    before = server.metric("sparkserve:generation_tokens_total")
    r = chat(client, max_tokens=3)
    after = server.metric("sparkserve:generation_tokens_total")
    assert after - before == r.usage.completion_tokens
