"""The habits of vLLM users: `sparkserve serve MODEL` with vLLM's flags starts (the flags that do
not apply here each get a one-line note), several served names, --max-model-len 32k, one log
line per finished request (id, route, status, tokens, TTFT, duration), Prometheus metrics under
vLLM's names with its histograms, --version, and clear messages for a missing model folder, an
unknown flag and a Hugging Face id that was never downloaded."""
import json
import os
import re
import subprocess
import time

import httpx
import pytest

from conftest import BIN, Server

# The tiny model's config allows 4096 positions; `--max-model-len 32k` needs a config that allows
# more, so the test serves a copy of it whose only change is max_position_embeddings.
LONG_CONTEXT = 65536


@pytest.fixture(scope="module")
def long_model(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("long-model")
    for name in os.listdir(tiny_model):
        if name != "config.json":
            os.symlink(os.path.abspath(os.path.join(tiny_model, name)), d / name)
    with open(os.path.join(tiny_model, "config.json")) as f:
        cfg = json.load(f)
    (cfg.get("text_config") or cfg)["max_position_embeddings"] = LONG_CONTEXT
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def vllm_flags():
    # A vLLM launch line for Qwen3.5, every flag as vLLM spells it.
    return ["--gpu-memory-utilization", "0.9", "--max-model-len", "32k", "--enable-prefix-caching",
            "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
            "--dtype", "auto", "--trust-remote-code", "--tensor-parallel-size", "1", "--seed", "7",
            "--kv-cache-dtype", "auto"]


@pytest.fixture(scope="module")
def vllm_server(long_model):
    s = Server(long_model, "--served-model-name", "qwen", "tiny-alias", "--threads", "2", "--log-stats-interval", "1",
               *vllm_flags(), positional=True, defaults=False)
    yield s
    s.stop()


def test_vllm_command_line_starts_and_logs_each_request(vllm_server):
    out = vllm_server.output()
    assert "max_model_len 32000" in out  # 32k = 32000, as vLLM reads it
    for flag in ("--tool-call-parser qwen3_coder", "--reasoning-parser qwen3", "--enable-auto-tool-choice",
                 "--dtype auto", "--trust-remote-code", "--enable-prefix-caching", "--tensor-parallel-size 1"):
        assert re.search(r"note: " + re.escape(flag), out), flag
    models = httpx.get(vllm_server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["qwen", "tiny-alias"]
    u = vllm_server.url
    reqs = [
        ("/v1/chat/completions", {"model": "tiny-alias", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        ("/v1/completions", {"model": "qwen", "prompt": "hi", "max_tokens": 2}),
        ("/v1/messages", {"model": "qwen", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "qwen", "input": "hi", "max_output_tokens": 2}),
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ]
    for path, body in reqs:
        httpx.post(u + path, json=body, timeout=120)
    with httpx.stream("POST", u + "/v1/chat/completions", timeout=120, json={
            "model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
        r.read()
    lines = [l for l in vllm_server.output().splitlines() if " request " in l and " POST " in l]
    assert len(lines) == len(reqs) + 1, "\n".join(lines)
    pat = re.compile(r"INFO \S+ \S+ request (\S+) POST (\S+) (\d+) prompt=(\d+) cached=(\d+) generated=(\d+) "
                     r"ttft=(\S+) duration=([0-9.]+)s finish=(\S+)")
    parsed = [pat.search(l) for l in lines]
    assert all(parsed), lines
    assert [p.group(2) for p in parsed] == [r[0] for r in reqs] + ["/v1/chat/completions"]
    assert [p.group(3) for p in parsed] == ["200"] * 4 + ["404", "200"]
    assert [int(p.group(6)) for p in parsed] == [3, 2, 2, 2, 0, 4]
    assert parsed[0].group(1).startswith("chatcmpl-") and parsed[2].group(1).startswith("msg_")
    assert parsed[3].group(1).startswith("resp_") and parsed[5].group(9) == "length"
    assert all(p.group(7).endswith("s") for i, p in enumerate(parsed) if i != 4)


def test_vllm_metric_names_and_histograms(vllm_server):
    text = httpx.get(vllm_server.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"):
        assert re.search("^" + name + r"\{model_name=\"qwen\"", text, re.M), name
    for h in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
              "time_to_first_token_seconds", "inter_token_latency_seconds"):
        assert f"# TYPE vllm:{h} histogram" in text, h
        count = re.search(r"^vllm:" + h + r"_count\{[^}]*\} (\S+)", text, re.M)
        assert count and float(count.group(1)) >= 1, h
    assert 'vllm:request_prompt_tokens_bucket{model_name="qwen",le="20"}' in text  # vLLM's 1-2-5 buckets
    # The periodic line, printed at the first 1 s tick after work (--log-stats-interval 1).
    line = re.compile(r"throughput: prompt [0-9.]+ tokens/s, generation [0-9.]+ tokens/s, running \d+, waiting \d+, "
                      r"KV cache usage [0-9.]+%")
    deadline = time.time() + 10
    while not line.search(vllm_server.output()) and time.time() < deadline:
        time.sleep(0.2)
    assert line.search(vllm_server.output()), vllm_server.output()[-2000:]


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)


def test_version_and_clear_errors(tiny_model, tmp_path):
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("sparkserve ")
    r = run("serve", str(tmp_path / "missing"))
    assert r.returncode != 0 and "model folder" in r.stderr and "does not exist" in r.stderr
    assert "tokenizer" not in r.stderr
    r = run("serve", "Someone/Some-Model")
    assert r.returncode != 0 and "hf download Someone/Some-Model" in r.stderr
    r = run("serve", tiny_model, "--gpu-memory-fraction", "0.5")
    assert r.returncode != 0 and "--gpu-memory-fraction" in r.stdout + r.stderr
    r = run("serve", tiny_model, "--tensor-parallel-size", "2")
    assert r.returncode != 0 and "one GPU" in r.stderr
    (tmp_path / "synth").mkdir()
    (tmp_path / "synth" / "config.json").write_text("{}")
    r = run("serve", str(tmp_path / "synth"))
    assert r.returncode != 0 and "no tokenizer.json" in r.stderr and "sparkserve synth" in r.stderr
