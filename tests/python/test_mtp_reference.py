"""The multi-token-prediction layer's draft logits vs a PyTorch reference (tools/mtp_reference.py).

For each fixture with mtp_reference.json (qwen35-moe-tiny: MoE MTP layer; qwen35-dense-tiny: dense MLP one),
`sparkserve logits --mtp-drafts 3` over prompt + greedy continuation gives T-1 teacher-forced rows (row p: the
target's final-normed hidden state at p with token p+1, at position p) and 2 chained rows (the MTP's own output
with its argmax draft, one position further), compared with mtp_logits_<prompt>.npy.

The reference is transformers' own decoder layer and RMSNorm classes, assembled with vLLM's MTP glue in float32;
nothing of sparkserve's code. Tolerance as test_model_reference.py: both sides compute in float32 from the same
bf16-valued weights, only the order of operations differs, so max|d|/max|ref| <= 1e-4 (measured ~3e-6); a wrong
formula (concat order, a missing norm, a shifted position or token) is off by O(1). The chained rows depend on the
argmax drafts, which must match: the smallest top-1/top-2 margin (mtp_reference.json) is >= 3.8e-3, far above
float32 error.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = sorted(p.parent for p in (ROOT / "tests" / "fixtures").glob("*/mtp_reference.json"))
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))
FP32_BOUND = 1e-4


def cases():
    for fx in FIXTURES:
        ref = json.loads((fx / "mtp_reference.json").read_text())
        for p in ref["prompts"]:
            yield pytest.param(fx, p, id=f"{fx.name}-{p['name']}")


@pytest.mark.skipif(not FIXTURES, reason="no fixtures")
@pytest.mark.parametrize("fx,prompt", list(cases()))
def test_mtp_draft_logits(fx, prompt, tmp_path):
    ref = np.load(fx / prompt["mtp_logits_file"])
    out = tmp_path / "mtp.npy"
    drafts = prompt["chained_rows"] + 1
    proc = subprocess.run([BIN, "logits", "--model", str(fx), "--prompt-ids", ",".join(map(str, prompt["ids"])),
                           "--mtp-drafts", str(drafts), "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)
    assert got.shape == ref.shape == (len(prompt["ids"]) - 1 + prompt["chained_rows"], ref.shape[1])
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    print(f"{fx.name}/{prompt['name']}: rows={ref.shape[0]} max|d|/max|ref| = {err:.3e}")
    assert err <= FP32_BOUND
    # The drafts: argmax of the last teacher-forced row and of each chained row.
    t = prompt["teacher_forced_rows"]
    assert [int(i) for i in got[t - 1:].argmax(axis=1)] == prompt["drafts"]


def test_mtp_needs_the_layer(tmp_path):
    # A checkpoint without mtp.* tensors: a clear error, not a crash.
    fx = ROOT / "tests" / "fixtures" / "qwen35-dense-tiny-causallm"
    proc = subprocess.run([BIN, "logits", "--model", str(fx), "--prompt-ids", "1,2,3", "--mtp-drafts", "2",
                           "--out", str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "mtp.fc.weight" in proc.stderr


@pytest.mark.skipif(not FIXTURES, reason="no fixtures")
@pytest.mark.parametrize("fx", FIXTURES, ids=lambda f: f.name)
def test_generate_speculative_equals_greedy_reference(fx):
    # The transformers greedy continuation, with speculative decoding (2 MTP drafts per step).
    ref = json.loads((fx / "reference.json").read_text())
    p = next(q for q in ref["prompts"] if q["name"] == "short")
    proc = subprocess.run([BIN, "generate", "--model", str(fx), "--prompt-ids", ",".join(map(str, p["prompt_ids"])),
                           "--max-tokens", str(len(p["greedy_ids"])), "--ignore-eos", "--json", "--spec-k", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["output_ids"] == p["greedy_ids"]
    assert out["speculative"]["verify_steps"] > 0
    assert out["speculative"]["draft_tokens"] >= out["speculative"]["verify_steps"]


@pytest.mark.parametrize("args,message", [
    (["--spec-k", "9"], "--spec-k must be in [0, 8]"),
    (["--spec-k", "-1"], "--spec-k must be in [0, 8]"),
])
def test_generate_speculative_bad_k(args, message):
    fx = ROOT / "tests" / "fixtures" / "qwen35-moe-tiny"
    proc = subprocess.run([BIN, "generate", "--model", str(fx), "--prompt-ids", "1,2,3"] + args,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert message in proc.stderr
