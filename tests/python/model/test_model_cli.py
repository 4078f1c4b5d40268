"""`sparkserve generate` / `sparkserve logits`: the stable CLI contract and its error handling.

Every bad input must give a message on stderr naming what is wrong and a non-zero exit, never a crash
(a crash shows as a negative return code / signal here)."""
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))
MOE = ROOT / "tests" / "fixtures" / "qwen35-moe-tiny"
DENSE = ROOT / "tests" / "fixtures" / "qwen35-dense-tiny"


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def ref_prompt(fx, name="short"):
    ref = json.loads((fx / "reference.json").read_text())
    return next(p for p in ref["prompts"] if p["name"] == name)


def assert_clean_error(proc, *needles):
    assert proc.returncode > 0, (proc.returncode, proc.stderr)  # > 0: an exit code, not a signal
    for n in needles:
        assert n in proc.stderr, proc.stderr


def test_generate_json_fields():
    p = ref_prompt(MOE)
    proc = run("generate", "--model", MOE, "--prompt-ids", ",".join(map(str, p["prompt_ids"])), "--max-tokens", 4,
               "--json", "--threads", 1)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["output_ids"] == p["greedy_ids"][:4]
    assert out["prompt_ids"] == p["prompt_ids"]
    t = out["timing"]
    assert t["prefill_ms"] > 0 and t["decode_tokens"] == 3 and t["decode_tokens_per_s"] > 0
    assert out["threads"] == 1
    # The unused MTP tensors are reported on stderr, not as errors; the vision tower is loaded and
    # used (image prompts), so it is not reported as unused.
    assert "mtp." in proc.stderr and "model.visual" not in proc.stderr


def test_generate_plain_output_and_zero_tokens():
    proc = run("generate", "--model", DENSE, "--prompt-ids", "1,2,3", "--max-tokens", 3)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("output_ids: ") and "tokens/s" in proc.stdout
    proc = run("generate", "--model", DENSE, "--prompt-ids", "1,2,3", "--max-tokens", 0, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["output_ids"] == []


def test_generate_stops_at_eos_from_config(tmp_path):
    p = ref_prompt(DENSE)
    model = tmp_path / "m"
    shutil.copytree(DENSE, model)
    cfg = json.loads((model / "config.json").read_text())
    eos = p["greedy_ids"][3]
    assert eos not in p["greedy_ids"][:3]
    cfg["text_config"]["eos_token_id"] = eos
    (model / "config.json").write_text(json.dumps(cfg))
    ids = ",".join(map(str, p["prompt_ids"]))
    proc = run("generate", "--model", model, "--prompt-ids", ids, "--max-tokens", 20, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output_ids"] == p["greedy_ids"][:4]  # the eos token is included
    proc = run("generate", "--model", model, "--prompt-ids", ids, "--max-tokens", 20, "--json", "--ignore-eos")
    assert json.loads(proc.stdout)["output_ids"] == p["greedy_ids"]


def test_logits_file_format(tmp_path):
    out = tmp_path / "l.npy"
    proc = run("logits", "--model", MOE, "--prompt-ids", "5,6,7", "--out", out)
    assert proc.returncode == 0, proc.stderr
    raw = out.read_bytes()
    assert raw[:8] == b"\x93NUMPY\x01\x00"
    header_len = int.from_bytes(raw[8:10], "little")
    assert (10 + header_len) % 64 == 0
    a = np.load(out)
    assert a.dtype == np.dtype("<f4") and a.shape == (3, 1000) and a.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("cmd", ["generate", "logits"])
def test_bad_inputs_give_clean_errors(cmd, tmp_path):
    extra = ["--out", tmp_path / "x.npy"] if cmd == "logits" else ["--max-tokens", 2]
    assert_clean_error(run(cmd, "--model", tmp_path / "nope", "--prompt-ids", "1", *extra), "nope")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1,x,3", *extra), "'x'")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1,,3", *extra), "--prompt-ids")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "", *extra), "--prompt-ids")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "-1", *extra), "'-1'")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "99999999999", *extra), "99999999999")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1,1000", *extra), "token id 1000 is out of range [0, 1000)")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1", "--threads", "abc", *extra))
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1", "--threads", "-2", *extra), "--threads")
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", "1", "--threads", "100000", *extra), "--threads")
    # Longer than max_position_embeddings (4096 in the fixture config).
    too_long = ",".join(["1"] * 4097)
    assert_clean_error(run(cmd, "--model", MOE, "--prompt-ids", too_long, *extra), "max_position_embeddings")
    # A truncated checkpoint file: the error names the file.
    bad = tmp_path / "bad"
    shutil.copytree(DENSE, bad)
    shard = bad / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    assert_clean_error(run(cmd, "--model", bad, "--prompt-ids", "1,2", *extra), "model-00002-of-00002.safetensors")
    # No config.json.
    (bad / "config.json").unlink()
    assert_clean_error(run(cmd, "--model", bad, "--prompt-ids", "1,2", *extra), "config.json")


def test_generate_rejects_too_many_tokens():
    assert_clean_error(run("generate", "--model", MOE, "--prompt-ids", "1,2", "--max-tokens", 5000),
                       "max_position_embeddings")
    assert_clean_error(run("generate", "--model", MOE, "--prompt-ids", "1,2", "--max-tokens", -1), "--max-tokens")


def test_logits_unwritable_output(tmp_path):
    assert_clean_error(run("logits", "--model", MOE, "--prompt-ids", "1", "--out", tmp_path / "no" / "dir" / "x.npy"),
                       "x.npy")
