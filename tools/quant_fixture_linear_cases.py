#!/usr/bin/env python3
"""Add single-Linear reference cases to the quantized fixtures (tests/fixtures/qwen35-quant-*).

End-to-end W4A4 / W8A8 logits are discontinuous in the input (a 1-ulp change of one activation can move one code
across a rounding threshold, and the change cascades; see reference.json checks.perturbation), so they cannot hold
a tight bound. A single quantized Linear on a GIVEN input can: for a few modules per fixture this script stores the
input x (captured from the reference forward of the `medium` prompt, first <= 32 rows), and compressed-tensors'
fake-quant output y = module(x) of the reference model built by make_quant_fixtures.load_reference_model from the
checkpoint on disk, plus an independent emulation from the format documents (make_quant_fixtures.emulate_linear).

  linear_<k>_input.npy   [n, K] float32      linear_<k>_output.npy  [n, N] float32
  reference.json -> "linear_cases": [{module, format, input_file, output_file, shapes, emulation diff}]

It also records transformers' own loading of each compressed-tensors folder (from_pretrained, compressed-tensors
integration) against the reference, for information ("transformers_crosscheck").

    python3 tools/quant_fixture_linear_cases.py tests/fixtures
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_quant_fixtures as q  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import compressed_tensors  # noqa: E402

ROWS = 32


def crosscheck(folder, ids, base):
    try:
        m = q.Qwen3_5MoeForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
        hq = getattr(m, "hf_quantizer", None)
        if hq is not None and hasattr(m, "ct_decompress_hook"):
            hq.compressor.decompress_model(m)
        cast = 0
        for p in m.parameters():
            if p.dtype == torch.bfloat16:  # compressed-tensors decompresses to BF16
                p.data = p.data.float()
                cast += 1
        m.eval()
        got = q.forward_logits(m, ids)
        return {"call": "Qwen3_5MoeForConditionalGeneration.from_pretrained(folder, dtype=float32, "
                        "attn_implementation='eager', experts_implementation='eager'), compressor.decompress_model, "
                        "BF16 parameters cast to float32",
                "bf16_params_cast": cast, "prompt": "short",
                "max_abs_diff_vs_reference": float((got - base).abs().max()),
                "max_abs_reference": float(base.abs().max()),
                "argmax_equal_rows": int((got.argmax(-1) == base.argmax(-1)).sum()), "rows": int(base.shape[0])}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}


def main():
    root = sys.argv[1]
    torch.set_num_threads(2)
    for layout in ["nvfp4", "nvfp4-fp8dense", "fp8", "modelopt-nvfp4"]:
        folder = os.path.join(root, "qwen35-quant-" + layout)
        ref_path = os.path.join(folder, "reference.json")
        ref = json.load(open(ref_path))
        if layout == "modelopt-nvfp4":
            src = os.path.join(root, "qwen35-quant-nvfp4")
            tensors, _ = q.modelopt_roundtrip(q.load_tensors(folder), q.load_tensors(src))
            qc = json.load(open(os.path.join(src, "config.json")))["quantization_config"]
        else:
            tensors = q.load_tensors(folder)
            qc = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
        model = q.load_reference_model(folder, qc, tensors)
        mods = dict(model.named_modules())
        names = q.VERIFY_MODULES[layout]
        seen = {}
        hooks = []
        for name in names:
            def hook(mod, args, out, name=name):
                if name not in seen:
                    seen[name] = args[0].detach().reshape(-1, args[0].shape[-1])[:ROWS].clone()
            hooks.append(mods[name].register_forward_hook(hook))
        medium = [p for p in ref["prompts"] if p["name"] == "medium"][0]["prompt_ids"]
        q.forward_logits(model, medium)
        for h in hooks:
            h.remove()
        cases = []
        for k, name in enumerate(names):
            x = seen[name]
            with torch.no_grad():
                y = mods[name](x)  # the wrapped forward: compressed-tensors fake-quant of x, dequantized weight
            prefix = name + "."
            y_emul, y_wo, _ = q.emulate_linear(tensors, prefix, x)
            np.save(os.path.join(folder, f"linear_{k}_input.npy"), x.numpy().astype("<f4"))
            np.save(os.path.join(folder, f"linear_{k}_output.npy"), y.numpy().astype("<f4"))
            cases.append({"module": name, "format": "nvfp4" if prefix + "weight_packed" in tensors else "fp8",
                          "input_file": f"linear_{k}_input.npy", "output_file": f"linear_{k}_output.npy",
                          "input_shape": list(x.shape), "output_shape": list(y.shape),
                          "max_abs_output": float(y.abs().max()),
                          "emulation_max_abs_diff": float((y_emul - y).abs().max()),
                          "weight_only_max_abs_diff": float((y_wo - y).abs().max())})
        ref["linear_cases"] = cases
        ref["linear_cases_generated_by"] = {
            "script": "tools/quant_fixture_linear_cases.py", "command": "python3 tools/quant_fixture_linear_cases.py "
            "tests/fixtures", "compressed_tensors": compressed_tensors.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "note": "run on the development CPU machine (not the GPU machine) from the committed checkpoints; the "
                    "input rows come from this machine's reference forward of the medium prompt"}
        if layout != "modelopt-nvfp4":
            short = [p for p in ref["prompts"] if p["name"] == "short"][0]
            base = torch.from_numpy(np.load(os.path.join(folder, short["logits_file"])))
            ref["checks"]["transformers_from_pretrained_crosscheck_short"] = crosscheck(
                folder, short["prompt_ids"], base)
        ref["tensors"] = q.mf.folder_tensors(folder)
        with open(ref_path, "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        print(layout, json.dumps(cases)[:1500], ref["checks"].get("transformers_from_pretrained_crosscheck_short"),
              flush=True)


if __name__ == "__main__":
    main()
