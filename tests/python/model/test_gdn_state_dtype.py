"""--gdn-state-dtype bfloat16 (alias --mamba-ssm-cache-dtype) end to end on the CPU backend, vs transformers'
float32 references of the BF16 fixtures.

What the dtype changes (backend/ops.h, "The recurrent state pool"): the GDN recurrent state is stored in bf16
between ops, each op computing in float32 from the widened values and rounding once where it stores the state
(relative error <= 2^-9 per value, at the end of each forward's span). So one forward over a whole prompt reads
the zero state and rounds only at its end: its logits are the float32 ones bit for bit. What shows the effect
is a sequence run in several forwards; `logits --prefill-chunk 1` runs the prompt token by token, as a cached
decode does, the most roundings a sequence can see (one per token per GDN layer).

Measured on the fixtures (2026-12-02, max|d| / max|ref| over a prompt's 5 / 70 / 150 rows, token by token):
dense 9.2e-3 / 1.3e-2 / 1.6e-2, MoE 4.3e-3 / 4.0e-2 / 6.5e-2; float32 token by token 1.7e-6 .. 4.2e-6; the bf16
KV cache token by token 1.8e-3 .. 5.0e-3. The MoE's tail is routing: rows whose top-8 experts change (the
rows with the largest errors are the rows where the greedy choice flips, reference margins 0.007-0.046). Row
medians: dense 5.9e-3, MoE 7.0e-3. Bounds: 0.15 (about twice the worst measured; a state read with a wrong
dtype, wrong rows or no widening gives O(1)) and at least 1e-3 (the flag took effect). The fixtures' decode
logits (20 greedy tokens after each prompt, fed one at a time): bf16 9.5e-3 .. 1.7e-2 of the reference.
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
BOUND_LO, BOUND_HI = 1e-3, 0.15


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def logits(fx, ids, out, *extra):
    proc = run("logits", "--model", fx, "--prompt-ids", ",".join(map(str, ids)), "--out", out, "--threads", 2,
               "--kv-cache-dtype", "float32", *extra)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def prompts():
    for fx in FIXTURES:
        for p in json.loads((fx / "reference.json").read_text())["prompts"]:
            yield pytest.param(fx, p, id=f"{fx.name}-{p['name']}")


@pytest.mark.parametrize("fx,prompt", list(prompts()))
def test_one_forward_is_the_float32_forward(fx, prompt, tmp_path):
    f = logits(fx, prompt["prompt_ids"], tmp_path / "f.npy", "--gdn-state-dtype", "float32")
    b = logits(fx, prompt["prompt_ids"], tmp_path / "b.npy", "--gdn-state-dtype", "bfloat16")
    assert np.array_equal(f, b)


@pytest.mark.parametrize("fx,prompt", list(prompts()))
def test_token_by_token_within_the_bound(fx, prompt, tmp_path):
    ref = np.load(fx / prompt["logits_file"])
    b = logits(fx, prompt["prompt_ids"], tmp_path / "b.npy", "--gdn-state-dtype", "bfloat16", "--prefill-chunk", 1)
    f = logits(fx, prompt["prompt_ids"], tmp_path / "f.npy", "--gdn-state-dtype", "float32", "--prefill-chunk", 1)
    eb, ef = rel(b, ref), rel(f, ref)
    print(f"{fx.name}/{prompt['name']} token by token: bf16 state {eb:.3e}, float32 state {ef:.3e}")
    assert BOUND_LO <= eb <= BOUND_HI
    assert ef <= 1e-4  # test_model_reference.py's float32 bound: chunking alone changes nothing that matters


def test_the_vllm_spelling_is_the_same_option(tmp_path):
    fx, ids = FIXTURES[1], list(range(3, 40))
    a = logits(fx, ids, tmp_path / "a.npy", "--gdn-state-dtype", "bfloat16", "--prefill-chunk", 1)
    b = logits(fx, ids, tmp_path / "b.npy", "--mamba-ssm-cache-dtype", "bf16", "--prefill-chunk", 1)
    f = logits(fx, ids, tmp_path / "f.npy", "--mamba-ssm-cache-dtype", "auto", "--prefill-chunk", 1)
    assert np.array_equal(a, b) and not np.array_equal(a, f)


def test_generate_and_speculative_generate_run_with_a_bf16_state():
    fx = FIXTURES[1]
    for extra in ([], ["--spec-k", 2]):
        proc = run("generate", "--model", fx, "--prompt-ids", "1,2,3,4,5", "--max-tokens", 40, "--ignore-eos",
                   "--json", "--threads", 2, "--gdn-state-dtype", "bfloat16", *extra)
        assert proc.returncode == 0, proc.stderr
        assert len(json.loads(proc.stdout)["output_ids"]) == 40


@pytest.mark.parametrize("args,needle", [
    (["--gdn-state-dtype", "float16"], "--gdn-state-dtype: 'float16' is not one of auto, float32, bfloat16"),
    (["--mamba-ssm-cache-dtype", "fp8"], "--gdn-state-dtype: 'fp8' is not one of auto, float32, bfloat16"),
])
def test_bad_gdn_state_dtypes_are_clean_errors(args, needle, tmp_path):
    for cmd in (["logits", "--out", tmp_path / "x.npy"], ["generate"], ["serve", "--port", 0]):
        proc = run(cmd[0], "--model", FIXTURES[0], "--prompt-ids", "1,2", *cmd[1:], *args) if cmd[0] != "serve" else \
            run("serve", "--model", FIXTURES[0], *cmd[1:], *args)
        assert proc.returncode > 0, (cmd, proc.returncode, proc.stderr)
        assert needle in proc.stderr, (cmd, proc.stderr)
