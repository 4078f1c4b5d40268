"""lm-eval-harness against sparkserve: the request shapes its `local-completions` model sends
(lm_eval/models/openai_completions.py: loglikelihood = {"prompt": [[ids], ...], "temperature": 0,
"max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": true}; generation = prompts with stop and
max_tokens), parsed the way its parse_logprobs does, and compared with `sparkserve logits` for
the same ids: the echoed prompt logprobs must equal log_softmax of those logits. Also the checks
of its remote tokenizer (/tokenizer_info, /tokenize), echo with max_tokens 0, streaming echo, n."""
import os
import subprocess
import tempfile

import httpx
import numpy as np
import pytest

from conftest import BIN, MODEL_NAME, Server

# Logprobs of the same ids from the server (prefill in chunks of <= 64 positions, batched with
# the other prompt) and from `sparkserve logits` (one forward over the whole prompt): the model's
# batch invariance makes the logits agree to rounding; the log-softmax is taken in double on both
# sides, so what is left is float32 rounding of logits of magnitude ~1-10.
TOL = 1e-4


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "1024")
    yield s
    s.stop()


def reference_logprobs(model, ids):
    """log_softmax rows of `sparkserve logits` ([T, vocab] float32) for the prompt ids."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.npy")
        subprocess.run([BIN, "logits", "--model", model, "--prompt-ids", ",".join(map(str, ids)), "--out", out,
                        "--threads", "2"], check=True, capture_output=True, timeout=300)
        logits = np.load(out).astype(np.float64)
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


def lm_eval_parse_logprobs(out, ctxlens):
    """lm-eval's LocalCompletionsAPI.parse_logprobs, line for line."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        logprobs = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = True
        for tok, top in zip(tokens_logprobs, top_logprobs):
            if tok != max(top.values()):
                is_greedy = False
                break
        res.append((logprobs, is_greedy))
    return res


def test_loglikelihood_request_matches_logits(server, tiny_model):
    tok = lambda text: httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": text,
                                                                   "add_special_tokens": False}).json()["tokens"]
    ctx_a, cont_a = tok("The capital of France is"), tok(" Paris, a city of light and rivers.")
    ctx_b = tok("Question: what comes after one, two, three? " * 6)  # > 64 tokens: several prefill chunks
    cont_b = tok(" Answer: four.")
    prompts = [ctx_a + cont_a, ctx_b + cont_b]
    ctxlens = [len(ctx_a), len(ctx_b)]
    assert len(prompts[1]) > 64
    payload = {"model": MODEL_NAME, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
               "seed": 1234, "echo": True}
    r = httpx.post(server.url + "/v1/completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    parsed = lm_eval_parse_logprobs(out, ctxlens)
    for k, ids in enumerate(prompts):
        ref = reference_logprobs(tiny_model, ids)
        lp = out["choices"][k]["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the one generated token
        got = np.array(lp["token_logprobs"][1:len(ids)])
        want = np.array([ref[i - 1, ids[i]] for i in range(1, len(ids))])
        print(f"prompt {k}: {len(ids)} tokens, max |logprob - logits ref| = {np.max(np.abs(got - want)):.2e}")
        assert np.max(np.abs(got - want)) < TOL
        want_sum = sum(ref[i - 1, ids[i]] for i in range(ctxlens[k], len(ids)))
        assert abs(parsed[k][0] - want_sum) < TOL * len(ids)
        want_greedy = all(int(np.argmax(ref[i - 1])) == ids[i] for i in range(ctxlens[k], len(ids)))
        assert parsed[k][1] == want_greedy
        # The echoed text is the prompt, then the generated token.
        assert out["choices"][k]["text"].startswith(httpx.post(server.url + "/detokenize", json={
            "model": MODEL_NAME, "tokens": ids}).json()["prompt"])
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_generate_request_shape_and_batching(server):
    # lm-eval's generate_until: several prompts, stop strings, temperature 0, seed.
    body = {"model": MODEL_NAME, "prompt": ["Once upon a time", "In a galaxy"], "max_tokens": 8, "temperature": 0,
            "stop": ["\n\n"], "seed": 1234}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=300).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    alone = httpx.post(server.url + "/v1/completions", json={**body, "prompt": "In a galaxy"}, timeout=300).json()
    assert alone["choices"][0]["text"] == out["choices"][1]["text"]  # batching changes nothing
    # n choices per prompt, prompt-major.
    out = httpx.post(server.url + "/v1/completions", timeout=300, json={
        "model": MODEL_NAME, "prompt": ["a", "b"], "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 5}).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["choices"][0]["text"] != out["choices"][1]["text"]  # seeds 5 and 6


def test_echo_prompt_only_and_streamed(server):
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": "Hello world, again"}).json()["tokens"]
    body = {"model": MODEL_NAME, "prompt": [ids], "max_tokens": 0, "echo": True, "logprobs": 2}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=300).json()
    c = out["choices"][0]
    assert c["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 0
    assert len(c["logprobs"]["token_logprobs"]) == len(ids) and c["text"] == "Hello world, again"
    # Each later position's dict holds the top 2 and the prompt token itself.
    assert all(2 <= len(t) <= 3 for t in c["logprobs"]["top_logprobs"][1:])
    # Streamed: the first chunk carries the echoed prompt and its logprobs.
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=300,
                      json={**body, "max_tokens": 3, "stream": True, "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(httpx.Response(200, content=line[6:]).json())
    first = chunks[0]["choices"][0]
    assert first["text"].startswith("Hello world, again")
    assert first["logprobs"]["token_logprobs"][:len(ids)][1:] == c["logprobs"]["token_logprobs"][1:]


def test_remote_tokenizer_endpoints(server):
    # lm-eval's check_remote_tokenizer_support: GET /tokenizer_info with "eos_token", then
    # POST /tokenize {"prompt": "test", "add_special_tokens": false} -> {"tokens": [...]}.
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert "eos_token" in info and info["chat_template"]
    toks = httpx.post(server.url + "/tokenize", json={"prompt": "test", "add_special_tokens": False}).json()["tokens"]
    assert isinstance(toks, list) and toks
    assert httpx.post(server.url + "/detokenize", json={"tokens": toks}).json()["prompt"] == "test"
