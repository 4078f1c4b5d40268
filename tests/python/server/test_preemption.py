"""KV blocks running out mid-decode: the newest sequence is preempted and recomputed later. With a
pool too small for all requests at once, every request still completes with all its tokens, the
server counts preemptions, and (greedy) each output equals the same request run alone."""
import concurrent.futures

import pytest

from conftest import MODEL_NAME, Server


@pytest.fixture(scope="module")
def small_kv_server(tiny_model):
    # 12 blocks of 16 = 192 positions; 6 requests of ~25 prompt + 40 generated need ~390.
    s = Server(tiny_model, "--kv-blocks", "12", "--max-model-len", "192")
    yield s
    s.stop()


def run(client, i):
    r = client.completions.create(model=MODEL_NAME, prompt=f"Request number {i}: tell me a long story about",
                                  max_tokens=40, temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    return r.choices[0].token_ids, r.choices[0].finish_reason


def test_preemption_loses_nothing(small_kv_server):
    import openai
    client = openai.OpenAI(base_url=small_kv_server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
    alone = [run(client, i) for i in range(6)]
    assert small_kv_server.metric("sparkserve:num_preemptions_total") == 0
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda i: run(client, i), range(6)))
    assert small_kv_server.metric("sparkserve:num_preemptions_total") > 0
    for a, t in zip(alone, together):
        assert len(t[0]) == 40 and t[1] == "length"
        assert t == a
    assert small_kv_server.metric("sparkserve:kv_cache_usage_perc") == 0
