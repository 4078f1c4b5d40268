"""`sparkserve bench` on the CPU backend: --synth (random weights with a known model's shapes built in
backend memory), --model (a checkpoint folder) and their errors.

The synthetic model is checked to be the real thing at this size: its weights hash to the same digest
as `sparkserve synth` written to disk and loaded by the loader (same seed), a different seed changes
them, and the benchmark's logits are finite."""
import json
import math
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))
MOE = ROOT / "tests" / "fixtures" / "qwen35-moe-tiny"
LAYOUTS = ["bf16", "nvfp4", "nvfp4-fp8dense", "fp8", "modelopt-nvfp4"]


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def bench_json(*args):
    proc = run("bench", "--device", "cpu", "--threads", 2, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_clean_error(proc, *needles):
    assert proc.returncode > 0, (proc.returncode, proc.stderr)  # > 0: an exit code, not a signal
    assert proc.stdout == "" or "error" not in proc.stdout
    for n in needles:
        assert n in proc.stderr, proc.stderr


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_synth_tiny_nvfp4_fields_and_finite_numbers():
    d = bench_json("--synth", "tiny", "--layout", "nvfp4", "--prompt-lens", "16,48", "--batches", "1,4",
                   "--contexts", "0,24", "--decode-steps", 3)
    assert d["source"] == "synth" and d["synth"] == "tiny" and d["layout"] == "nvfp4"
    assert d["layers"] == 4 and d["vocab"] == 1024
    assert d["logits_finite"] is True
    for k in ["load_s", "weights_bytes", "weight_bytes_per_token", "kv_bytes_per_token",
              "gdn_state_bytes_per_sequence", "stream_bandwidth_gb_s", "weight_floor_ms_batch1"]:
        assert positive(d[k]), (k, d[k])
    # The per-token rule agrees with loader/weight_budget.h (what `inspect --like` prints).
    assert d["weight_bytes_per_token"] == pytest.approx(d["weight_bytes_per_token_inspect"], rel=1e-9)
    # Routed experts k/E and the embedding one row: far below all weights, above the dense part alone.
    assert d["weight_bytes_per_token"] < d["weights_bytes"]
    assert d["peak_device_memory_bytes"] == -1  # not tracked on the CPU
    assert [p["prompt_tokens"] for p in d["prefill"]] == [16, 48]
    for p in d["prefill"]:
        assert positive(p["ttft_ms"]) and positive(p["tokens_per_s"])
        assert p["tokens_per_s"] == pytest.approx(p["prompt_tokens"] / (p["ttft_ms"] / 1e3), rel=1e-6)
    cases = {(r["batch"], r["context"]): r for r in d["decode"]}
    assert set(cases) == {(1, 0), (4, 0), (1, 24), (4, 24)}
    for (b, c), r in cases.items():
        for k in ["ms_per_step", "tokens_per_s", "weight_bytes_per_step", "weight_floor_ms",
                  "fraction_of_weight_roofline", "state_bytes_per_step", "state_floor_ms", "fraction_of_state_roofline"]:
            assert positive(r[k]), (b, c, k, r[k])
        assert r["tokens_per_s"] == pytest.approx(b / (r["ms_per_step"] / 1e3), rel=1e-6)
        assert r["weight_floor_ms"] == pytest.approx(
            r["weight_bytes_per_step"] / (d["stream_bandwidth_gb_s"] * 1e9) * 1e3, rel=1e-6)
        assert r["fraction_of_weight_roofline"] == pytest.approx(r["weight_floor_ms"] / r["ms_per_step"], rel=1e-6)
        assert r["state_floor_ms"] > r["weight_floor_ms"]
    assert cases[(1, 0)]["weight_bytes_per_step"] == pytest.approx(d["weight_bytes_per_token"], rel=1e-9)
    # More tokens touch more distinct experts; a longer context reads more KV.
    assert cases[(4, 0)]["weight_bytes_per_step"] > cases[(1, 0)]["weight_bytes_per_step"]
    assert cases[(1, 24)]["state_bytes_per_step"] > cases[(1, 0)]["state_bytes_per_step"]
    assert cases[(1, 24)]["context_prefill_s"] > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_synth_every_layout_runs(layout):
    d = bench_json("--synth", "tiny", "--layout", layout, "--prompt-lens", "8", "--batches", "2", "--decode-steps", 2)
    assert d["logits_finite"] is True
    assert positive(d["decode"][0]["tokens_per_s"])


def test_synth_layers_and_vocab_resize():
    d = bench_json("--synth", "tiny", "--layout", "nvfp4", "--layers", 2, "--vocab", 512, "--prompt-lens", "8",
                   "--batches", "1", "--decode-steps", 1)
    assert d["layers"] == 2 and d["vocab"] == 512


@pytest.mark.parametrize("layout", ["nvfp4", "nvfp4-fp8dense", "modelopt-nvfp4"])
def test_synth_weights_digest_equals_the_written_checkpoint(tmp_path, layout):
    out = tmp_path / "m"
    proc = run("synth", "--like", "tiny", "--layout", layout, "--seed", 3, "--out", out, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    disk = run("bench", "--device", "cpu", "--model", out, "--weights-digest")
    mem = run("bench", "--device", "cpu", "--synth", "tiny", "--layout", layout, "--seed", 3, "--weights-digest")
    other = run("bench", "--device", "cpu", "--synth", "tiny", "--layout", layout, "--seed", 4, "--weights-digest")
    for p in (disk, mem, other):
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("weights digest: ")
    assert disk.stdout == mem.stdout
    assert other.stdout != mem.stdout


def test_model_folder_still_benchmarks():
    d = bench_json("--model", MOE, "--prompt-lens", "8,16", "--batches", "1,2", "--contexts", "4", "--decode-steps", 2)
    assert d["source"] == "model" and d["model"] == str(MOE)
    assert len(d["prefill"]) == 2 and len(d["decode"]) == 2
    assert all(positive(r["tokens_per_s"]) for r in d["decode"])
    assert d["logits_finite"] is True


def test_table_output_and_json_out(tmp_path):
    out = tmp_path / "b.json"
    proc = run("bench", "--device", "cpu", "--threads", 2, "--synth", "tiny", "--layout", "fp8", "--prompt-lens", "8",
               "--batches", "1", "--decode-steps", 2, "--json-out", out)
    assert proc.returncode == 0, proc.stderr
    assert "prefill tokens" in proc.stdout and "of floor" in proc.stdout and "stream bandwidth" in proc.stdout
    d = json.loads(out.read_text())
    assert d["layout"] == "fp8" and positive(d["decode"][0]["ms_per_step"])


def test_prefill_after_a_cached_context_with_saves():
    # A later conversation turn: 16 / 48 tokens after 0 and 64 cached tokens, each timed prefill saving
    # its GDN state twice; --decode-steps 0 runs the prefill cases only.
    d = bench_json("--synth", "tiny", "--layout", "nvfp4", "--prompt-lens", "16,48", "--prefill-after", "64,0",
                   "--prefill-saves", 2, "--decode-steps", 0)
    assert d["prefill_saves"] == 2 and d["decode"] == [] and d["logits_finite"] is True
    assert [(p["after"], p["prompt_tokens"]) for p in d["prefill"]] == [(0, 16), (0, 48), (64, 16), (64, 48)]
    for p in d["prefill"]:
        assert positive(p["ttft_ms"]) and positive(p["tokens_per_s"])


def test_slow_cases_are_skipped_not_run():
    # A 1 ms case limit: the first prefill runs (it measures the rate), longer ones are predicted
    # too slow and reported as skipped, as are contexts that need them.
    d = bench_json("--synth", "tiny", "--layout", "bf16", "--prompt-lens", "64,4000", "--contexts", "0,4000",
                   "--batches", "1", "--decode-steps", 1, "--max-case-s", 0.001)
    assert "ttft_ms" in d["prefill"][0]
    assert "max-case-s" in d["prefill"][1]["skipped"]
    ctx = {r["context"]: r for r in d["decode"]}
    assert "skipped" in ctx[4000] and "ms_per_step" in ctx[0]


@pytest.mark.parametrize("args,needle", [
    ([], "exactly one of --model"),
    (["--synth", "tiny", "--model", str(MOE)], "exactly one of --model"),
    (["--synth", "tiny"], "--synth needs --layout"),
    (["--synth", "tiny", "--layout", "int3"], "unknown layout 'int3'"),
    (["--synth", "gpt-5", "--layout", "nvfp4"], "unknown model 'gpt-5'"),
    (["--synth", "tiny", "--layout", "nvfp4", "--layers", "0"], "--layers"),
    (["--model", str(MOE), "--layout", "nvfp4"], "go with --synth"),
    (["--synth", "tiny", "--layout", "nvfp4", "--contexts", "0,x"], "--contexts: 'x'"),
    (["--synth", "tiny", "--layout", "nvfp4", "--batches", "0"], "--batches: '0'"),
    (["--synth", "tiny", "--layout", "nvfp4", "--prompt-lens", ""], "--prompt-lens"),
    (["--synth", "tiny", "--layout", "nvfp4", "--decode-steps", "-1"], "--decode-steps"),
    (["--synth", "tiny", "--layout", "nvfp4", "--prefill-after", "0,x"], "--prefill-after: 'x'"),
    (["--synth", "tiny", "--layout", "nvfp4", "--prefill-saves", "9"], "--prefill-saves"),
    (["--synth", "tiny", "--layout", "nvfp4", "--prefill-after", "5000"], "max_position_embeddings"),
    (["--synth", "tiny", "--layout", "nvfp4", "--device", "tpu"], "unknown device 'tpu'"),
    (["--synth", "tiny", "--layout", "nvfp4", "--contexts", "5000"], "max_position_embeddings"),
    (["--model", "/nonexistent/model"], "/nonexistent/model"),
])
def test_bad_arguments_fail_cleanly(args, needle):
    assert_clean_error(run("bench", "--device", "cpu", *args) if "--device" not in args else run("bench", *args), needle)


def test_time_budget_skips_the_remaining_cases():
    d = bench_json("--synth", "tiny", "--layout", "nvfp4", "--prompt-lens", "8,16", "--batches", "1,2",
                   "--decode-steps", 1, "--time-budget-s", 0.000001)
    assert all("time-budget-s" in p["skipped"] for p in d["prefill"])
    assert all("time-budget-s" in r["skipped"] for r in d["decode"])
    assert d["logits_finite"] is True  # nothing ran, nothing non-finite
