"""The prefix cache through the HTTP API (official openai client): usage.prompt_tokens_details.
cached_tokens, the vLLM-named Prometheus counters, and greedy outputs equal to a server started
with --no-prefix-caching over a multi-turn conversation. The engine-level tests (tests/unit/engine
prefix_cache*_test.cpp) cover the cases one by one."""
import pytest

from conftest import MODEL_NAME, Server


@pytest.fixture(scope="module")
def nocache_server(tiny_model):
    s = Server(tiny_model, "--no-prefix-caching")
    yield s
    s.stop()


def chat(server, messages, max_tokens=12):
    import openai
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    return c.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=max_tokens, temperature=0)


def test_multi_turn_hits_and_matches_no_cache(server, nocache_server):
    queries0 = server.metric("sparkserve:prefix_cache_queries_total")
    hits0 = server.metric("sparkserve:prefix_cache_hits_total")
    messages = [{"role": "system", "content": "You are a terse assistant. " * 20},
                {"role": "user", "content": "Tell me about the weather in Paris."}]
    prompt_total, cached_total = 0, 0
    for turn in range(3):
        got = chat(server, messages)
        ref = chat(nocache_server, messages)
        assert got.choices[0].message.content == ref.choices[0].message.content, turn
        assert got.choices[0].message.reasoning_content == ref.choices[0].message.reasoning_content, turn
        u = got.usage
        assert ref.usage.prompt_tokens_details.cached_tokens == 0
        if turn == 0:
            # Only the system prompt could have been seen before (other tests of this module's server).
            assert u.prompt_tokens_details.cached_tokens < u.prompt_tokens
        else:
            # Everything before this turn's new messages, at least (the template re-renders the
            # previous reply without its thinking, so the hit ends where that reply starts).
            assert u.prompt_tokens_details.cached_tokens >= previous_prompt - 8, (turn, u)
        previous_prompt = u.prompt_tokens
        prompt_total += u.prompt_tokens
        cached_total += u.prompt_tokens_details.cached_tokens
        messages += [{"role": "assistant", "content": got.choices[0].message.content or "ok"},
                     {"role": "user", "content": f"And on day {turn + 2}?"}]
    assert server.metric("sparkserve:prefix_cache_queries_total") - queries0 == prompt_total
    assert server.metric("sparkserve:prefix_cache_hits_total") - hits0 == cached_total


def test_identical_request_is_served_from_the_cache(server):
    messages = [{"role": "user", "content": "Count from one to twenty, slowly and carefully, please."}]
    a = chat(server, messages, max_tokens=5)
    b = chat(server, messages, max_tokens=5)
    assert b.choices[0].message.content == a.choices[0].message.content
    # Everything but the last token, whose logits give the first output token: the first request's
    # forward saved its state at len-1 (besides the generation prompt's start, where the next turn
    # of a conversation diverges).
    cached, prompt = b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens
    assert cached == prompt - 1, (cached, prompt)
