#!/usr/bin/env python3
"""Writes a synthetic ~0.5B-parameter Qwen3.5-MoE-shaped bf16 checkpoint (random weights, flat CausalLM
layout) for timing the CPU backend, then optionally times `sparkserve generate` on it.

    python3 bench/cpu_forward_synthetic.py --out /tmp/qwen35-moe-0.5b [--bin build/sparkserve --threads 2]

Shape: hidden 1024, 12 layers (3 Gated DeltaNet : 1 gated attention), GDN 8 key / 16 value heads of 128,
attention 8 heads / 2 KV heads of 128 (rotary 32), 40 experts top-8 of 256 + shared expert 256, vocab 32000.
That is 0.54B parameters (0.21B active per token). The weights are not committed anywhere; only numpy is needed.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

CFG = dict(hidden_size=1024, num_hidden_layers=12, vocab_size=32000, num_attention_heads=8, num_key_value_heads=2,
           head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
           linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=40, num_experts_per_tok=8,
           moe_intermediate_size=256, shared_expert_intermediate_size=256)


def config_json():
    c = dict(CFG)
    c.update(architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", rms_norm_eps=1e-6,
             tie_word_embeddings=False, max_position_embeddings=32768, attn_output_gate=True,
             layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(CFG["num_hidden_layers"])],
             rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                  mrope_section=[6, 5, 5], mrope_interleaved=True),
             eos_token_id=None, bos_token_id=None)
    return c


def tensors():
    c = CFG
    H, V = c["hidden_size"], c["vocab_size"]
    kd = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    vd = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    Hv, conv = c["linear_num_value_heads"], 2 * kd + vd
    nh, kvh, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, Is = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    yield "model.embed_tokens.weight", (V, H), 0.0, 0.5
    for l in range(c["num_hidden_layers"]):
        P = f"model.layers.{l}."
        yield P + "input_layernorm.weight", (H,), 0.0, 0.1
        yield P + "post_attention_layernorm.weight", (H,), 0.0, 0.1
        if (l + 1) % 4:
            A = P + "linear_attn."
            yield A + "in_proj_qkv.weight", (conv, H), 0.0, H ** -0.5
            yield A + "in_proj_z.weight", (vd, H), 0.0, H ** -0.5
            yield A + "in_proj_b.weight", (Hv, H), 0.0, H ** -0.5
            yield A + "in_proj_a.weight", (Hv, H), 0.0, H ** -0.5
            yield A + "out_proj.weight", (H, vd), 0.0, vd ** -0.5
            yield A + "conv1d.weight", (conv, 1, 4), 0.0, 0.3
            yield A + "A_log", (Hv,), -1.0, 0.5
            yield A + "dt_bias", (Hv,), 0.0, 0.5
            yield A + "norm.weight", (c["linear_value_head_dim"],), 1.0, 0.1
        else:
            A = P + "self_attn."
            yield A + "q_proj.weight", (nh * hd * 2, H), 0.0, H ** -0.5
            yield A + "k_proj.weight", (kvh * hd, H), 0.0, H ** -0.5
            yield A + "v_proj.weight", (kvh * hd, H), 0.0, H ** -0.5
            yield A + "o_proj.weight", (H, nh * hd), 0.0, (nh * hd) ** -0.5
            yield A + "q_norm.weight", (hd,), 0.0, 0.1
            yield A + "k_norm.weight", (hd,), 0.0, 0.1
        M = P + "mlp."
        yield M + "gate.weight", (E, H), 0.0, 0.3
        yield M + "experts.gate_up_proj", (E, 2 * I, H), 0.0, H ** -0.5
        yield M + "experts.down_proj", (E, H, I), 0.0, I ** -0.5
        yield M + "shared_expert.gate_proj.weight", (Is, H), 0.0, H ** -0.5
        yield M + "shared_expert.up_proj.weight", (Is, H), 0.0, H ** -0.5
        yield M + "shared_expert.down_proj.weight", (H, Is), 0.0, Is ** -0.5
        yield M + "shared_expert_gate.weight", (1, H), 0.0, H ** -0.5
    yield "model.norm.weight", (H,), 0.0, 0.1
    yield "lm_head.weight", (V, H), 0.0, H ** -0.5


def to_bf16_bytes(x):
    u = x.astype(np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (no NaNs here)
    return rounded.astype(np.uint16).tobytes()


def write(out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_json(), indent=2))
    specs = list(tensors())
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _, _ in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    rng = np.random.default_rng(0)
    params = 0
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for name, shape, mean, std in specs:
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
            f.write(to_bf16_bytes(x))
            params += x.size
    print(f"wrote {out}: {params / 1e9:.3f}B parameters, {offset / 1e9:.2f} GB", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--bin", help="sparkserve binary: run generate on the checkpoint and print its timing")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    if not (a.out / "model.safetensors").exists():
        write(a.out)
    if a.bin:
        ids = ",".join(str((i * 7919) % CFG["vocab_size"]) for i in range(a.prompt_tokens))
        cmd = [a.bin, "generate", "--model", str(a.out), "--prompt-ids", ids, "--max-tokens", str(a.max_tokens),
               "--ignore-eos", "--json", "--threads", str(a.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stderr)
        print(json.dumps(json.loads(proc.stdout)["timing"]))


if __name__ == "__main__":
    main()
