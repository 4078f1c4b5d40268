"""The KV cache dtypes (--kv-cache-dtype bf16 / fp8) end to end on the CPU backend, vs transformers' float32
references of the BF16 fixtures.

What a KV dtype may change: each cached K and V row is rounded once when written (bf16: relative error
<= 2^-9 per value; fp8 e4m3 with a scale per position and kv head: <= 2^-4 of the value, the row's
largest value maps to 448). Everything after the rounding is the same float32 forward as the default
float32 cache, whose error on these fixtures is ~2e-6 (test_model_reference.py). Measured on the fixtures
(max|d| / max|ref| over a prompt's logits): bf16 1.8e-3 .. 5.0e-3, fp8 3.0e-2 .. 8.7e-2. Bounds: bf16
1e-2, fp8 0.15: about twice the worst measured; reading the pool with a wrong scale, a wrong dtype or
wrong rows gives O(1). A lower bound shows that the flag took effect (float32 stays near 2e-6).

The cached decode must read the values the prefill stored: `generate` (prefill, then one token at a
time) gives the greedy ids of the teacher-forced logits of the whole sequence, computed with the same
KV dtype.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))
FIXTURES = [ROOT / "tests" / "fixtures" / n for n in ("qwen35-dense-tiny", "qwen35-moe-tiny")]
BOUNDS = {"bf16": (1e-4, 1e-2), "fp8": (1e-3, 0.15)}  # (at least, at most)


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def logits(fx, ids, dtype, out):
    proc = run("logits", "--model", fx, "--prompt-ids", ",".join(map(str, ids)), "--out", out,
               "--kv-cache-dtype", dtype, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def cases():
    for fx in FIXTURES:
        for p in json.loads((fx / "reference.json").read_text())["prompts"]:
            for dtype in BOUNDS:
                yield pytest.param(fx, p, dtype, id=f"{fx.name}-{p['name']}-{dtype}")


@pytest.mark.parametrize("fx,prompt,dtype", list(cases()))
def test_logits_within_the_dtype_bound(fx, prompt, dtype, tmp_path):
    ref = np.load(fx / prompt["logits_file"])
    got = logits(fx, prompt["prompt_ids"], dtype, tmp_path / "l.npy")
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    print(f"{fx.name}/{prompt['name']} kv {dtype}: max|d|/max|ref| = {err:.3e}")
    lo, hi = BOUNDS[dtype]
    assert lo <= err <= hi


@pytest.mark.parametrize("dtype", list(BOUNDS))
def test_cached_decode_reads_what_prefill_stored(dtype, tmp_path):
    fx = FIXTURES[1]
    prompt = json.loads((fx / "reference.json").read_text())["prompts"][1]
    n = 8
    proc = run("generate", "--model", fx, "--prompt-ids", ",".join(map(str, prompt["prompt_ids"])), "--max-tokens", n,
               "--ignore-eos", "--json", "--kv-cache-dtype", dtype, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["output_ids"]
    full = logits(fx, prompt["prompt_ids"] + out[:-1], dtype, tmp_path / "f.npy")
    T = len(prompt["prompt_ids"])
    assert [int(i) for i in full[T - 1:].argmax(axis=1)] == out


@pytest.mark.parametrize("args,needle", [
    (["--kv-cache-dtype", "int4"], "--kv-cache-dtype: 'int4' is not one of auto, bf16, fp8, float32"),
    (["--kv-cache-dtype", ""], "--kv-cache-dtype"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
])
def test_bad_kv_options_are_clean_errors(args, needle, tmp_path):
    for cmd in (["logits", "--out", tmp_path / "x.npy"], ["generate"], ["serve", "--port", 0]):
        proc = run(cmd[0], "--model", FIXTURES[0], "--prompt-ids", "1,2", *cmd[1:], *args) if cmd[0] != "serve" else \
            run("serve", "--model", FIXTURES[0], *cmd[1:], *args)
        assert proc.returncode > 0, (cmd, proc.returncode, proc.stderr)
        assert needle in proc.stderr, (cmd, proc.stderr)
