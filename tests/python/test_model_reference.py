"""sparkserve's CPU forward pass vs Hugging Face transformers' float32 references.

For every fixture under tests/fixtures/qwen35-*/ with a reference.json (made by tools/make_fixtures.py with
transformers on the checkpoint as reloaded from disk, see tests/fixtures/README.md):
  - `sparkserve logits` on each prompt == logits_<prompt>.npy within the issue's bound
    max|Δ| / max|ref| <= 1e-3, and
  - `sparkserve generate --json` reproduces the 20-token greedy continuation exactly, and its cached decode
    (prefill + one token at a time through the KV cache and GDN state) agrees with the teacher-forced
    logits of prompt + continuation (logits_<prompt>_decode.npy), checked through `logits` on the full
    sequence plus the exact greedy ids.

Tolerance: both sides compute in float32 from the same bf16-valued weights; only the order of float32
operations differs (our dot products, the chunked vs recurrent delta rule). transformers' own float32 noise
floor measured on these fixtures is ~2e-6 relative (reference.json: hf_generate_cached, and
prompt_vs_full_sequence_rows_max_abs_diff), so an exact engine lands around 1e-6..1e-5. We assert the issue's
1e-3 bound and also a tighter 1e-4, which a wrong formula (eps placement, a bf16 rounding, a mis-paired head)
exceeds by orders of magnitude while fp32 reordering stays far below it. The greedy ids must match exactly:
the smallest top-1/top-2 margin along the references is 1.5e-3 absolute (reference.json greedy_min_margin),
far above fp32 error.
"""
import json
import os
import pathlib
import subprocess
import tempfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The BF16 fixtures (tools/make_fixtures.py). Quantized fixtures (qwen35-quant-*) have their own
# test with quantization-aware tolerances (test_quant_model_reference.py).
FIXTURES = sorted(p.parent for p in (ROOT / "tests" / "fixtures").glob("qwen35-*/reference.json")
                  if not p.parent.name.startswith("qwen35-quant-"))
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))

ISSUE_BOUND = 1e-3   # the issue's acceptance bound, max|Δ| / max|ref|
FP32_BOUND = 1e-4    # what float32 arithmetic must reach (see module docstring)


def run_logits(model, ids, out):
    proc = subprocess.run([BIN, "logits", "--model", str(model), "--prompt-ids", ",".join(map(str, ids)),
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def rel_err(got, ref):
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def cases():
    for fx in FIXTURES:
        ref = json.loads((fx / "reference.json").read_text())
        for p in ref["prompts"]:
            yield pytest.param(fx, p, id=f"{fx.name}-{p['name']}")


@pytest.mark.skipif(not FIXTURES, reason="no fixtures")
@pytest.mark.parametrize("fx,prompt", list(cases()))
def test_teacher_forced_logits(fx, prompt, tmp_path):
    ref = np.load(fx / prompt["logits_file"])
    got = run_logits(fx, prompt["prompt_ids"], tmp_path / "l.npy")
    assert got.dtype == np.float32 and got.shape == ref.shape
    err = rel_err(got, ref)
    print(f"{fx.name}/{prompt['name']}: T={ref.shape[0]} max|d|/max|ref| = {err:.3e}")
    assert err <= ISSUE_BOUND
    assert err <= FP32_BOUND


@pytest.mark.skipif(not FIXTURES, reason="no fixtures")
@pytest.mark.parametrize("fx,prompt", list(cases()))
def test_greedy_continuation(fx, prompt):
    n = len(prompt["greedy_ids"])
    proc = subprocess.run([BIN, "generate", "--model", str(fx), "--prompt-ids",
                           ",".join(map(str, prompt["prompt_ids"])), "--max-tokens", str(n), "--ignore-eos",
                           "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["output_ids"] == prompt["greedy_ids"]
    assert out["prompt_ids"] == prompt["prompt_ids"]


@pytest.mark.skipif(not FIXTURES, reason="no fixtures")
@pytest.mark.parametrize("fx,prompt", list(cases()))
def test_full_sequence_logits_match_decode_reference(fx, prompt, tmp_path):
    # Rows T-1.. of a teacher-forced forward over prompt + greedy ids vs transformers' decode-step logits.
    ids = prompt["prompt_ids"] + prompt["greedy_ids"]
    ref = np.load(fx / prompt["decode_logits_file"])
    got = run_logits(fx, ids, tmp_path / "l.npy")
    T = len(prompt["prompt_ids"])
    err = rel_err(got[T:T + ref.shape[0]], ref)
    print(f"{fx.name}/{prompt['name']} decode rows: max|d|/max|ref| = {err:.3e}")
    assert err <= FP32_BOUND
