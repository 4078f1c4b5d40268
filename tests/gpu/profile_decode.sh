#!/usr/bin/env bash
# Per-kernel profile of decode steps on a GPU machine (Nsight Compute, hardware counters; the clocks
# are left alone): tests/gpu/profile_decode.sh BIN_DIR [LAYERS]
# Runs `sparkserve bench --synth qwen3.5-122b-a10b` with LAYERS decoder layers (default 4: three GDN
# layers and one attention layer, the 122B's repeating unit) and the full vocabulary, op by op
# (graphs off, branches in order, so every kernel is one row), and writes every kernel's duration,
# DRAM bytes and grid to $OUT/ncu.log (raw CSV); tests/gpu/ncu_summary.py turns the last decode step into a
# table (kernel, µs, MB, GB/s). Kernel times under ncu are serialised, caches flushed before each:
# the sum is the step's kernel time without launch gaps or overlap.
set -uo pipefail
BIN=$1
LAYERS=${2:-4}
LOG=${OUT:-/tmp/profile-decode-out}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=$PWD/$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
timeout 300 "$NCU" --clock-control none \
  --kernel-name regex:'^(?!synth_fill|add_kernel)' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
  --csv --page raw --log-file "$LOG/ncu.log" \
  "$BIN/sparkserve" bench --no-graphs --sequential-branches --synth qwen3.5-122b-a10b --layout "${LAYOUT:-nvfp4-fp8dense}" --layers "$LAYERS" \
  --batches "${BATCH:-1}" --prompt-lens 8 --contexts 0 --decode-steps 2 >"$LOG/bench.txt" 2>"$LOG/bench.stderr"
echo "ncu rc=$?"
python3 "$(dirname "$0")/ncu_summary.py" "$LOG/ncu.log"
