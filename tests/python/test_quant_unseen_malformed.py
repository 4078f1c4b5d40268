"""Malformed variants of quantized checkpoints this project has not seen (tests/fixtures/unseen-quant-*, made by
tools/unseen_quant_check.py with the real compressed-tensors library: new dimensions, new seed). Each test copies
one to a temporary folder, breaks one thing (config or tensors) and checks that `sparkserve inspect` and
`sparkserve logits` give the precise reason, naming the module, never garbage or a crash:
overlapping targets, wrong tensor dtype, missing scale, an ignore entry that matches nothing, a config that
disagrees with the tensors."""
import json
import os
import pathlib
import shutil
import struct
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SPARKSERVE_BIN", str(ROOT / "build" / "sparkserve"))
FX = ROOT / "tests" / "fixtures"
EXPERT = "model.language_model.layers.1.mlp.experts.3.up_proj"
FP8_MODULE = "model.language_model.layers.2.self_attn.o_proj"  # layer 2 is the full-attention layer
ROUTER = "model.language_model.layers.0.mlp.gate"

pytestmark = pytest.mark.skipif(not (FX / "unseen-quant-nvfp4").is_dir(), reason="unseen quantized fixtures absent")


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
    return tensors, meta


def write_safetensors(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for k, (dtype, shape, blob) in tensors.items():
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def mutated(tmp_path, layout, tensors_edit=None, config_edit=None, config_file="config.json"):
    dst = tmp_path / ("unseen-quant-" + layout)
    shutil.copytree(FX / ("unseen-quant-" + layout), dst)
    if tensors_edit:
        t, meta = read_safetensors(dst / "model.safetensors")
        tensors_edit(t)
        write_safetensors(dst / "model.safetensors", t, meta)
    if config_edit:
        cfg = json.loads((dst / config_file).read_text())
        config_edit(cfg)
        (dst / config_file).write_text(json.dumps(cfg, indent=2))
    return dst


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)


def inspect_and_logits(folder, tmp_path):
    i = run("inspect", folder)
    l = run("logits", "--model", folder, "--prompt-ids", "1,2,3", "--out", tmp_path / "l.npy", "--no-progress")
    return i, l


def assert_refused(folder, tmp_path, *needles):
    for proc in inspect_and_logits(folder, tmp_path):
        print(proc.args[1], "->", proc.stderr.strip()[:600])
        assert proc.returncode > 0, (proc.returncode, proc.stdout[-500:], proc.stderr)  # > 0: not a signal
        for n in needles:
            assert n in proc.stderr, (n, proc.stderr)


def assert_warned(folder, tmp_path, *needles):
    i, l = inspect_and_logits(folder, tmp_path)
    print("inspect ->", [x for x in (i.stdout + i.stderr).splitlines() if "warning" in x.lower()][:5])
    assert i.returncode == 0 and l.returncode == 0, (i.stderr, l.stderr)
    for n in needles:
        assert n in i.stdout + i.stderr, (n, i.stdout[-2000:])
        assert n in l.stderr, (n, l.stderr)
    return np.load(tmp_path / "l.npy")


@pytest.mark.parametrize("layout", ["nvfp4", "nvfp4-fp8dense", "fp8", "modelopt-nvfp4"])
def test_unmutated_copy_loads(layout, tmp_path):
    i, l = inspect_and_logits(mutated(tmp_path, layout), tmp_path)
    assert i.returncode == 0 and l.returncode == 0, (i.stderr, l.stderr)


def test_overlapping_targets_that_agree_on_the_format_warn(tmp_path):
    # A second NVFP4 group (same arguments) whose broader regex also matches the routed experts, listed last:
    # compressed-tensors applies it (its regex precedence), vLLM's first-match order the original group_1. Both
    # read NVFP4, so the checkpoint loads, with a warning naming the groups and a module, and the same logits.
    def edit(cfg):
        groups = cfg["quantization_config"]["config_groups"]
        twin = json.loads(json.dumps(groups["group_1"]))
        twin["targets"] = ["re:.*experts.*"]
        groups["group_z"] = twin
    base = run("logits", "--model", FX / "unseen-quant-nvfp4-fp8dense", "--prompt-ids", "1,2,3", "--out",
               tmp_path / "b.npy", "--no-progress")
    assert base.returncode == 0, base.stderr
    folder = mutated(tmp_path, "nvfp4-fp8dense", config_edit=edit)
    got = assert_warned(folder, tmp_path, 'overlapping targets: compressed-tensors applies group_z (target '
                        '"re:.*experts.*") but vLLM\'s first-match order would apply group_1',
                        "e.g. model.language_model.layers.0.mlp.experts.0.down_proj")
    assert np.array_equal(got, np.load(tmp_path / "b.npy"))


def test_overlapping_targets_that_disagree_with_the_tensors_are_refused(tmp_path):
    # An FP8 group whose regex also matches the routed experts: compressed-tensors' precedence gives the experts
    # FP8, the tensors hold NVFP4 -> refused, naming each module, the group and the target.
    def edit(cfg):
        q = cfg["quantization_config"]
        fp8 = json.loads(json.dumps(q["config_groups"]["group_0"]))
        fp8["targets"] = ["re:.*experts.*"]
        q["config_groups"] = {"group_a": fp8, **q["config_groups"]}
    folder = mutated(tmp_path, "nvfp4-fp8dense", config_edit=edit)
    # 4 layers x 6 experts x 3 projections; the message lists the first 20 by name.
    assert_refused(folder, tmp_path, "72 module(s) have no consistent reading",
                   "model.language_model.layers.0.mlp.experts.0.down_proj: config says float-quantized FP8 channel",
                   'group_a target "re:.*experts.*"', "but tensors hold nvfp4")


def test_wrong_tensor_dtype(tmp_path):
    def edit(t):
        dtype, shape, blob = t[EXPERT + ".weight_scale"]
        assert dtype == "F8_E4M3"
        t[EXPERT + ".weight_scale"] = ("U8", shape, blob)  # same bytes, wrong dtype
    folder = mutated(tmp_path, "nvfp4", tensors_edit=edit)
    assert_refused(folder, tmp_path, EXPERT, "weight_scale must be F8_E4M3", "got U8")


def test_wrong_fp8_weight_dtype(tmp_path):
    def edit(t):
        dtype, shape, blob = t[FP8_MODULE + ".weight"]
        assert dtype == "F8_E4M3"
        t[FP8_MODULE + ".weight"] = ("I8", shape, blob)
    assert_refused(mutated(tmp_path, "fp8", tensors_edit=edit), tmp_path, FP8_MODULE)


@pytest.mark.parametrize("layout,module,role,needle", [
    ("nvfp4", EXPERT, "weight_global_scale", "without weight_global_scale"),
    ("nvfp4", EXPERT, "weight_scale", "without weight_scale"),
    ("modelopt-nvfp4", EXPERT, "weight_scale_2", "without weight_scale_2"),
    ("fp8", FP8_MODULE, "weight_scale", "without weight_scale"),
    ("nvfp4-fp8dense", FP8_MODULE, "weight_scale", "without weight_scale"),
])
def test_missing_scale(layout, module, role, needle, tmp_path):
    folder = mutated(tmp_path, layout, tensors_edit=lambda t: t.pop(module + "." + role))
    assert_refused(folder, tmp_path, module, needle, f"{module}.{role}")


def test_missing_input_global_scale_of_w4a4(tmp_path):
    folder = mutated(tmp_path, "nvfp4", tensors_edit=lambda t: t.pop(EXPERT + ".input_global_scale"))
    assert_refused(folder, tmp_path, EXPERT + ".input_global_scale")


def test_ignore_entry_matching_nothing(tmp_path):
    entry = "model.language_model.layers.9.mlp.gate"  # there are 4 layers
    base = run("logits", "--model", FX / "unseen-quant-fp8", "--prompt-ids", "1,2,3", "--out", tmp_path / "b.npy",
               "--no-progress")
    assert base.returncode == 0, base.stderr
    folder = mutated(tmp_path, "fp8", config_edit=lambda c: c["quantization_config"]["ignore"].append(entry))
    got = assert_warned(folder, tmp_path, f'ignore entry "{entry}" matches no module')
    assert np.array_equal(got, np.load(tmp_path / "b.npy"))  # a warning, the same model


def test_config_disagreeing_with_tensors(tmp_path):
    # The router stays BF16 in the tensors, but without its ignore entry the "Linear" target makes it FP8.
    def edit(cfg):
        ig = cfg["quantization_config"]["ignore"]
        ig[:] = [e for e in ig if "mlp.gate" not in e]
    folder = mutated(tmp_path, "fp8", config_edit=edit)
    assert_refused(folder, tmp_path, ROUTER + ": config says", "but tensors hold bf16")


def test_quantized_but_ignored(tmp_path):
    # An ignore entry that covers a module whose tensors ARE quantized.
    folder = mutated(tmp_path, "nvfp4", config_edit=lambda c: c["quantization_config"]["ignore"].append(
        "re:.*experts\\.3\\.up_proj$"))
    assert_refused(folder, tmp_path, EXPERT + ": tensors hold nvfp4", "leaves it unquantized")


def test_modelopt_exclude_disagreeing_with_tensors(tmp_path):
    # exclude_modules names a module whose tensors are NVFP4.
    folder = mutated(tmp_path, "modelopt-nvfp4", config_file="hf_quant_config.json",
                     config_edit=lambda c: c["quantization"]["exclude_modules"].append("*experts.3.up_proj"))
    assert_refused(folder, tmp_path, EXPERT, "exclude_modules entry")
