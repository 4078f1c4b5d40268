#!/usr/bin/env python3
"""Make the tiny quantized Qwen3.5 MoE fixtures tests/fixtures/qwen35-quant-* (issue 4, item 8).

A tiny random Qwen3.5 MoE model (transformers 5.17 classes, BF16) is quantized by the real compressed-tensors
library (PyPI) and written in four layouts:

  qwen35-quant-nvfp4          all NVFP4 W4A4 (`nvfp4-pack-quantized`, preset NVFP4): attention, GDN in_proj_qkv /
                              in_proj_z / out_proj, shared expert, routed experts; BF16: router mlp.gate,
                              shared_expert_gate, GDN in_proj_a / in_proj_b, lm_head, embeddings, vision;
                              plus BF16 mtp.* tensors in model_mtp.safetensors (ignored with "re:^mtp.*")
  qwen35-quant-nvfp4-fp8dense NVFP4 routed experts (group targets a regex) + FP8 W8A8 dynamic (preset FP8_DYNAMIC,
                              `float-quantized`, channel weight scales, per-token dynamic activations) for every other
                              Linear (group targets "Linear": the classic overlapping-targets layout) + BF16 lm_head;
                              format `mixed-precision`
  qwen35-quant-fp8            FP8_DYNAMIC for every Linear of the text layers, GDN in_proj_a / in_proj_b included
                              (N = 4); BF16 router, shared_expert_gate, lm_head, embeddings, vision
  qwen35-quant-modelopt-nvfp4 the NVFP4 checkpoint rewritten in ModelOpt's layout (hf_quant_config.json,
                              `weight` U8, `weight_scale` F8_E4M3, `weight_scale_2` = 1/weight_global_scale,
                              `input_scale` = 1/input_global_scale, fnmatch exclude_modules). The ModelOpt package
                              is not installed: the conversion uses the documented formulas and is verified by
                              converting back with compressed-tensors' own ModelOptNvfp4Converter.

Routed experts are quantized as per-expert nn.Linear modules (`mlp.experts.{e}.{gate,up,down}_proj`), which is what
llm-compressor does (it linearizes the fused 3-D experts) and the layout of every released quantized Qwen3.5.

Reference logits come from the checkpoint AS RELOADED FROM DISK, in float32 on the CPU, through transformers'
model code with compressed-tensors' own fake-quant forward on every quantized Linear (apply_quantization_config
wraps Linear.forward: NVFP4 activations are quantized per 16 with the stored input_global_scale, FP8 activations per
token, dynamically) and the weights dequantized with compressed-tensors' own unpack/dequantize functions in float32.
See tests/fixtures/README.md ("Quantized fixtures") for the exact calls, checks and the tolerance.

Run on the GPU machine (torch 2.11, transformers 5.17; compressed-tensors carried as a wheel), CPU only:
    python3 tools/make_quant_fixtures.py --out /tmp/qfx
"""

import argparse
import fnmatch
import importlib.util
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (also blocks the optional kernel packages: plain-PyTorch paths only)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration  # noqa: E402

import compressed_tensors  # noqa: E402
from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationConfig,
    QuantizationStatus,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.lifecycle.forward import dequantize, forward_quantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402

SEED = mf.SEED
VOCAB = 1000
GREEDY_TOKENS = 12
CALIB_PROMPTS, CALIB_LEN = 4, 64
PERTURB_LEVELS = [2.0 ** -24, 2.0 ** -20]  # relative input noise: one float32 rounding, and sixteen
PERTURB_SEEDS = 2

# Every quantized Linear has K (input dim) and N (output dim) multiples of 16.
QTEXT = dict(mf.MOE_TEXT)
QTEXT.update({
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 32,
    "moe_intermediate_size": 48,
    "shared_expert_intermediate_size": 80,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 8,
    "num_experts_per_tok": 3,
})

BASE_IGNORE = ["re:.*mlp.gate$", "re:.*shared_expert_gate$", "re:.*lm_head", "re:.*embed_tokens$",
               "re:model.visual.*", "re:visual.*"]
GDN_BA_IGNORE = ["re:.*linear_attn.in_proj_a$", "re:.*linear_attn.in_proj_b$"]
EXPERT_REGEX = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"
# llm-compressor fuses the weight global scales of these sibling projections (FUSED_LAYER_NAMES); it does not fuse
# GDN in_proj_qkv/in_proj_z or in_proj_b/in_proj_a.
FUSED_SIBLINGS = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
MODELOPT_EXCLUDE = ["lm_head", "model.visual*", "*mlp.gate", "*shared_expert_gate", "*linear_attn.in_proj_a",
                    "*linear_attn.in_proj_b", "mtp*"]


# ----------------------------------------------------------------------------------------------- model


class ExpertMLP(torch.nn.Module):
    def __init__(self, hidden, inter, act):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)
        self.act_fn = act

    def forward(self, x):  # x: [n, H] -> [n, H]
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LinearExperts(torch.nn.Module):
    """Per-expert nn.Linear replacement of transformers' fused Qwen3_5MoeExperts (same routing arithmetic as its
    eager forward: experts in ascending order, output * routing weight, index_add). `calibrate_all` also runs every
    expert on every token (output discarded) so that each expert's input scale is calibrated, like llm-compressor's
    moe_calibrate_all_experts."""

    def __init__(self, num_experts, hidden, inter, act):
        super().__init__()
        self.num_experts = num_experts
        self.calibrate_all = False
        for e in range(num_experts):
            self.add_module(str(e), ExpertMLP(hidden, inter, act))

    def forward(self, hidden_states, top_k_index, top_k_weights):  # [T,H], [T,k], [T,k] -> [T,H]
        final = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            expert = getattr(self, str(e))
            if self.calibrate_all:
                expert(hidden_states)
            token_idx, top_k_pos = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            out = expert(hidden_states[token_idx]) * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        return final


def moe_blocks(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("SparseMoeBlock")]


def linearize_experts(model, copy_weights):
    text = model.config.get_text_config()
    for _, block in moe_blocks(model):
        fused = block.experts
        lin = LinearExperts(text.num_experts, text.hidden_size, text.moe_intermediate_size, fused.act_fn)
        lin = lin.to(dtype=fused.gate_up_proj.dtype)
        if copy_weights:
            inter = text.moe_intermediate_size
            with torch.no_grad():
                for e in range(text.num_experts):
                    ex = getattr(lin, str(e))
                    ex.gate_proj.weight.copy_(fused.gate_up_proj[e, :inter])
                    ex.up_proj.weight.copy_(fused.gate_up_proj[e, inter:])
                    ex.down_proj.weight.copy_(fused.down_proj[e])
        block.experts = lin


def set_calibrate_all(model, flag):
    for _, block in moe_blocks(model):
        block.experts.calibrate_all = flag


def quantized_modules(model):
    return [(n, m) for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None]


def build_bf16_model():
    torch.manual_seed(SEED + 100)
    cfg = Qwen3_5MoeConfig.from_dict(mf.outer_config("qwen3_5_moe", QTEXT, "qwen3_5_moe_vision"))
    model = Qwen3_5MoeForConditionalGeneration(cfg)
    mf.init_text_weights(model, SEED + 101)
    model = model.to(torch.bfloat16).eval()
    linearize_experts(model, copy_weights=True)
    return model


# ----------------------------------------------------------------------------------------------- recipes


def scheme(preset, targets, fmt):
    s = preset_name_to_scheme(preset, targets)
    s.format = fmt
    return s


def recipe(layout):
    if layout == "nvfp4":
        groups = {"group_0": scheme("NVFP4", ["Linear"], "nvfp4-pack-quantized")}
        ignore = BASE_IGNORE + GDN_BA_IGNORE
    elif layout == "nvfp4-fp8dense":
        groups = {"group_0": scheme("FP8_DYNAMIC", ["Linear"], "float-quantized"),
                  "group_1": scheme("NVFP4", [EXPERT_REGEX], "nvfp4-pack-quantized")}
        ignore = BASE_IGNORE + GDN_BA_IGNORE
    elif layout == "fp8":
        groups = {"group_0": scheme("FP8_DYNAMIC", ["Linear"], "float-quantized")}
        ignore = list(BASE_IGNORE)
    else:
        raise ValueError(layout)
    return QuantizationConfig(config_groups=groups, ignore=ignore)


# ----------------------------------------------------------------------------------------------- calibration


@torch.no_grad()
def calibrate(model, calib_prompts):
    """Sets every qparam the way llm-compressor's observers would (min/max): NVFP4 weight global scale
    448*6/amax(W) (shared by q/k/v and by gate/up siblings), per-16 FP8 block scales, FP8 per-channel weight
    scales, NVFP4 input_global_scale 448*6/amax(X) from the activations of calibration prompts (all experts see
    all calibration tokens)."""
    mods = quantized_modules(model)
    amax = {}
    hooks = []
    for name, m in mods:
        m.quantization_enabled = False  # plain BF16 forward while observing
        ia = m.quantization_scheme.input_activations
        if ia is not None and ia.num_bits == 4:
            def hook(mod, args, name=name):
                v = args[0].detach().abs().amax().float()
                amax[name] = torch.maximum(amax.get(name, v), v)
            hooks.append(m.register_forward_pre_hook(hook))
    set_calibrate_all(model, True)
    for ids in calib_prompts:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    set_calibrate_all(model, False)
    for h in hooks:
        h.remove()

    byname = dict(mods)
    gscale = {}
    for name, m in mods:
        w = m.quantization_scheme.weights
        if w.num_bits == 4:
            wt = m.weight.detach().float()
            gscale[name] = generate_gparam(wt.min(), wt.max())
    for name in list(gscale):
        parent, _, leaf = name.rpartition(".")
        for group in FUSED_SIBLINGS:
            if leaf in group:
                sibs = [f"{parent}.{s}" for s in group]
                if all(s in gscale for s in sibs):
                    gscale[name] = torch.min(torch.stack([gscale[s] for s in sibs]), dim=0).values
    stats = {"fp4_modules": 0, "fp8_modules": 0, "input_global_scales": {}}
    for name, m in mods:
        sch = m.quantization_scheme
        wt = m.weight.detach().float()
        if sch.weights.num_bits == 4:
            gs = gscale[name].clone()
            g = wt.unflatten(-1, (wt.shape[-1] // sch.weights.group_size, sch.weights.group_size))
            scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), sch.weights, global_scale=gs)
            m.weight_global_scale.data.copy_(gs)
            m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype))
            stats["fp4_modules"] += 1
        else:
            scale, _ = calculate_qparams(wt.amin(1, keepdim=True), wt.amax(1, keepdim=True), sch.weights)
            m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype))
            stats["fp8_modules"] += 1
        if sch.input_activations is not None and sch.input_activations.num_bits == 4:
            if name not in amax:
                raise RuntimeError(f"{name}: no calibration activations")
            igs = generate_gparam(-amax[name], amax[name])
            m.input_global_scale.data.copy_(igs)
            stats["input_global_scales"][name] = float(igs)
        m.quantization_enabled = True
    assert byname
    return stats


# ----------------------------------------------------------------------------------------------- writing


def write_ct_checkpoint(model, layout, folder, calib_prompts):
    qcfg = recipe(layout)
    apply_quantization_config(model, qcfg)
    calib = calibrate(model, calib_prompts)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    dropped = sorted(k for k in state if k.endswith("_zero_point"))
    for k in dropped:  # symmetric schemes: compressed-tensors writes no zero points
        del state[k]
    os.makedirs(folder, exist_ok=True)
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(folder)
    compressor.update_config(folder)
    notes = {"recipe": json.loads(qcfg.model_dump_json()), "calibration": calib, "dropped_zero_points": dropped}
    if layout == "nvfp4":
        # BF16 MTP weights in a separate shard, as compressed-tensors' save_mtp_tensors_to_checkpoint does
        # (it also appends "re:^mtp.*" to the ignore list).
        save_file(mf.make_mtp_tensors(QTEXT, SEED + 2), os.path.join(folder, "model_mtp.safetensors"),
                  metadata={"format": "pt"})
        path = os.path.join(folder, "config.json")
        cfg = json.load(open(path))
        cfg["quantization_config"]["ignore"].append("re:^mtp.*")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    return notes


def load_tensors(folder):
    out = {}
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".safetensors") and fname != "model_mtp.safetensors":
            out.update(load_file(os.path.join(folder, fname)))
    return out


def write_modelopt(src_folder, folder):
    """NVFP4 compressed-tensors tensors -> ModelOpt NVFP4 tensors by the documented formulas."""
    ct = load_tensors(src_folder)
    out = {}
    for k, v in ct.items():
        if k.endswith(".weight_packed"):
            out[k[: -len("_packed")]] = v
        elif k.endswith(".weight_global_scale"):
            out[k[: -len("weight_global_scale")] + "weight_scale_2"] = (1.0 / v.float()).reshape(())
        elif k.endswith(".input_global_scale"):
            out[k[: -len("input_global_scale")] + "input_scale"] = (1.0 / v.float()).reshape(())
        else:
            out[k] = v
    os.makedirs(folder, exist_ok=True)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src_folder, "config.json")))
    cfg.pop("quantization_config")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    hf_quant = {"producer": {"name": "modelopt",
                             "version": "none: written by tools/make_quant_fixtures.py from the conversion formulas"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                 "exclude_modules": MODELOPT_EXCLUDE}}
    with open(os.path.join(folder, "hf_quant_config.json"), "w") as f:
        json.dump(hf_quant, f, indent=2)
    # exclude_modules must name exactly the Linear-like modules that stayed BF16
    modules = sorted({k.rsplit(".", 1)[0] for k in out if k.endswith(".weight")})
    bad = []
    for mod in modules:
        quantized = f"{mod}.weight_scale_2" in out
        excluded = any(fnmatch.fnmatch(mod, p) for p in MODELOPT_EXCLUDE)
        is_linear_like = out[f"{mod}.weight"].dim() == 2 and "norm" not in mod and "embed" not in mod \
            and "conv1d" not in mod
        if is_linear_like and quantized == excluded:
            bad.append(mod)
    if bad:
        raise RuntimeError(f"ModelOpt exclude_modules disagree with the tensors for {bad[:10]}")
    return out


def modelopt_roundtrip(mo_tensors, ct_tensors):
    """Converts the ModelOpt tensors back with compressed-tensors' own ModelOptNvfp4Converter; must give the
    compressed-tensors tensors (global scales within 1 ulp, since 1/(1/x) is rounded twice)."""
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    conv = ModelOptNvfp4Converter(ignore=BASE_IGNORE + GDN_BA_IGNORE, targets=["Linear"])
    back = conv.validate(dict(mo_tensors))
    if sorted(back) != sorted(ct_tensors):
        raise RuntimeError(f"round trip names differ: {sorted(set(back) ^ set(ct_tensors))[:10]}")
    max_rel = 0.0
    exact = 0
    for k, v in ct_tensors.items():
        b = back[k]
        if k.endswith("global_scale"):
            rel = float(((b.float().reshape(-1) - v.float().reshape(-1)).abs() / v.float().abs()).max())
            max_rel = max(max_rel, rel)
            if rel > 2.0 ** -23:
                raise RuntimeError(f"{k}: round trip rel diff {rel}")
        else:
            if b.dtype != v.dtype or b.shape != v.shape or not torch.equal(b.view(torch.uint8) if b.dtype in (
                    torch.float8_e4m3fn,) else b, v.view(torch.uint8) if v.dtype in (torch.float8_e4m3fn,) else v):
                raise RuntimeError(f"{k}: round trip differs")
            exact += 1
    for k, v in back.items():
        if k.endswith("global_scale"):
            back[k] = v.reshape(1).float()
    return back, {"converter": "compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4."
                               "ModelOptNvfp4Converter(ignore=..., targets=['Linear']).validate",
                  "tensors_bit_identical": exact, "global_scales_max_rel_diff": max_rel}


# ----------------------------------------------------------------------------------------------- reference


def load_reference_model(folder, qconfig_dict, tensors):
    """Model from the on-disk config and tensors: fp32, eager attention, per-expert Linear experts, every quantized
    Linear wrapped by compressed-tensors (apply_quantization_config), its weight dequantized in float32 with
    compressed-tensors' unpack_fp4_from_uint8/dequantize, status DECOMPRESSED (so the forward fake-quantizes the
    activations, and does not re-quantize the already dequantized weight)."""
    cfg = Qwen3_5MoeConfig.from_pretrained(folder)
    model = Qwen3_5MoeForConditionalGeneration._from_config(
        cfg, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    linearize_experts(model, copy_weights=False)
    qconfig = QuantizationConfig.model_validate(
        {k: v for k, v in qconfig_dict.items() if k in QuantizationConfig.model_fields})
    apply_quantization_config(model, qconfig)
    tensors = dict(tensors)
    used = set()
    for name, m in quantized_modules(model):
        sch = m.quantization_scheme
        p = name + "."
        if sch.weights.num_bits == 4:
            packed = tensors[p + "weight_packed"]
            n, kh = packed.shape
            codes = unpack_fp4_from_uint8(packed, n, kh * 2, dtype=torch.float32)
            w = dequantize(x_q=codes, scale=tensors[p + "weight_scale"].float(), args=sch.weights,
                           global_scale=tensors[p + "weight_global_scale"].float(), dtype=torch.float32)
            used.update([p + "weight_packed", p + "weight_scale", p + "weight_global_scale"])
            m.weight_global_scale.data = tensors[p + "weight_global_scale"].float().reshape(1)
            if sch.input_activations is not None:
                m.input_global_scale.data = tensors[p + "input_global_scale"].float().reshape(1)
                used.add(p + "input_global_scale")
        else:
            w = dequantize(x_q=tensors[p + "weight"].float(), scale=tensors[p + "weight_scale"].float(),
                           args=sch.weights, dtype=torch.float32)
            used.update([p + "weight", p + "weight_scale"])
        if tuple(w.shape) != tuple(m.weight.shape):
            raise RuntimeError(f"{name}: dequantized {tuple(w.shape)} vs module {tuple(m.weight.shape)}")
        m.weight.data = w.contiguous()
        m.quantization_status = QuantizationStatus.DECOMPRESSED
        m.quantization_enabled = True
        ia = sch.input_activations
        if ia is not None and str(getattr(ia.strategy, "value", ia.strategy)) == "token":
            # compressed-tensors' TOKEN strategy keeps dims {0, 1} and reduces the rest: right for [B, T, K], but a
            # 2-D [n, K] input (MoE block: experts and shared expert see hidden_states.view(-1, H)) would get ONE
            # scale for all n tokens. Present every input as [1, n, K] so that the scale is per token, as the
            # format (and vLLM's per-token kernels) define it.
            m.register_forward_pre_hook(_as_3d_input)
            m.register_forward_hook(_as_2d_output)
            PER_TOKEN_FIX.add(name)
    rest = {k: v.float() for k, v in tensors.items() if k not in used}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    qnames = {n for n, _ in quantized_modules(model)}
    missing = [k for k in missing if k.rsplit(".", 1)[0] not in qnames]
    if missing or unexpected:
        raise RuntimeError(f"{folder}: missing {missing[:8]} unexpected {unexpected[:8]}")
    return model


PER_TOKEN_FIX = set()


def _as_3d_input(mod, args):
    x = args[0]
    if x.dim() == 2:
        mod._was_2d = True
        return (x.unsqueeze(0),) + tuple(args[1:])
    mod._was_2d = False
    return None


def _as_2d_output(mod, args, out):
    return out.squeeze(0) if getattr(mod, "_was_2d", False) else None


def forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def round_e2m1(v):
    """Nearest E2M1 value, ties to even mantissa (checkpoint-formats.md section 1.2 thresholds)."""
    a = v.abs()
    r = torch.where(a <= 0.25, 0.0, torch.where(a < 0.75, 0.5, torch.where(a <= 1.25, 1.0, torch.where(
        a < 1.75, 1.5, torch.where(a <= 2.5, 2.0, torch.where(a < 3.5, 3.0, torch.where(a <= 5.0, 4.0, 6.0)))))))
    return torch.sign(v) * r


def emulate_linear(tensors, prefix, x):
    """Pure-PyTorch W4A4 / W8A8 emulation written from checkpoint-formats.md sections 1.2-1.5 and 2 (not from
    compressed-tensors): x [T, K] f32 -> (y with activation quantization [T, N], y weight-only [T, N], x_dq)."""
    x = x.float()
    if prefix + "weight_packed" in tensors:
        packed = tensors[prefix + "weight_packed"].to(torch.int64)
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
        gs = tensors[prefix + "weight_global_scale"].float().reshape(())
        bs = tensors[prefix + "weight_scale"].float().repeat_interleave(16, dim=1)
        w = E2M1[codes] * (bs / gs)
        igs = tensors[prefix + "input_global_scale"].float().reshape(())
        blk = x.unflatten(-1, (x.shape[-1] // 16, 16))
        amax = blk.abs().amax(-1, keepdim=True)
        sf = (igs * (amax / 6.0)).clamp(max=448.0).to(torch.float8_e4m3fn).float()
        sf = torch.where(sf == 0, torch.full_like(sf, 0.125), sf)
        step = sf / igs
        xdq = (round_e2m1((blk / step).clamp(-6, 6)) * step).flatten(-2)
    else:
        w = tensors[prefix + "weight"].float() * tensors[prefix + "weight_scale"].float()
        s = x.abs().amax(-1, keepdim=True) / 448.0
        s = torch.where(s == 0, torch.full_like(s, torch.finfo(torch.float32).eps), s)
        xdq = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    return xdq @ w.T, x @ w.T, xdq


def verify_activation_fakequant(model, tensors, prompt, module_names):
    """Runs the reference model on a prompt, captures input and output of some quantized Linears and compares
    them with the independent emulation above and with compressed-tensors' forward_quantize."""
    mods = dict(model.named_modules())
    seen = {}
    hooks = []
    for name in module_names:
        def hook(mod, args, out, name=name):
            if name not in seen:
                seen[name] = (args[0].detach().reshape(-1, args[0].shape[-1]).clone(),
                              out.detach().reshape(-1, out.shape[-1]).clone())
        hooks.append(mods[name].register_forward_hook(hook))
    forward_logits(model, prompt)
    for h in hooks:
        h.remove()
    result = {}
    for name in module_names:
        if name not in seen:
            result[name] = {"error": "module not reached by the prompt"}
            continue
        x, out = seen[name]
        m = mods[name]
        y_emul, y_weight_only, xdq = emulate_linear(tensors, name + ".", x)
        ct_xdq = forward_quantize(m, x.unsqueeze(0), "input", m.quantization_scheme.input_activations)[0]
        scale = float(out.abs().max())
        result[name] = {
            "tokens": int(x.shape[0]),
            "format": "nvfp4" if name + ".weight_packed" in tensors else "fp8",
            "max_abs_output": scale,
            "emulation_vs_reference_max_abs_diff": float((y_emul - out).abs().max()),
            "weight_only_vs_reference_max_abs_diff": float((y_weight_only - out).abs().max()),
            "activation_values_equal_to_compressed_tensors_forward_quantize":
                int((ct_xdq == xdq).sum()), "activation_values_total": int(xdq.numel()),
            "activation_values_changed_by_quantization": int((xdq != x).sum()),
        }
    return result


@torch.no_grad()
def perturbation_study(model, prompts):
    """Multiplies the input of every quantized Linear by (1 + rel * N(0,1)) -- rel = 2^-24 is one float32 rounding,
    2^-20 sixteen of them: the size of the differences between two correct float32 implementations -- and
    measures how far the logits move. Activation quantization is discontinuous: most runs move nothing at all
    (every code absorbs the noise), a run where one code lands on the other side of a rounding threshold moves
    every later position."""
    out = {}
    hooks = []
    state = {}

    def pre(mod, args):
        x = args[0]
        noise = torch.randn(x.shape, generator=state["gen"], dtype=torch.float32)
        return (x * (1 + state["rel"] * noise),) + tuple(args[1:])

    for _, m in quantized_modules(model):
        hooks.append(m.register_forward_pre_hook(pre, prepend=True))
    try:
        for rel in PERTURB_LEVELS:
            for seed in range(PERTURB_SEEDS):
                state["rel"] = rel
                state["gen"] = torch.Generator().manual_seed(SEED + 7 + seed)
                for name, ids, base in prompts:
                    pert = forward_logits(model, ids)
                    d = (pert - base).abs()
                    rows = (d.amax(-1) > 1e-5 * base.abs().max()).nonzero()
                    out.setdefault(f"rel_2^{int(round(np.log2(rel)))}", []).append({
                        "seed": seed, "prompt": name, "max_abs_diff": float(d.max()),
                        "max_rel_diff": float(d.max() / base.abs().max()),
                        "first_row_over_1e-5_rel": int(rows[0]) if len(rows) else None,
                        "rows": int(base.shape[0]),
                        "argmax_changed_rows": int((pert.argmax(-1) != base.argmax(-1)).sum())})
    finally:
        for h in hooks:
            h.remove()
    return out


@torch.no_grad()
def weight_only_logits_diff(model, ids, base):
    """How much activation quantization changes the logits (turning it off on every module)."""
    mods = quantized_modules(model)
    for _, m in mods:
        m.quantization_enabled = False
    try:
        wo = forward_logits(model, ids)
    finally:
        for _, m in mods:
            m.quantization_enabled = True
    return {"max_abs_diff": float((wo - base).abs().max()), "max_abs_reference": float(base.abs().max())}


def transformers_crosscheck(folder, ids, base):
    """transformers' own loading of the folder (compressed-tensors integration). transformers 5.17 merges the
    per-expert tensors into fused 3-D experts and dequantizes them (no activation quantization on experts), so
    this differs from the reference by the experts' activation quantization; recorded, not asserted."""
    try:
        m = Qwen3_5MoeForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
        hq = getattr(m, "hf_quantizer", None)
        if hq is not None and hasattr(m, "ct_decompress_hook"):
            hq.compressor.decompress_model(m)  # what its first forward would do, done before casting
        for prm in m.parameters():  # compressed-tensors decompresses to BF16; transformers refuses .float()
            if prm.dtype == torch.bfloat16:
                prm.data = prm.data.float()
        m.eval()
        got = forward_logits(m, ids)
        return {"max_abs_diff_vs_reference": float((got - base).abs().max()),
                "max_abs_reference": float(base.abs().max()),
                "argmax_equal_rows": int((got.argmax(-1) == base.argmax(-1)).sum()), "rows": int(base.shape[0])}
    except Exception as exc:  # a cross-check only
        return {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}


def greedy(model, prompt, n):
    seq = list(prompt)
    margins = []
    for _ in range(n):
        last = forward_logits(model, seq)[-1]
        top = torch.topk(last, 2)
        seq.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
    return seq[len(prompt):], margins


# ----------------------------------------------------------------------------------------------- main


VERIFY_MODULES = {
    "nvfp4": ["model.language_model.layers.0.linear_attn.in_proj_qkv",
              "model.language_model.layers.1.self_attn.o_proj",
              "model.language_model.layers.0.mlp.experts.0.down_proj",
              "model.language_model.layers.4.mlp.shared_expert.gate_proj"],
    "nvfp4-fp8dense": ["model.language_model.layers.0.linear_attn.in_proj_qkv",
                       "model.language_model.layers.1.self_attn.q_proj",
                       "model.language_model.layers.0.mlp.experts.1.gate_proj",
                       "model.language_model.layers.4.mlp.shared_expert.down_proj"],
    "fp8": ["model.language_model.layers.0.linear_attn.in_proj_b",
            "model.language_model.layers.1.self_attn.q_proj",
            "model.language_model.layers.0.mlp.experts.2.up_proj"],
}
VERIFY_MODULES["modelopt-nvfp4"] = VERIFY_MODULES["nvfp4"]

DESCRIPTIONS = {
    "nvfp4": "all NVFP4 W4A4 (compressed-tensors preset NVFP4, format nvfp4-pack-quantized, group targets "
             "['Linear']); BF16: router mlp.gate, shared_expert_gate, GDN in_proj_a/in_proj_b, lm_head, embeddings, "
             "vision; model_mtp.safetensors holds BF16 mtp.* tensors (ignore 're:^mtp.*'), unused by the reference",
    "nvfp4-fp8dense": "mixed-precision: group_0 FP8_DYNAMIC (float-quantized, channel weight scales BF16 [N,1], "
                      "per-token dynamic activations) targets ['Linear']; group_1 NVFP4 targets the routed experts by "
                      "regex (regex beats class name: experts are NVFP4); BF16 lm_head, router, shared_expert_gate, "
                      "GDN in_proj_a/in_proj_b, embeddings, vision",
    "fp8": "FP8_DYNAMIC (float-quantized) for every Linear of the text layers including GDN in_proj_a/in_proj_b "
           "(N = 4) and the routed experts; BF16 router, shared_expert_gate, lm_head, embeddings, vision",
    "modelopt-nvfp4": "the qwen35-quant-nvfp4 weights in ModelOpt NVFP4 layout: hf_quant_config.json (quant_algo "
                      "NVFP4, group_size 16, fnmatch exclude_modules), <mod>.weight U8 [N,K/2], weight_scale F8_E4M3 "
                      "[N,K/16], weight_scale_2 F32 [] = 1/weight_global_scale, input_scale F32 [] = "
                      "1/input_global_scale; no quantization_config in config.json; no mtp",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--layouts", default="nvfp4,nvfp4-fp8dense,fp8,modelopt-nvfp4",
                        help="comma-separated; modelopt-nvfp4 reads qwen35-quant-nvfp4 from --out")
    args = parser.parse_args()
    started = time.time()
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)

    rng = np.random.RandomState(SEED)
    prompts = [(name, [int(x) for x in rng.randint(0, mf.PROMPT_TOKEN_LIMIT, size=n)]) for name, n in mf.PROMPTS]
    crng = np.random.RandomState(SEED + 5)
    calib_prompts = [[int(x) for x in crng.randint(0, VOCAB, size=CALIB_LEN)] for _ in range(CALIB_PROMPTS)]

    summary = []
    layouts = args.layouts.split(",")
    for layout in layouts:
        t0 = time.time()
        name = "qwen35-quant-" + layout
        folder = os.path.join(out_root, name)
        extra = {}
        if layout == "modelopt-nvfp4":
            src = os.path.join(out_root, "qwen35-quant-nvfp4")
            mo = write_modelopt(src, folder)
            ct_tensors = load_tensors(src)
            try:
                tensors, extra["modelopt_roundtrip"] = modelopt_roundtrip(mo, ct_tensors)
            except Exception as exc:  # fall back to the formulas, and say so
                extra["modelopt_roundtrip"] = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
                tensors = {}
                for k, v in mo.items():
                    if k.endswith(".weight_scale_2"):
                        tensors[k[: -len("weight_scale_2")] + "weight_global_scale"] = (1.0 / v).reshape(1)
                    elif k.endswith(".input_scale"):
                        tensors[k[: -len("input_scale")] + "input_global_scale"] = (1.0 / v).reshape(1)
                    elif k.endswith(".weight") and v.dtype == torch.uint8:
                        tensors[k + "_packed"] = v
                    else:
                        tensors[k] = v
            qconfig_dict = json.load(open(os.path.join(src, "config.json")))["quantization_config"]
            extra["reference_path"] = ("tensors converted back with ModelOptNvfp4Converter, then the same reference "
                                       "path as qwen35-quant-nvfp4 with its quantization_config")
        else:
            model = build_bf16_model()
            extra.update(write_ct_checkpoint(model, layout, folder, calib_prompts))
            del model
            tensors = load_tensors(folder)
            qconfig_dict = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
        model = load_reference_model(folder, qconfig_dict, tensors)

        results = []
        base_logits = []
        for pname, ids in prompts:
            logits = forward_logits(model, ids)
            np.save(os.path.join(folder, f"logits_{pname}.npy"), logits.numpy().astype("<f4"))
            g, margins = greedy(model, ids, GREEDY_TOKENS)
            base_logits.append((pname, ids, logits))
            results.append({"name": pname, "prompt_ids": ids, "logits_file": f"logits_{pname}.npy",
                            "logits_shape": list(logits.shape), "greedy_ids": g,
                            "greedy_top1_top2_margins": margins, "greedy_min_margin": min(margins),
                            "logits_std": float(logits.std()), "logits_max_abs": float(logits.abs().max())})
        checks = {"fp8_per_token_fix_modules": len([n for n in PER_TOKEN_FIX])}
        PER_TOKEN_FIX.clear()
        checks["activation_fakequant_verification"] = verify_activation_fakequant(
            model, tensors, prompts[1][1], VERIFY_MODULES[layout])
        checks["perturbation"] = perturbation_study(model, base_logits)
        checks["weight_only_vs_reference"] = {p: weight_only_logits_diff(model, ids, lg) for p, ids, lg in base_logits}
        if layout != "modelopt-nvfp4":
            checks["transformers_from_pretrained_crosscheck_short"] = transformers_crosscheck(
                folder, prompts[0][1], base_logits[0][2])
        with open(os.path.join(folder, "config.json")) as f:
            config_json = json.load(f)
        reference = {
            "fixture": name,
            "layout": layout,
            "description": DESCRIPTIONS[layout],
            "generated_by": {
                "script": "tools/make_quant_fixtures.py", "command": f"python3 tools/make_quant_fixtures.py --out OUT "
                f"--threads {args.threads}",
                "compressed_tensors": compressed_tensors.__version__, "transformers": transformers.__version__,
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "reference_device": "cpu", "torch_threads": torch.get_num_threads(), "seed": SEED,
                "optional_kernel_packages_installed": mf.KERNEL_PACKAGES_FOUND,
                "modelopt_installed": importlib.util.find_spec("modelopt") is not None,
            },
            "reference_compute": (
                "float32 on CPU: Qwen3_5MoeForConditionalGeneration._from_config(config from the folder, "
                "dtype=float32, attn_implementation='eager'); fused experts replaced by per-expert nn.Linear "
                "(LinearExperts, same routing arithmetic); compressed_tensors apply_quantization_config(model, "
                "QuantizationConfig.model_validate(config.json quantization_config)); each quantized weight = "
                "compressed_tensors dequantize(unpack_fp4_from_uint8(weight_packed, dtype=float32) | weight.float(), "
                "weight_scale.float(), global_scale=weight_global_scale) in float32; input_global_scale from disk; "
                "status DECOMPRESSED; forward = compressed-tensors' wrapped Linear.forward (forward_quantize of the "
                "input: NVFP4 per-16 dynamic-local scales with input_global_scale, FP8 per-token dynamic); "
                "use_cache=False"),
            "greedy_method": f"recompute full sequence each step, argmax of last row, {GREEDY_TOKENS} tokens",
            "prompts": results,
            "checks": checks,
            "extra": extra,
            "tensors": mf.folder_tensors(folder),
            "config_json": config_json,
        }
        if layout == "modelopt-nvfp4":
            reference["hf_quant_config_json"] = json.load(open(os.path.join(folder, "hf_quant_config.json")))
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(reference, f, indent=1)
            f.write("\n")
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        line = {"fixture": name, "seconds": round(time.time() - t0, 1), "MB": round(size / 1e6, 2),
                "greedy": {r["name"]: r["greedy_ids"] for r in results},
                "min_margin": {r["name"]: round(r["greedy_min_margin"], 4) for r in results},
                "checks": checks}
        summary.append(line)
        print(json.dumps(line), flush=True)
        del model

    # The ModelOpt fixture must reproduce the NVFP4 one.
    for pname, _ in (prompts if "modelopt-nvfp4" in layouts else []):
        a = np.load(os.path.join(out_root, "qwen35-quant-nvfp4", f"logits_{pname}.npy"))
        b = np.load(os.path.join(out_root, "qwen35-quant-modelopt-nvfp4", f"logits_{pname}.npy"))
        print(f"modelopt vs nvfp4 logits {pname}: max |diff| {float(np.abs(a - b).max())}")
    print(f"done in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
