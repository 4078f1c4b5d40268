"""Makes Qwen3.5 checkpoints this project has never seen (new dims, new seed, transformers' DEFAULT
save_pretrained) with fp32 transformers references, for the issue-2 "Done when" check.

Run on the GPU machine (torch + transformers there):
    python3 tools/unseen_checkpoint_check.py --out $OUT/unseen
then, here: tools/compare_unseen.py DIR (runs `sparkserve logits` / `generate` and compares).
Nothing is committed from this run; it exists to check the loader/forward on unfamiliar shapes.
"""
import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (reuses its kernel blocking, init rules and reference helpers)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,  # noqa: E402
                          Qwen3_5MoeForConditionalGeneration)

VOCAB = 777
L, F = "linear_attention", "full_attention"


def moe_text():
    t = copy.deepcopy(mf.MOE_TEXT)
    t.update(vocab_size=VOCAB, hidden_size=96, num_hidden_layers=4, layer_types=[F, L, L, F],
             num_attention_heads=6, num_key_value_heads=3, head_dim=48, linear_num_key_heads=3,
             linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=16, num_experts=6,
             num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=36,
             partial_rotary_factor=0.5)
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000, "partial_rotary_factor": 0.5,
                            "mrope_section": [4, 4, 4], "mrope_interleaved": True}
    return t


def dense_text():
    t = copy.deepcopy(mf.DENSE_TEXT)
    t.update(vocab_size=VOCAB, hidden_size=80, intermediate_size=120, num_hidden_layers=5,
             layer_types=[L, L, F, L, F], num_attention_heads=2, num_key_value_heads=2, head_dim=40,
             linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=20,
             linear_value_head_dim=28, partial_rotary_factor=0.25)
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 2, 1], "mrope_interleaved": True}
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    rng = np.random.RandomState(4242)
    prompts = {"p9": [int(x) for x in rng.randint(0, VOCAB, size=9)],
               "p131": [int(x) for x in rng.randint(0, VOCAB, size=131)]}
    for name, cfg_cls, cls, text, vision in (
            ("moe", Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, moe_text(), "qwen3_5_moe_vision"),
            ("dense", Qwen3_5Config, Qwen3_5ForConditionalGeneration, dense_text(), "qwen3_5_vision")):
        torch.manual_seed(99)
        outer = mf.outer_config("qwen3_5_moe" if name == "moe" else "qwen3_5", text, vision)
        model = cls(cfg_cls.from_dict(outer))
        mf.init_text_weights(model, 777)
        model = model.to(torch.bfloat16).eval()
        d = os.path.join(args.out, name)
        model.save_pretrained(d)  # transformers' default layout
        reloaded, _ = mf.load_reloaded(cls, d)
        ref = {}
        for pname, ids in prompts.items():
            np.save(os.path.join(d, f"ref_{pname}.npy"), mf.forward_logits(reloaded, ids).numpy())
            greedy, margins = mf.greedy_recompute(reloaded, ids, 12)
            ref[pname] = {"prompt": ids, "greedy": greedy, "min_margin": min(margins)}
        with open(os.path.join(d, "unseen_reference.json"), "w") as f:
            json.dump(ref, f)
        print(name, "done", {k: v["greedy"][:4] for k, v in ref.items()})


if __name__ == "__main__":
    main()
