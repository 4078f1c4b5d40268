"""Compares sparkserve with the references written by tools/unseen_checkpoint_check.py.
Usage: python tools/compare_unseen.py --bin build/sparkserve DIR [DIR ...]"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("dirs", nargs="+")
a = ap.parse_args()
ok = True
for d in a.dirs:
    ref = json.load(open(os.path.join(d, "unseen_reference.json")))
    for name, r in ref.items():
        ids = ",".join(map(str, r["prompt"]))
        with tempfile.TemporaryDirectory() as t:
            out = os.path.join(t, "l.npy")
            subprocess.run([a.bin, "logits", "--model", d, "--prompt-ids", ids, "--out", out], check=True)
            got, want = np.load(out), np.load(os.path.join(d, f"ref_{name}.npy"))
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        g = json.loads(subprocess.run([a.bin, "generate", "--model", d, "--prompt-ids", ids, "--max-tokens",
                                       str(len(r["greedy"])), "--ignore-eos", "--json"], check=True,
                                      capture_output=True, text=True).stdout)
        same = g["output_ids"] == r["greedy"]
        ok &= rel <= 1e-3 and same
        print(f"{d} {name}: max|d|/max|ref| = {rel:.2e}, greedy {'identical' if same else 'DIFFERENT'} "
              f"(min top-2 margin {r['min_margin']:.4f})")
print("ALL OK" if ok else "MISMATCH")
