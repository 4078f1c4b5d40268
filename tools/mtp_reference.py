#!/usr/bin/env python3
"""PyTorch reference of the Qwen3.5 multi-token-prediction (MTP) layer, and its draft-logits fixtures.

transformers has no MTP module (it drops `mtp.*` on load), so the MTP is assembled here from the published
model definition (vLLM's Qwen3_5MultiTokenPredictor, model-qwen35.md section 2.9) out of transformers' own
building blocks, which nobody in this project wrote:
  - the decoder layer is transformers' Qwen3_5MoeDecoderLayer / Qwen3_5DecoderLayer built as a
    "full_attention" layer from the checkpoint's text config (gated attention, q/k norms, partial M-RoPE,
    MoE or dense MLP), with the mtp.layers.0.* tensors;
  - the three extra norms are transformers' Qwen3.5 RMSNorm class (x * (1 + w));
  - embedding and lm_head are the target model's (shared, mtp_use_dedicated_embeddings false).
What comes from vLLM's definition is the glue: e = pre_fc_norm_embedding(embed(token p+1)),
h = pre_fc_norm_hidden(H_p) with H_p the target's final-normalised hidden state at p, x = fc(cat[e, h])
(embedding first), x = decoder_layer(x) at position p (causal over the MTP rows), out = norm(x),
draft logits = lm_head(out). Chained drafts feed `out` back as the hidden state with the drafted token, one
position further.

For each fixture prompt (reference.json) the sequence is prompt + the 20 greedy tokens; the MTP rows are
p = 0 .. T-2 (teacher forced: row p reads H_p and token p+1), then CHAIN more rows: from the last teacher-forced
row, draft d1 = argmax, then rows (out_prev, d_j) at the following positions. Written per fixture folder:
  mtp_logits_<prompt>.npy   [T-1+CHAIN, vocab] float32: the teacher-forced rows, then the chained rows
  mtp_reference.json        per prompt: ids, row counts, drafts, top-1/top-2 margins, provenance
`sparkserve logits --model DIR --prompt-ids <the T ids> --mtp-drafts CHAIN+1 --out F.npy` computes the same rows.

With --make-dense-mtp the dense fixture (which transformers saved without MTP tensors) first gets
mtp_extra.safetensors: mtp.* tensors of a dense MTP layer (mlp.{gate,up,down}_proj), BF16, drawn with the
same rule as tools/make_fixtures.py's make_mtp_tensors (N(0, 0.1) from a fixed seed).

Run (CPU, float32; transformers 5.17, torch 2.11):
    python3 tools/mtp_reference.py --fixtures tests/fixtures --make-dense-mtp
"""

import argparse
import copy
import glob
import importlib.util
import json
import os
import platform
import sys

OPTIONAL_KERNEL_PACKAGES = ["fla", "causal_conv1d", "kernels", "flash_attn"]
KERNEL_PACKAGES_FOUND = {name: importlib.util.find_spec(name) is not None for name in OPTIONAL_KERNEL_PACKAGES}
for _name in OPTIONAL_KERNEL_PACKAGES:
    sys.modules[_name] = None  # the plain-PyTorch paths of transformers, as tools/make_fixtures.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as dense_mod  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as moe_mod  # noqa: E402

CHAIN = 2  # chained rows after the teacher-forced ones (3 drafts in all)
PROMPTS = ("short", "long")  # the shortest and the longest fixture prompt (keeps the .npy files small)
DENSE_MTP_SEED = 20261130 + 12
FIXTURES = {"qwen35-moe-tiny": Qwen3_5MoeForConditionalGeneration,
            "qwen35-dense-tiny": Qwen3_5ForConditionalGeneration}


def mtp_state(folder):
    """Every mtp.* tensor of the folder's safetensors files, as float32."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if key.startswith("mtp."):
                    out[key] = f.get_tensor(key).float()
    return out


def make_dense_mtp(folder, text):
    """mtp.* tensors of a dense MTP layer for the dense fixture: BF16, N(0, 0.1) (make_mtp_tensors' rule)."""
    gen = torch.Generator().manual_seed(DENSE_MTP_SEED)
    h, hd = text.hidden_size, text.head_dim
    nq, nkv, inter = text.num_attention_heads, text.num_key_value_heads, text.intermediate_size
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
        "mtp.layers.0.mlp.gate_proj.weight": [inter, h],
        "mtp.layers.0.mlp.up_proj.weight": [inter, h],
        "mtp.layers.0.mlp.down_proj.weight": [h, inter],
    }
    tensors = {k: (torch.randn(s, generator=gen) * 0.1).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(tensors, os.path.join(folder, "mtp_extra.safetensors"), metadata={"format": "pt"})


class Mtp(torch.nn.Module):
    """The MTP layer from transformers' blocks (see the module docstring)."""

    def __init__(self, text, mod, is_moe):
        super().__init__()
        cfg = copy.deepcopy(text)
        cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
        cfg.num_hidden_layers += 1
        norm = mod.Qwen3_5MoeRMSNorm if is_moe else mod.Qwen3_5RMSNorm
        layer = mod.Qwen3_5MoeDecoderLayer if is_moe else mod.Qwen3_5DecoderLayer
        h = cfg.hidden_size
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = norm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(h, eps=cfg.rms_norm_eps)
        self.layer = layer(cfg, cfg.num_hidden_layers - 1)
        self.norm = norm(h, eps=cfg.rms_norm_eps)

    def load(self, state):
        mapped = {}
        for k, v in state.items():
            k = k[len("mtp."):]
            mapped[k.replace("layers.0.", "layer.", 1) if k.startswith("layers.0.") else k] = v
        missing, unexpected = self.load_state_dict(mapped, strict=True)
        assert not missing and not unexpected
        return len(mapped)

    def forward(self, emb, hidden, position_embeddings):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1))
        t = x.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        x = self.layer(x, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(x)


def reference(model, mtp, ids):
    """Teacher-forced MTP rows over ids, then CHAIN chained rows; returns (logits [T-1+CHAIN, V], drafts)."""
    lm = model.model.language_model
    with torch.no_grad():
        hidden = lm(input_ids=torch.tensor([ids])).last_hidden_state  # [1, T, H], final norm applied
        # The target's logits are lm_head of these rows: the hidden state the MTP reads.
        full = model(input_ids=torch.tensor([ids])).logits
        assert torch.allclose(model.lm_head(hidden), full, atol=1e-5)
        t = len(ids)
        emb_rows = [lm.embed_tokens(torch.tensor([ids[1:]]))[0]]  # token p+1 for rows p = 0 .. T-2
        hid_rows = [hidden[0, : t - 1]]
        logits_rows, drafts = [], []
        for step in range(CHAIN + 1):
            emb = torch.cat(emb_rows)[None]
            hid = torch.cat(hid_rows)[None]
            n = emb.shape[1]
            pos = torch.arange(n)[None]
            position_embeddings = lm.rotary_emb(emb, pos[None].expand(3, 1, n))
            out = mtp(emb, hid, position_embeddings)  # causal: earlier rows do not change
            logits = model.lm_head(out)[0]
            new = logits if step == 0 else logits[-1:]
            logits_rows.append(new)
            d = int(logits[-1].argmax())
            drafts.append(d)
            emb_rows.append(lm.embed_tokens(torch.tensor([d])))
            hid_rows.append(out[0, -1:])
        return torch.cat(logits_rows).float(), drafts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixtures", required=True, help="tests/fixtures")
    parser.add_argument("--make-dense-mtp", action="store_true", help="first write the dense fixture's mtp tensors")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, cls in FIXTURES.items():
        folder = os.path.join(args.fixtures, name)
        model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                    experts_implementation="eager").eval()
        text = model.config.get_text_config()
        is_moe = "moe" in text.model_type
        if not is_moe and args.make_dense_mtp:
            make_dense_mtp(folder, text)
        mtp = Mtp(text, moe_mod if is_moe else dense_mod, is_moe).float().eval()
        loaded = mtp.load(mtp_state(folder))
        ref = json.load(open(os.path.join(folder, "reference.json")))
        prompts = []
        for p in [q for q in ref["prompts"] if q["name"] in PROMPTS]:
            ids = p["prompt_ids"] + p["greedy_ids"]
            logits, drafts = reference(model, mtp, ids)
            top = torch.topk(logits, 2, dim=-1).values
            fname = f"mtp_logits_{p['name']}.npy"
            np.save(os.path.join(folder, fname), logits.numpy().astype("<f4"))
            prompts.append({
                "name": p["name"],
                "ids": ids,
                "mtp_logits_file": fname,
                "mtp_logits_shape": list(logits.shape),
                "teacher_forced_rows": len(ids) - 1,
                "chained_rows": CHAIN,
                "drafts": drafts,
                "min_top1_top2_margin": float((top[:, 0] - top[:, 1]).min()),
                "max_abs_logit": float(logits.abs().max()),
            })
        json.dump({
            "made_by": "tools/mtp_reference.py",
            "mtp_tensors_loaded": loaded,
            "definition": "vLLM Qwen3_5MultiTokenPredictor glue over transformers' decoder layer and RMSNorm",
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                         "python": platform.python_version()},
            "optional_kernel_packages_found_and_disabled": KERNEL_PACKAGES_FOUND,
            "prompts": prompts,
        }, open(os.path.join(folder, "mtp_reference.json"), "w"), indent=1)
        print(f"{name}: {loaded} mtp tensors, " + ", ".join(f"{q['name']} {q['mtp_logits_shape']}" for q in prompts))


if __name__ == "__main__":
    main()
