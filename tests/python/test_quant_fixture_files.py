"""Self-consistency of the quantized fixtures tests/fixtures/qwen35-quant-* (made by tools/make_quant_fixtures.py).

These checks read only the files (plain Python + numpy): every module of every layout has the tensors, dtypes and
shapes its format prescribes (checkpoint-formats.md sections 1, 2, 5), the quantization config says what the
tensors say, the scales are finite and positive, the ModelOpt fixture is the NVFP4 fixture converted by the
documented formulas, and the reference files have the shapes reference.json announces. The forward comparison
against the reference logits belongs to the C++ quantized-backend test (see tests/fixtures/README.md, "Quantized
fixtures", for what it must compare and the tolerance).
"""
import json
import pathlib
import struct

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FX = ROOT / "tests" / "fixtures"
LAYOUTS = ["nvfp4", "nvfp4-fp8dense", "fp8", "modelopt-nvfp4"]
PROMPT_LENGTHS = {"short": 5, "medium": 70, "long": 150}
DTYPE_BYTES = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h, 8 + n


def load_raw(path):
    """name -> (dtype, shape, numpy float64 values or uint8 bytes)."""
    h, base = header(path)
    data = pathlib.Path(path).read_bytes()
    out = {}
    for name, info in h.items():
        b, e = info["data_offsets"]
        raw = np.frombuffer(data[base + b: base + e], dtype=np.uint8)
        dt, shape = info["dtype"], info["shape"]
        assert len(raw) == int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dt], name
        if dt == "F32":
            val = raw.view("<f4").astype(np.float64)
        elif dt == "BF16":
            val = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dt == "F8_E4M3":
            val = e4m3(raw)
        else:
            val = raw
        out[name] = (dt, shape, val.reshape(shape) if shape else val.reshape(()))
    return out


def e4m3(raw):
    s = np.where(raw >> 7, -1.0, 1.0)
    e = (raw >> 3) & 0xF
    m = (raw & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    return np.where((e == 15) & (m == 7), np.nan, s * v)


def text_config(cfg):
    return cfg.get("text_config", cfg)


def expected_modules(t):
    """module name -> (N, K, role) for every Linear-like module of the text model."""
    h, e, i, si = t["hidden_size"], t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    nq, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    hk, hv, dk, dv = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                      t["linear_value_head_dim"])
    mods = {"lm_head": (t["vocab_size"], h, "lm_head")}
    for li, kind in enumerate(t["layer_types"]):
        p = f"model.language_model.layers.{li}."
        if kind == "linear_attention":
            mods[p + "linear_attn.in_proj_qkv"] = (2 * hk * dk + hv * dv, h, "dense")
            mods[p + "linear_attn.in_proj_z"] = (hv * dv, h, "dense")
            mods[p + "linear_attn.in_proj_b"] = (hv, h, "gdn_ba")
            mods[p + "linear_attn.in_proj_a"] = (hv, h, "gdn_ba")
            mods[p + "linear_attn.out_proj"] = (h, hv * dv, "dense")
        else:
            mods[p + "self_attn.q_proj"] = (nq * hd * 2, h, "dense")
            mods[p + "self_attn.k_proj"] = (nkv * hd, h, "dense")
            mods[p + "self_attn.v_proj"] = (nkv * hd, h, "dense")
            mods[p + "self_attn.o_proj"] = (h, nq * hd, "dense")
        mods[p + "mlp.gate"] = (e, h, "router")
        mods[p + "mlp.shared_expert_gate"] = (1, h, "router")
        for proj, (n, k) in {"gate_proj": (si, h), "up_proj": (si, h), "down_proj": (h, si)}.items():
            mods[p + f"mlp.shared_expert.{proj}"] = (n, k, "dense")
        for x in range(e):
            for proj, (n, k) in {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}.items():
                mods[p + f"mlp.experts.{x}.{proj}"] = (n, k, "expert")
    return mods


# role -> format, per layout
FORMATS = {
    "nvfp4": {"dense": "nvfp4", "expert": "nvfp4", "gdn_ba": "bf16", "router": "bf16", "lm_head": "bf16"},
    "nvfp4-fp8dense": {"dense": "fp8", "expert": "nvfp4", "gdn_ba": "bf16", "router": "bf16", "lm_head": "bf16"},
    "fp8": {"dense": "fp8", "expert": "fp8", "gdn_ba": "fp8", "router": "bf16", "lm_head": "bf16"},
    "modelopt-nvfp4": {"dense": "modelopt", "expert": "modelopt", "gdn_ba": "bf16", "router": "bf16",
                       "lm_head": "bf16"},
}
CONFIG_FORMAT = {"nvfp4": "nvfp4-pack-quantized", "nvfp4-fp8dense": "mixed-precision", "fp8": "float-quantized"}


def folder(layout):
    return FX / f"qwen35-quant-{layout}"


def tensors_of(layout):
    return load_raw(folder(layout) / "model.safetensors")


def present():
    return [lay for lay in LAYOUTS if folder(lay).is_dir()]


def test_all_layouts_present():
    assert present() == LAYOUTS


@pytest.mark.parametrize("layout", LAYOUTS)
def test_files_and_sizes(layout):
    d = folder(layout)
    names = {p.name for p in d.iterdir()}
    need = {"config.json", "model.safetensors", "reference.json"} | {f"logits_{p}.npy" for p in PROMPT_LENGTHS}
    if layout == "modelopt-nvfp4":
        need.add("hf_quant_config.json")
    assert need <= names
    assert sum(p.stat().st_size for p in d.iterdir()) <= 3 * 1024 * 1024


@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantization_config(layout):
    cfg = json.loads((folder(layout) / "config.json").read_text())
    if layout == "modelopt-nvfp4":
        assert "quantization_config" not in cfg
        hq = json.loads((folder(layout) / "hf_quant_config.json").read_text())
        assert hq["producer"]["name"] == "modelopt"
        q = hq["quantization"]
        assert q["quant_algo"] == "NVFP4" and q["group_size"] == 16 and q["kv_cache_quant_algo"] is None
        assert "lm_head" in q["exclude_modules"]
        return
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["quantization_status"] == "compressed"
    assert qc["format"] == CONFIG_FORMAT[layout]
    groups = qc["config_groups"]
    kinds = sorted((g["format"], g["weights"]["num_bits"], g["weights"]["strategy"],
                    g["input_activations"]["strategy"], str(g["input_activations"]["dynamic"]))
                   for g in groups.values())
    nv = ("nvfp4-pack-quantized", 4, "tensor_group", "tensor_group", "local")
    f8 = ("float-quantized", 8, "channel", "token", "True")
    assert kinds == {"nvfp4": [nv], "nvfp4-fp8dense": [f8, nv], "fp8": [f8]}[layout]
    for g in groups.values():
        if g["format"] == "nvfp4-pack-quantized":
            assert g["weights"]["group_size"] == 16 and g["input_activations"]["group_size"] == 16
    ignore = qc["ignore"]
    assert "lm_head" in ignore
    if layout == "nvfp4":
        assert "re:^mtp.*" in ignore


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensor_dtypes_and_shapes(layout):
    cfg = json.loads((folder(layout) / "config.json").read_text())
    t = text_config(cfg)
    tens = tensors_of(layout)
    seen = set()
    for mod, (n, k, role) in expected_modules(t).items():
        fmt = FORMATS[layout][role]
        assert n % 16 == 0 or fmt in ("bf16", "fp8"), mod
        have = {name[len(mod) + 1:]: v for name, v in tens.items() if name.rsplit(".", 1)[0] == mod}
        seen.update(f"{mod}.{s}" for s in have)
        if fmt == "bf16":
            assert set(have) == {"weight"}, (mod, sorted(have))
            assert have["weight"][:2] == ("BF16", [n, k]), mod
        elif fmt == "fp8":
            assert set(have) == {"weight", "weight_scale"}, (mod, sorted(have))
            assert have["weight"][:2] == ("F8_E4M3", [n, k]), mod
            assert have["weight_scale"][:2] == ("BF16", [n, 1]), mod
            assert np.all(np.isfinite(have["weight"][2])), mod
            assert np.all(have["weight_scale"][2] > 0), mod
            # channel scale = amax(row)/448, so every row reaches +-448 or close to it after quantization
            assert np.all(np.abs(have["weight"][2]).max(axis=1) >= 416), mod
        elif fmt == "nvfp4":
            assert set(have) == {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"}, mod
            assert have["weight_packed"][:2] == ("U8", [n, k // 2]), mod
            assert have["weight_scale"][:2] == ("F8_E4M3", [n, k // 16]), mod
            assert have["weight_global_scale"][:2] == ("F32", [1]), mod
            assert have["input_global_scale"][:2] == ("F32", [1]), mod
            bs = have["weight_scale"][2]
            assert np.all(np.isfinite(bs)) and np.all(bs >= 0), mod
            assert float(have["weight_global_scale"][2][0]) > 1 and float(have["input_global_scale"][2][0]) > 0
            assert float(have["weight_global_scale"][2][0]) != 1.0, f"{mod}: uncalibrated global scale"
        elif fmt == "modelopt":
            assert set(have) == {"weight", "weight_scale", "weight_scale_2", "input_scale"}, mod
            assert have["weight"][:2] == ("U8", [n, k // 2]), mod
            assert have["weight_scale"][:2] == ("F8_E4M3", [n, k // 16]), mod
            assert have["weight_scale_2"][:2] == ("F32", []), mod
            assert have["input_scale"][:2] == ("F32", []), mod
    # nothing else is quantized: every other tensor is a plain BF16 parameter
    for name, (dt, shape, _) in tens.items():
        if name not in seen:
            assert dt == "BF16", (name, dt)
            assert not name.rsplit(".", 1)[1].startswith(("weight_", "input_")), name


@pytest.mark.parametrize("layout", ["nvfp4", "nvfp4-fp8dense"])
def test_nvfp4_fused_siblings_share_global_scale(layout):
    # llm-compressor fuses the weight global scale of q/k/v and of each gate/up pair; the inputs are identical,
    # so their input global scales are equal too.
    tens = tensors_of(layout)
    gs = {n[: -len(".weight_global_scale")]: float(v[2][0]) for n, v in tens.items()
          if n.endswith(".weight_global_scale")}
    igs = {n[: -len(".input_global_scale")]: float(v[2][0]) for n, v in tens.items()
           if n.endswith(".input_global_scale")}
    pairs = 0
    for mod in gs:
        if mod.endswith("gate_proj"):
            up = mod[: -len("gate_proj")] + "up_proj"
            assert gs[mod] == gs[up] and igs[mod] == igs[up], mod
            pairs += 1
        if mod.endswith("q_proj"):
            for s in ("k_proj", "v_proj"):
                assert gs[mod] == gs[mod[: -len("q_proj")] + s]
    assert pairs > 0


def test_modelopt_is_nvfp4_by_the_formulas():
    ct = tensors_of("nvfp4")
    mo = tensors_of("modelopt-nvfp4")
    converted = 0
    for name, (dt, shape, val) in ct.items():
        if name.endswith(".weight_packed"):
            assert np.array_equal(mo[name[: -len("_packed")]][2], val), name
            converted += 1
        elif name.endswith(".weight_global_scale"):
            ws2 = float(mo[name[: -len("weight_global_scale")] + "weight_scale_2"][2])
            assert abs(ws2 * float(val[0]) - 1.0) <= 2.0 ** -22, name
        elif name.endswith(".input_global_scale"):
            ins = float(mo[name[: -len("input_global_scale")] + "input_scale"][2])
            assert abs(ins * float(val[0]) - 1.0) <= 2.0 ** -22, name
        else:
            assert mo[name][0] == dt and mo[name][1] == shape, name
            assert np.array_equal(np.nan_to_num(mo[name][2]), np.nan_to_num(val)), name
    assert converted > 100
    # exclude_modules (fnmatch) name exactly the Linear-like modules left in BF16
    import fnmatch
    excl = json.loads((folder("modelopt-nvfp4") / "hf_quant_config.json").read_text())["quantization"][
        "exclude_modules"]
    t = text_config(json.loads((folder("modelopt-nvfp4") / "config.json").read_text()))
    for mod, (_, _, role) in expected_modules(t).items():
        excluded = any(fnmatch.fnmatchcase(mod, p) for p in excl)
        assert excluded == (f"{mod}.weight_scale_2" not in mo), mod


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_files(layout):
    d = folder(layout)
    ref = json.loads((d / "reference.json").read_text())
    cfg = json.loads((d / "config.json").read_text())
    vocab = text_config(cfg)["vocab_size"]
    assert ref["config_json"] == cfg
    assert {p["name"] for p in ref["prompts"]} == set(PROMPT_LENGTHS)
    for p in ref["prompts"]:
        arr = np.load(d / p["logits_file"])
        assert arr.dtype == np.dtype("<f4") and arr.flags["C_CONTIGUOUS"]
        assert list(arr.shape) == p["logits_shape"] == [PROMPT_LENGTHS[p["name"]], vocab]
        assert np.all(np.isfinite(arr)) and float(arr.std()) > 0.1
        assert len(p["prompt_ids"]) == PROMPT_LENGTHS[p["name"]]
        assert len(p["greedy_ids"]) == 12 and all(0 <= x < vocab for x in p["greedy_ids"])
        # the first greedy token is the argmax of the last prompt row
        assert int(arr[-1].argmax()) == p["greedy_ids"][0]
    # reference.json lists the real tensor headers
    for fname, info in ref["tensors"].items():
        h, _ = header(d / fname)
        assert sorted([n, v["dtype"], v["shape"]] for n, v in h.items()) == sorted(info["tensors"]), fname


@pytest.mark.parametrize("layout", LAYOUTS)
def test_recorded_fakequant_verification(layout):
    """The generator compared compressed-tensors' fake-quant Linear outputs with an independent emulation written
    from the format documents; the record must show agreement to float32 rounding AND that activation
    quantization was really applied (weight-only output differs by much more)."""
    ver = json.loads((folder(layout) / "reference.json").read_text())["checks"]["activation_fakequant_verification"]
    assert len(ver) >= 3
    for mod, r in ver.items():
        assert "error" not in r, (mod, r)
        scale = r["max_abs_output"]
        assert r["emulation_vs_reference_max_abs_diff"] <= 1e-5 * scale, (mod, r)
        assert r["weight_only_vs_reference_max_abs_diff"] >= 1e-3 * scale, (mod, r)
        assert r["activation_values_changed_by_quantization"] > 0
        assert r["activation_values_equal_to_compressed_tensors_forward_quantize"] == r["activation_values_total"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_linear_cases(layout):
    """Single-Linear cases (tools/quant_fixture_linear_cases.py): input/output files match the module's shape,
    and the independent emulation reproduced compressed-tensors' output."""
    d = folder(layout)
    ref = json.loads((d / "reference.json").read_text())
    t = text_config(json.loads((d / "config.json").read_text()))
    mods = expected_modules(t)
    cases = ref["linear_cases"]
    assert len(cases) >= 3
    formats = set()
    for c in cases:
        n, k, _ = mods[c["module"]]
        x = np.load(d / c["input_file"])
        y = np.load(d / c["output_file"])
        assert x.dtype == np.dtype("<f4") and y.dtype == np.dtype("<f4")
        assert x.shape[1] == k and y.shape == (x.shape[0], n) and x.shape[0] >= 8, c["module"]
        assert np.all(np.isfinite(x)) and np.all(np.isfinite(y))
        assert c["emulation_max_abs_diff"] <= 1e-5 * c["max_abs_output"], c
        assert c["weight_only_max_abs_diff"] >= 1e-3 * c["max_abs_output"], c
        formats.add(c["format"])
    assert formats == {"nvfp4": {"nvfp4"}, "nvfp4-fp8dense": {"nvfp4", "fp8"}, "fp8": {"fp8"},
                       "modelopt-nvfp4": {"nvfp4"}}[layout]
