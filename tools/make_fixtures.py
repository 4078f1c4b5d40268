#!/usr/bin/env python3
"""Make the tiny Qwen3.5 reference fixtures under tests/fixtures/ (issue 2, item 9).

Writes tiny random Qwen3.5 checkpoints with Hugging Face transformers `save_pretrained`, reloads each one FROM DISK
in float32 with the plain-PyTorch reference paths pinned, and stores what transformers computes: teacher-forced
logits for three prompts, greedy continuations, and the logits a cached decode should produce. The C++ engine is
tested against these files; nothing here is written by hand.

Fixtures (one folder each, loadable with `from_pretrained`):
  qwen35-moe-tiny               Qwen3_5MoeForConditionalGeneration, fused experts (official-checkpoint layout,
                                save_pretrained(save_original_format=False)), plus mtp_extra.safetensors (mtp.*)
  qwen35-moe-tiny-per-expert    same weights, per-expert tensors mlp.experts.{e}.{gate,up,down}_proj.weight
                                (what transformers' default save_pretrained writes for this model)
  qwen35-moe-tiny-causallm      Qwen3_5MoeForCausalLM (flat config, `model.` prefix), same text weights
  qwen35-dense-tiny             Qwen3_5ForConditionalGeneration, sharded (model.safetensors.index.json)
  qwen35-dense-tiny-causallm    Qwen3_5ForCausalLM (flat config, `model.` prefix), same text weights,
                                A_log and linear_attn.norm.weight stored as F32 (the rest BF16)

Run on the GPU machine (torch 2.11, transformers 5.17); the references are computed on its CPU in float32:
    python3 tools/make_fixtures.py --out /tmp/fixtures
See tests/fixtures/README.md for the exact `run` command and the file formats.
"""

import argparse
import copy
import importlib.util
import json
import os
import platform
import shutil
import struct
import sys
import time

# The references must come from transformers' plain-PyTorch paths. Those are used only when these optional kernel
# packages are absent: record whether they are installed, then make them unimportable for this process.
OPTIONAL_KERNEL_PACKAGES = ["fla", "causal_conv1d", "kernels", "flash_attn"]
KERNEL_PACKAGES_FOUND = {name: importlib.util.find_spec(name) is not None for name in OPTIONAL_KERNEL_PACKAGES}
for _name in OPTIONAL_KERNEL_PACKAGES:
    sys.modules[_name] = None  # `import fla` now raises ImportError
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

SEED = 20261130
VOCAB = 1000
PROMPT_TOKEN_LIMIT = 990  # prompt ids are drawn from [0, 990): all < vocab_size
PROMPTS = [("short", 5), ("medium", 70), ("long", 150)]  # 70 and 150 cross the 64-token GDN chunk
GREEDY_TOKENS = 20
LOAD_KWARGS_TEXT = 'dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"'

LINEAR, FULL = "linear_attention", "full_attention"

# MoE text config: structure of the real Qwen3.5-35B-A3B config.json (model-qwen35.md section 1.3), tiny numbers.
# Chosen so that mistakes show: GDN value head dim (24) != key head dim (16), 3 value heads per key head,
# intermediate sizes 40/56 (not powers of two), 8 experts top-3, layer pattern not "every fourth",
# partial RoPE 0.25 of head_dim 32 = 8 rotary dims = 4 frequencies = mrope_section [2,1,1].
MOE_TEXT = {
    "model_type": "qwen3_5_moe_text",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 5,
    "layer_types": [LINEAR, FULL, LINEAR, LINEAR, FULL],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 24,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 40,
    "shared_expert_intermediate_size": 56,
    "router_aux_loss_coef": 0.001,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "use_cache": True,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}

# Dense text config: differs from the MoE one on purpose so that nothing can be hard-coded: value head dim (16)
# smaller than key head dim (24), 2 value heads per key head, 4 query heads per KV head, intermediate 88,
# 6 layers ending with a GDN layer, partial RoPE 0.5 (16 rotary dims, mrope_section [3,3,2]), rope_theta 1e6.
DENSE_TEXT = {
    "model_type": "qwen3_5_text",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 88,
    "num_hidden_layers": 6,
    "layer_types": [LINEAR, FULL, LINEAR, LINEAR, FULL, LINEAR],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 24,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "use_cache": True,
    "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "partial_rotary_factor": 0.5,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000,
        "partial_rotary_factor": 0.5,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
}


def tiny_vision(model_type, out_hidden_size):
    """A tiny vision tower so that model.visual.* tensors exist (the text path never runs it)."""
    return {
        "model_type": model_type,
        "depth": 1,
        "hidden_size": 32,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 48,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": out_hidden_size,
        "num_position_embeddings": 64,
        "initializer_range": 0.02,
    }


def outer_config(model_type, text, vision_type):
    # Special token ids are the real ones (beyond the tiny vocab): they never occur in prompts or continuations,
    # so the text-only path is what is tested.
    arch = "Qwen3_5MoeForConditionalGeneration" if model_type == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {
        "architectures": [arch],
        "model_type": model_type,
        "text_config": dict(text),
        "vision_config": tiny_vision(vision_type, text["hidden_size"]),
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
    }


# ----------------------------------------------------------------------------------------------- initialisation


def init_text_weights(model, seed):
    """Deterministic, non-trivial values for every text parameter (the vision tower keeps transformers' init).

    (1+w) RMSNorms (input/post-attention/final/q_norm/k_norm): w ~ N(0, 0.2), so a norm that forgets the "1+" or
    applies a plain weight is wrong. GDN gated norm (plain weight): 1 + N(0, 0.2). A_log: log of A ~ log-uniform
    [0.01, 2] and dt_bias ~ N(0, 0.5), so decays range from nearly 1 (state kept across the 64-token chunks) to
    strong. Router std 0.3 keeps top-k choices away from ties. Embedding std 0.5, lm_head 0.15, other matrices 0.1
    (hidden 64): logits come out with a standard deviation of about 1.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, mean, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    done = []
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if ".visual." in name or name.startswith("visual."):
            continue
        shape = tuple(param.shape)
        if name.endswith("linear_attn.A_log"):
            lo, hi = np.log(0.01), np.log(2.0)
            value = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
        elif name.endswith("linear_attn.dt_bias"):
            value = normal(shape, 0.0, 0.5)
        elif name.endswith("linear_attn.norm.weight"):
            value = normal(shape, 1.0, 0.2)
        elif name.endswith("layernorm.weight") or name.endswith("_norm.weight") or name.endswith("model.norm.weight") \
                or name.endswith("language_model.norm.weight"):
            value = normal(shape, 0.0, 0.2)
        elif name.endswith("linear_attn.conv1d.weight"):
            value = normal(shape, 0.0, 0.3)
        elif name.endswith("mlp.gate.weight"):
            value = normal(shape, 0.0, 0.3)
        elif name.endswith("embed_tokens.weight"):
            value = normal(shape, 0.0, 0.5)
        elif name == "lm_head.weight":
            value = normal(shape, 0.0, 0.15)
        elif param.dim() >= 2:
            value = normal(shape, 0.0, 0.1)
        else:
            raise RuntimeError(f"no init rule for 1-D text parameter {name} {shape}")
        with torch.no_grad():
            param.copy_(value)
        done.append(name)
    return done


# ----------------------------------------------------------------------------------------------- file helpers


def safetensors_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    metadata = header.pop("__metadata__", None)
    tensors = [[name, info["dtype"], info["shape"]] for name, info in sorted(header.items())]
    return tensors, metadata


def folder_tensors(folder):
    out = {}
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".safetensors"):
            tensors, metadata = safetensors_header(os.path.join(folder, fname))
            out[fname] = {"metadata": metadata, "tensors": tensors}
    return out


def load_folder_state(folder, skip_prefix=None):
    state = {}
    for fname in sorted(os.listdir(folder)):
        if fname.endswith(".safetensors") and fname != "mtp_extra.safetensors":
            for k, v in load_file(os.path.join(folder, fname)).items():
                if skip_prefix is None or not k.startswith(skip_prefix):
                    state[k] = v
    return state


def split_experts(state):
    """Fused [E,2I,H] gate_up_proj / [E,H,I] down_proj -> per-expert [I,H] / [H,I] tensors (gate = first I rows,
    as HF's `.chunk(2, dim=-1)` of the gate_up output)."""
    out = {}
    for key, tensor in state.items():
        if key.endswith(".mlp.experts.gate_up_proj"):
            prefix = key[: -len("gate_up_proj")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :inter].contiguous().clone()
                out[f"{prefix}{e}.up_proj.weight"] = tensor[e, inter:].contiguous().clone()
        elif key.endswith(".mlp.experts.down_proj"):
            prefix = key[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = tensor[e].contiguous().clone()
        else:
            out[key] = tensor
    return out


def make_mtp_tensors(text, seed):
    """mtp.* tensors shaped as in model-qwen35.md section 3 (MTP table) for the tiny dims; BF16. transformers drops
    them on load (_keys_to_ignore_on_load_unexpected = ["^mtp.*"]), so they do not change the references."""
    gen = torch.Generator().manual_seed(seed)
    h, hd = text["hidden_size"], text["head_dim"]
    nq, nkv = text["num_attention_heads"], text["num_key_value_heads"]
    e, i, si = text["num_experts"], text["moe_intermediate_size"], text["shared_expert_intermediate_size"]
    shapes = {
        "mtp.fc.weight": [h, 2 * h],
        "mtp.pre_fc_norm_embedding.weight": [h],
        "mtp.pre_fc_norm_hidden.weight": [h],
        "mtp.norm.weight": [h],
        "mtp.layers.0.input_layernorm.weight": [h],
        "mtp.layers.0.post_attention_layernorm.weight": [h],
        "mtp.layers.0.self_attn.q_proj.weight": [nq * hd * 2, h],
        "mtp.layers.0.self_attn.k_proj.weight": [nkv * hd, h],
        "mtp.layers.0.self_attn.v_proj.weight": [nkv * hd, h],
        "mtp.layers.0.self_attn.o_proj.weight": [h, nq * hd],
        "mtp.layers.0.self_attn.q_norm.weight": [hd],
        "mtp.layers.0.self_attn.k_norm.weight": [hd],
        "mtp.layers.0.mlp.gate.weight": [e, h],
        "mtp.layers.0.mlp.experts.gate_up_proj": [e, 2 * i, h],
        "mtp.layers.0.mlp.experts.down_proj": [e, h, i],
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": [si, h],
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": [si, h],
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": [h, si],
        "mtp.layers.0.mlp.shared_expert_gate.weight": [1, h],
    }
    return {k: (torch.randn(s, generator=gen) * 0.1).to(torch.bfloat16) for k, s in shapes.items()}


def rename_text_for_causallm(state):
    """ConditionalGeneration names -> flat ForCausalLM names: model.language_model.X -> model.X, drop model.visual."""
    out = {}
    for key, tensor in state.items():
        if key.startswith("model.visual."):
            continue
        if key.startswith("model.language_model."):
            out["model." + key[len("model.language_model."):]] = tensor
        elif key == "lm_head.weight":
            out[key] = tensor
        else:
            raise RuntimeError(f"unexpected tensor {key}")
    return out


# ----------------------------------------------------------------------------------------------- references


def load_reloaded(cls, folder):
    model, info = cls.from_pretrained(
        folder,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    model.eval()
    info = {k: sorted(str(x) for x in v) if isinstance(v, (list, set, tuple)) else str(v) for k, v in info.items()}
    for key in ("missing_keys", "mismatched_keys"):
        if info.get(key):
            raise RuntimeError(f"{folder}: {key} on reload: {info[key]}")
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise RuntimeError(f"{folder}: parameters not float32 after reload: {bad[:5]}")
    return model, info


def check_reloaded_params(model, expected, folder):
    """The fp32 model as reloaded from disk must hold exactly the bf16-rounded values that were saved."""
    got = model.state_dict()
    compared = 0
    for key, want in expected.items():
        if key not in got:
            raise RuntimeError(f"{folder}: reloaded model lacks {key}")
        if not torch.equal(got[key].float(), want.float()):
            diff = (got[key].float() - want.float()).abs().max().item()
            raise RuntimeError(f"{folder}: reloaded {key} differs from the saved values (max |diff| {diff})")
        compared += 1
    return compared


def forward_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().contiguous()


def greedy_recompute(model, prompt, n):
    """Greedy decoding by recomputing the whole sequence each step (no cache): argmax of the last row."""
    seq = list(prompt)
    margins = []
    for _ in range(n):
        last = forward_logits(model, seq)[-1]
        top = torch.topk(last, 2)
        seq.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
    return seq[len(prompt):], margins


def hf_generate_check(model, prompt, greedy, full_logits):
    """Cross-check: transformers' own cached generate (prefill + recurrent GDN decode) against the recompute."""
    t = len(prompt)
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt], dtype=torch.long),
                attention_mask=torch.ones(1, t, dtype=torch.long),
                max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
                return_dict_in_generate=True,
                output_logits=True,
            )
    except Exception as exc:  # record, do not fail: this is only a cross-check
        return {"error": f"{type(exc).__name__}: {exc}"}
    ids = [int(x) for x in out.sequences[0, t:]]
    gen_logits = torch.stack([l[0].float() for l in out.logits])  # step s: logits after t+s tokens
    ref = full_logits[t - 1 : t - 1 + gen_logits.shape[0]]
    n = min(len(ids), len(greedy))
    return {
        "output_ids": ids,
        "matches_recompute_greedy": ids[:n] == greedy[:n] and len(ids) == len(greedy),
        "max_abs_diff_vs_teacher_forced": float((gen_logits - ref).abs().max()),
        "max_abs_teacher_forced": float(ref.abs().max()),
    }


def compute_references(cls, folder, prompts, expected_params):
    model, info = load_reloaded(cls, folder)
    compared = check_reloaded_params(model, expected_params, folder)
    results = []
    arrays = {}
    for name, ids in prompts:
        assert max(ids) < model.config.get_text_config().vocab_size
        t = len(ids)
        logits = forward_logits(model, ids)
        greedy, margins = greedy_recompute(model, ids, GREEDY_TOKENS)
        full = forward_logits(model, ids + greedy)
        decode = full[t : t + GREEDY_TOKENS]
        tf_argmax = [int(x) for x in full[t - 1 : t - 1 + GREEDY_TOKENS].argmax(-1)]
        arrays[f"logits_{name}.npy"] = logits.numpy().astype("<f4")
        arrays[f"logits_{name}_decode.npy"] = decode.numpy().astype("<f4")
        results.append({
            "name": name,
            "prompt_ids": [int(x) for x in ids],
            "logits_file": f"logits_{name}.npy",
            "logits_shape": list(logits.shape),
            "greedy_ids": greedy,
            "greedy_distinct_tokens": len(set(greedy)),
            "greedy_top1_top2_margins": margins,
            "greedy_min_margin": min(margins),
            "decode_logits_file": f"logits_{name}_decode.npy",
            "decode_logits_shape": list(decode.shape),
            "prompt_plus_greedy_teacher_forced_argmax_matches_greedy": tf_argmax == greedy,
            "prompt_vs_full_sequence_rows_max_abs_diff": float((full[:t] - logits).abs().max()),
            "logits_std": float(logits.std()),
            "logits_max_abs": float(logits.abs().max()),
            "hf_generate_cached": hf_generate_check(model, ids, greedy, full),
        })
    runtime = {
        "loading_info": info,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "params_checked_equal_to_saved_bf16": compared,
    }
    return results, arrays, runtime


# ----------------------------------------------------------------------------------------------- main


def build_models(seed):
    """Builds the base MoE and dense ConditionalGeneration models, random-initialised, cast to bf16."""
    torch.manual_seed(seed)
    moe_cfg = Qwen3_5MoeConfig.from_dict(outer_config("qwen3_5_moe", MOE_TEXT, "qwen3_5_moe_vision"))
    moe = Qwen3_5MoeForConditionalGeneration(moe_cfg)
    init_text_weights(moe, seed + 1)
    moe = moe.to(torch.bfloat16).eval()

    torch.manual_seed(seed + 10)
    dense_cfg = Qwen3_5Config.from_dict(outer_config("qwen3_5", DENSE_TEXT, "qwen3_5_vision"))
    dense = Qwen3_5ForConditionalGeneration(dense_cfg)
    init_text_weights(dense, seed + 11)
    dense = dense.to(torch.bfloat16).eval()
    return moe, dense


def causallm_from(cls, text_config, cg_state):
    model = cls(copy.deepcopy(text_config))
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in rename_text_for_causallm(cg_state).items()}, strict=True)
    assert not missing and not unexpected
    return model.to(torch.bfloat16).eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (one sub-folder per fixture)")
    parser.add_argument("--threads", type=int, default=8, help="CPU threads for the float32 reference computation")
    args = parser.parse_args()

    started = time.time()
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    scratch = os.path.join(out_root, "_scratch")
    os.makedirs(scratch, exist_ok=True)

    rng = np.random.RandomState(SEED)
    prompts = [(name, [int(x) for x in rng.randint(0, PROMPT_TOKEN_LIMIT, size=n)]) for name, n in PROMPTS]

    moe, dense = build_models(SEED)
    moe_state = {k: v.clone() for k, v in moe.state_dict().items()}
    dense_state = {k: v.clone() for k, v in dense.state_dict().items()}

    fixtures = []  # (folder name, class, expected params for the reloaded model, description, extra notes)

    # 1. MoE, fused experts: the layout of the official Qwen3.5 BF16 checkpoints.
    d = os.path.join(out_root, "qwen35-moe-tiny")
    moe.save_pretrained(d, save_original_format=False)
    save_file(make_mtp_tensors(MOE_TEXT, SEED + 2), os.path.join(d, "mtp_extra.safetensors"), metadata={"format": "pt"})
    fixtures.append(("qwen35-moe-tiny", Qwen3_5MoeForConditionalGeneration, moe_state,
                     "Qwen3_5MoeForConditionalGeneration saved with save_pretrained(save_original_format=False): "
                     "fused experts mlp.experts.gate_up_proj [E,2I,H] / mlp.experts.down_proj [E,H,I] (the official "
                     "Qwen3.5 BF16 layout), single model.safetensors; plus mtp_extra.safetensors holding mtp.* tensors "
                     "that transformers ignores", {}))

    # 2. MoE, per-expert tensors. transformers' default save_pretrained (save_original_format=True) reverts its
    #    qwen2_moe-style conversion mapping; record what it wrote and compare with our own split of the fused tensors.
    hf_default = os.path.join(scratch, "moe-default-save")
    moe.save_pretrained(hf_default)
    default_state = load_folder_state(hf_default)
    default_is_per_expert = any(".mlp.experts.0.gate_proj.weight" in k for k in default_state)
    ours = split_experts(load_folder_state(os.path.join(out_root, "qwen35-moe-tiny")))
    same_keys = sorted(ours) == sorted(default_state)
    same_values = same_keys and all(torch.equal(ours[k], default_state[k]) for k in ours)
    d = os.path.join(out_root, "qwen35-moe-tiny-per-expert")
    if default_is_per_expert and same_values:
        shutil.copytree(hf_default, d)
        how = "transformers' default save_pretrained output, unchanged (it writes per-expert tensors for this model)"
    else:
        os.makedirs(d)
        for fname in ("config.json", "generation_config.json"):
            src = os.path.join(out_root, "qwen35-moe-tiny", fname)
            if os.path.exists(src):
                shutil.copy(src, d)
        save_file(ours, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        how = "fused tensors of qwen35-moe-tiny split per expert by tools/make_fixtures.py (split_experts)"
    fixtures.append(("qwen35-moe-tiny-per-expert", Qwen3_5MoeForConditionalGeneration, moe_state,
                     "Same weights as qwen35-moe-tiny with per-expert tensors "
                     "mlp.experts.{e}.gate_proj.weight [I,H], up_proj.weight [I,H], down_proj.weight [H,I]: " + how,
                     {"hf_default_save_is_per_expert": default_is_per_expert,
                      "hf_default_save_equals_our_split": bool(same_values),
                      "hf_default_save_tensor_names_sample": sorted(default_state)[:12]}))

    # 3. MoE flat ForCausalLM (fused experts).
    moe_clm = causallm_from(Qwen3_5MoeForCausalLM, moe.config.text_config, moe_state)
    d = os.path.join(out_root, "qwen35-moe-tiny-causallm")
    moe_clm.save_pretrained(d, save_original_format=False)
    fixtures.append(("qwen35-moe-tiny-causallm", Qwen3_5MoeForCausalLM,
                     {k: v.clone() for k, v in moe_clm.state_dict().items()},
                     "Qwen3_5MoeForCausalLM (flat text config, model_type qwen3_5_moe_text, tensor prefix `model.`), "
                     "same text weights as qwen35-moe-tiny, fused experts, no vision tensors", {}))

    # 4. Dense ConditionalGeneration, sharded so that model.safetensors.index.json is exercised.
    d = os.path.join(out_root, "qwen35-dense-tiny")
    dense.save_pretrained(d, max_shard_size="500KB")
    fixtures.append(("qwen35-dense-tiny", Qwen3_5ForConditionalGeneration, dense_state,
                     "Qwen3_5ForConditionalGeneration saved with save_pretrained(max_shard_size='500KB'): sharded "
                     "model-0000k-of-0000n.safetensors + model.safetensors.index.json, dense SiLU MLP", {}))

    # 5. Dense flat ForCausalLM with A_log and the GDN norm weight kept in F32 (as some released checkpoints
    #    are suspected to store them): the values are the bf16 ones, so the references are unchanged.
    dense_clm = causallm_from(Qwen3_5ForCausalLM, dense.config.text_config, dense_state)
    for module in dense_clm.modules():
        if hasattr(module, "A_log"):
            module.A_log.data = module.A_log.data.float()
            module.norm.weight.data = module.norm.weight.data.float()
    d = os.path.join(out_root, "qwen35-dense-tiny-causallm")
    dense_clm.save_pretrained(d)
    fixtures.append(("qwen35-dense-tiny-causallm", Qwen3_5ForCausalLM,
                     {k: v.clone() for k, v in dense_clm.state_dict().items()},
                     "Qwen3_5ForCausalLM (flat text config, model_type qwen3_5_text, tensor prefix `model.`), same "
                     "text weights as qwen35-dense-tiny; linear_attn.A_log and linear_attn.norm.weight stored as F32 "
                     "(bf16-exact values), everything else BF16", {}))

    base_of = {"qwen35-moe-tiny-per-expert": "qwen35-moe-tiny", "qwen35-moe-tiny-causallm": "qwen35-moe-tiny",
               "qwen35-dense-tiny-causallm": "qwen35-dense-tiny"}
    computed = {}
    summary = []
    for name, cls, expected, description, extra in fixtures:
        folder = os.path.join(out_root, name)
        t0 = time.time()
        results, arrays, runtime = compute_references(cls, folder, prompts, expected)
        for fname, arr in arrays.items():
            np.save(os.path.join(folder, fname), arr)
        computed[name] = arrays
        equivalence = None
        if name in base_of:
            base = computed[base_of[name]]
            diffs = {f: float(np.abs(arrays[f] - base[f]).max()) for f in arrays}
            equivalence = {"base_fixture": base_of[name], "max_abs_diff_per_file": diffs,
                           "greedy_identical": None}
        with open(os.path.join(folder, "config.json")) as f:
            config_json = json.load(f)
        reference = {
            "fixture": name,
            "description": description,
            "model_class": cls.__name__,
            "config_model_type": config_json.get("model_type"),
            "generated_by": {
                "script": "tools/make_fixtures.py",
                "command": "python3 tools/make_fixtures.py --out OUT --threads %d" % args.threads,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "reference_device": "cpu",
                "torch_threads": torch.get_num_threads(),
                "seed": SEED,
                "optional_kernel_packages_installed": KERNEL_PACKAGES_FOUND,
                "optional_kernel_packages_blocked": OPTIONAL_KERNEL_PACKAGES,
            },
            "dtypes": {
                "checkpoint": "bfloat16 (model.to(torch.bfloat16) before save_pretrained)",
                "reference_compute": "float32 on CPU: from_pretrained(folder, %s) of the folder as saved on disk; "
                                     "no TF32 (CPU), no hub kernels, no flash-linear-attention, no causal-conv1d"
                                     % LOAD_KWARGS_TEXT,
                "logits_files": "numpy .npy, little-endian float32 '<f4', C order",
            },
            "greedy_method": "manual loop: recompute the full sequence (prompt + tokens so far) with use_cache=False "
                             "each step, take argmax of the last row; %d tokens, no EOS stop" % GREEDY_TOKENS,
            "decode_logits_definition": "logits_<name>_decode.npy row s = teacher-forced logits (one forward over "
                                        "prompt + all greedy tokens) at position T+s, i.e. the logits a cached decode "
                                        "returns after feeding greedy_ids[s]; row T-1 of that forward is the last row "
                                        "of logits_<name>.npy",
            "prompts": results,
            "runtime": runtime,
            "equivalence": equivalence,
            "extra": extra,
            "tensors": folder_tensors(folder),
            "config_json": config_json,
        }
        if equivalence is not None:
            base_ref = json.load(open(os.path.join(out_root, base_of[name], "reference.json")))
            equivalence["greedy_identical"] = [p["greedy_ids"] for p in base_ref["prompts"]] == \
                [p["greedy_ids"] for p in results]
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(reference, f, indent=1)
            f.write("\n")
        line = {
            "fixture": name, "seconds": round(time.time() - t0, 1),
            "greedy": {p["name"]: p["greedy_ids"] for p in results},
            "distinct": {p["name"]: p["greedy_distinct_tokens"] for p in results},
            "min_margin": {p["name"]: round(p["greedy_min_margin"], 4) for p in results},
            "logits_std": {p["name"]: round(p["logits_std"], 3) for p in results},
            "generate": {p["name"]: p["hf_generate_cached"].get("matches_recompute_greedy",
                                                                p["hf_generate_cached"].get("error"))
                         for p in results},
            "generate_max_abs_diff": {p["name"]: p["hf_generate_cached"].get("max_abs_diff_vs_teacher_forced")
                                      for p in results},
            "equivalence": equivalence,
            "loading_info": runtime["loading_info"],
        }
        summary.append(line)
        print(json.dumps(line), flush=True)

    shutil.rmtree(scratch)
    for name, *_ in fixtures:
        folder = os.path.join(out_root, name)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"{name}: {size / 1e6:.2f} MB, files {sorted(os.listdir(folder))}")
        for fname, info in folder_tensors(folder).items():
            for tname, dtype, shape in info["tensors"]:
                if ".layers.0." in tname or ".layers.1." in tname or "layers." not in tname:
                    print(f"   {fname}: {tname} {dtype} {shape}")
    print(f"done in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
