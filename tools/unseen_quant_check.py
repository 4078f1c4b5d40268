#!/usr/bin/env python3
"""Quantized Qwen3.5 checkpoints this project has never seen (issue 4, "Done when": "the same holds for quantized
checkpoints this project has not seen"), with compressed-tensors reference logits.

Same pipeline as tools/make_quant_fixtures.py (the real compressed-tensors library quantizes and packs; transformers
with compressed-tensors' own quantize-dequantize forward, in float32 on the CPU, gives the reference logits), but:
  - NEW dimensions: hidden 80, GDN 2 key heads x dk 16 -> 6 value heads x dv 16 (conv dim 160), attention 4 heads /
    2 KV heads x head_dim 48 (partial RoPE 0.5 -> mrope_section [4, 4, 4], rope_theta 5e6), 6 experts top-2,
    moe_intermediate 32, shared expert 48, 4 layers [L, L, F, L], vocab 250 (small, so that each folder stays
    under 1 MB and can be committed as a fixture);
  - NEW seeds (weights 5151, calibration 5152, prompts 5153, MTP 5154);
  - prompts of 7 and 80 tokens (80 crosses the 64-token GDN chunk).
Layouts: nvfp4, nvfp4-fp8dense, fp8 (compressed-tensors) and modelopt-nvfp4 (the nvfp4 tensors in ModelOpt's layout,
round-tripped through compressed-tensors' ModelOptNvfp4Converter), exactly the recipes of make_quant_fixtures.py.

Each folder gets config.json (+ hf_quant_config.json), model.safetensors, logits_<prompt>.npy and
unseen_reference.json (prompts, greedy ids, margins, versions). 0.6-1 MB each.

    /tmp/oracle-venv/bin/python tools/unseen_quant_check.py --out /tmp/unseen-quant
    python3 tools/compare_unseen_quant.py /tmp/unseen-quant      # runs `sparkserve logits`, prints the numbers
"""
import argparse
import copy
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_quant_fixtures as mqf  # noqa: E402  (imports make_fixtures: blocks the optional kernel packages)
import make_fixtures as mf  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import compressed_tensors  # noqa: E402
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration  # noqa: E402

VOCAB = 250
SEED = 5151
L, F = "linear_attention", "full_attention"
PROMPTS = [("p7", 7), ("p80", 80)]
GREEDY_TOKENS = 8


def unseen_text():
    t = copy.deepcopy(mf.MOE_TEXT)
    t.update(vocab_size=VOCAB, hidden_size=80, num_hidden_layers=4, layer_types=[L, L, F, L],
             num_attention_heads=4, num_key_value_heads=2, head_dim=48, linear_num_key_heads=2,
             linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=6,
             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             partial_rotary_factor=0.5)
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000000, "partial_rotary_factor": 0.5,
                            "mrope_section": [4, 4, 4], "mrope_interleaved": True}
    return t


def build_bf16_model(text):
    torch.manual_seed(SEED)
    cfg = Qwen3_5MoeConfig.from_dict(mf.outer_config("qwen3_5_moe", text, "qwen3_5_moe_vision"))
    model = Qwen3_5MoeForConditionalGeneration(cfg)
    mf.init_text_weights(model, SEED)
    model = model.to(torch.bfloat16).eval()
    mqf.linearize_experts(model, copy_weights=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", default="nvfp4,nvfp4-fp8dense,fp8,modelopt-nvfp4")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    text = unseen_text()
    # make_quant_fixtures' writer takes the MTP shapes and seed from these module globals.
    mqf.QTEXT = text
    mqf.SEED = SEED + 1  # write_ct_checkpoint: make_mtp_tensors(QTEXT, mqf.SEED + 2) -> MTP seed 5154
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    prng = np.random.RandomState(SEED + 2)
    prompts = [(name, [int(x) for x in prng.randint(0, VOCAB, size=n)]) for name, n in PROMPTS]
    crng = np.random.RandomState(SEED + 1)
    calib = [[int(x) for x in crng.randint(0, VOCAB, size=mqf.CALIB_LEN)] for _ in range(mqf.CALIB_PROMPTS)]
    for layout in args.layouts.split(","):
        t0 = time.time()
        folder = os.path.join(out_root, "unseen-quant-" + layout)
        extra = {}
        if layout == "modelopt-nvfp4":
            src = os.path.join(out_root, "unseen-quant-nvfp4")
            mo = mqf.write_modelopt(src, folder)
            tensors, extra["modelopt_roundtrip"] = mqf.modelopt_roundtrip(mo, mqf.load_tensors(src))
            qconfig = json.load(open(os.path.join(src, "config.json")))["quantization_config"]
        else:
            model = build_bf16_model(text)
            notes = mqf.write_ct_checkpoint(model, layout, folder, calib)
            extra["calibration_fp4_modules"] = notes["calibration"]["fp4_modules"]
            extra["calibration_fp8_modules"] = notes["calibration"]["fp8_modules"]
            del model
            tensors = mqf.load_tensors(folder)
            qconfig = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
        model = mqf.load_reference_model(folder, qconfig, tensors)
        ref = {"layout": layout, "prompts": [], "extra": extra,
               "generated_by": {"script": "tools/unseen_quant_check.py",
                                "command": f"python tools/unseen_quant_check.py --out OUT --threads {args.threads}",
                                "compressed_tensors": compressed_tensors.__version__,
                                "transformers": transformers.__version__, "torch": torch.__version__,
                                "python": platform.python_version(), "seed": SEED,
                                "per_token_fix_modules": len(mqf.PER_TOKEN_FIX)},
               "reference_compute": "as tools/make_quant_fixtures.py load_reference_model (float32, CPU, "
                                    "compressed-tensors fake-quant forward, use_cache=False)"}
        mqf.PER_TOKEN_FIX.clear()
        for pname, ids in prompts:
            logits = mqf.forward_logits(model, ids)
            np.save(os.path.join(folder, f"logits_{pname}.npy"), logits.numpy().astype("<f4"))
            g, margins = mqf.greedy(model, ids, GREEDY_TOKENS)
            ref["prompts"].append({"name": pname, "prompt_ids": ids, "logits_file": f"logits_{pname}.npy",
                                   "greedy_ids": g, "greedy_top1_top2_margins": margins})
        base = [(p, ids, torch.from_numpy(np.load(os.path.join(folder, f"logits_{p}.npy")))) for p, ids in prompts]
        ref["weight_only_vs_reference"] = {p: mqf.weight_only_logits_diff(model, ids, lg) for p, ids, lg in base}
        # How far the reference itself moves when every quantized Linear's input is perturbed by one float32
        # rounding (2^-24) or sixteen (2^-20): the size of a legitimate activation-quantization flip.
        ref["perturbation"] = mqf.perturbation_study(model, base)
        with open(os.path.join(folder, "unseen_reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        size = sum(os.path.getsize(os.path.join(folder, x)) for x in os.listdir(folder))
        print(json.dumps({"folder": os.path.basename(folder), "seconds": round(time.time() - t0, 1),
                          "MB": round(size / 1e6, 3), "greedy": {p["name"]: p["greedy_ids"] for p in ref["prompts"]}}),
              flush=True)
        del model


if __name__ == "__main__":
    main()
