#!/usr/bin/env bash
# Runs the GPU tests on a machine with a CUDA device, from the repository root:
#   tests/gpu/run_gpu_tests.sh [BIN_DIR]     (BIN_DIR holds sparkserve and gpu_ops; default build)
# 1. gpu_ops: every CUDA op vs the CPU backend on fresh random inputs, and the fixture model checks
#    (logits vs transformers and vs CPU, cached decode, prefill+decode == recompute, batched == alone).
# 2. The CLI end to end: `sparkserve logits --device cuda` vs `--device cpu` vs the reference .npy for
#    every fixture prompt (bound max|d|/max|ref| <= 1e-4, tests/python/test_model_reference.py's fp32
#    bound), and `generate --device cuda` reproducing the reference greedy ids exactly.
# Logs go to $OUT (or /tmp/gpu-test-out); the last lines printed are a short table.
set -uo pipefail
BIN=${1:-build}
LOG=${OUT:-/tmp/gpu-test-out}
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

"$BIN/gpu_ops" >"$LOG/gpu_ops.log" 2>&1
rc_ops=$?

PY=python3
SPARKSERVE_BIN="$BIN/sparkserve" LOG="$LOG" $PY - <<'PYEOF' >"$LOG/cli.log" 2>&1
import json, os, pathlib, subprocess, sys, tempfile
import numpy as np
bin_ = os.environ["SPARKSERVE_BIN"]
tmp = pathlib.Path(tempfile.mkdtemp())
fails = 0
worst_ref = worst_cpu = 0.0
n = 0
def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))
def logits(fx, ids, dev):
    out = tmp / f"{dev}.npy"
    p = subprocess.run([bin_, "logits", "--model", str(fx), "--prompt-ids", ",".join(map(str, ids)),
                        "--out", str(out), "--device", dev], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stderr); return None
    return np.load(out)
for fx in sorted(pathlib.Path("tests/fixtures").glob("qwen35-*/reference.json")):
    fx = fx.parent
    ref = json.loads((fx / "reference.json").read_text())
    for pr in ref["prompts"]:
        n += 1
        r = np.load(fx / pr["logits_file"])
        g = logits(fx, pr["prompt_ids"], "cuda")
        c = logits(fx, pr["prompt_ids"], "cpu")
        if g is None or c is None or g.shape != r.shape:
            fails += 1; print("FAIL", fx.name, pr["name"], "logits run"); continue
        if "quant" in fx.name:
            # W4A4 / W8A8 quantization is discontinuous (see gpu_ops' test_quant_model): row 0 <= 1e-4 and
            # rows 0-4 <= 1e-3 vs the CPU backend, flipped rows (> 1e-4) counted; no greedy-exact check.
            d = np.max(np.abs(g.astype(np.float64) - c), axis=1) / np.max(np.abs(c))
            flips = int(np.sum(d > 1e-4))
            ok = d[0] <= 1e-4 and np.max(d[:5]) <= 1e-3
            fails += not ok
            print(f"{'ok' if ok else 'FAIL'} {fx.name}/{pr['name']}: cuda vs cpu row0 {d[0]:.3e}, rows0-4 {np.max(d[:5]):.3e}, "
                  f"{flips}/{len(d)} rows over 1e-4, cuda vs ref row0 {rel(g[:1], r[:1]):.3e}")
            continue
        e_ref, e_cpu = rel(g, r), rel(g, c)
        worst_ref, worst_cpu = max(worst_ref, e_ref), max(worst_cpu, e_cpu)
        p = subprocess.run([bin_, "generate", "--model", str(fx), "--prompt-ids", ",".join(map(str, pr["prompt_ids"])),
                            "--max-tokens", str(len(pr["greedy_ids"])), "--ignore-eos", "--json", "--device", "cuda"],
                           capture_output=True, text=True, timeout=600)
        ok_gen = p.returncode == 0 and json.loads(p.stdout)["output_ids"] == pr["greedy_ids"]
        ok = e_ref <= 1e-4 and e_cpu <= 1e-4 and ok_gen
        fails += not ok
        print(f"{'ok' if ok else 'FAIL'} {fx.name}/{pr['name']}: cuda vs ref {e_ref:.3e}, cuda vs cpu {e_cpu:.3e}, greedy {'exact' if ok_gen else 'DIFFERENT'}")
print(f"CLI_SUMMARY prompts={n} failed={fails} worst_vs_ref={worst_ref:.3e} worst_vs_cpu={worst_cpu:.3e}")
sys.exit(1 if fails else 0)
PYEOF
rc_cli=$?

echo "---- gpu_ops (per check: $LOG/gpu_ops.log) ----"
grep -E "^FAIL" "$LOG/gpu_ops.log" | head -20
sed -n '/^group /,$p' "$LOG/gpu_ops.log"
echo "---- CLI end to end ($LOG/cli.log) ----"
grep -E "^FAIL" "$LOG/cli.log" | head -20
tail -1 "$LOG/cli.log"
echo "RESULT gpu_ops=$([ $rc_ops = 0 ] && echo PASS || echo "FAIL($rc_ops)") cli=$([ $rc_cli = 0 ] && echo PASS || echo "FAIL($rc_cli)")"
[ $rc_ops = 0 ] && [ $rc_cli = 0 ]
