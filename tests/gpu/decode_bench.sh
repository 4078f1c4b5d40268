#!/usr/bin/env bash
# Decode-kernel iteration on a GPU machine, from the repository root (docs/performance.md,
# "Decode kernels"):  tests/gpu/decode_bench.sh BIN_DIR [ops|bench|slice]...
#   ops    gpu_ops --ops-only (every op vs the CPU backend, the decode GEMV / MoE checks included)
#   full   tests/gpu/run_gpu_tests.sh (gpu_ops ops + fixture models, and the CLI end to end)
#   bench  gpu_ops --bench-kernels (per-kernel GB/s at the 122B shapes vs copy bandwidth; BENCH_FILTER=moe
#          runs only the cases whose name contains it, e.g. the MoE with its per-launch split)
#   slice  `sparkserve bench --synth` of the whole qwen3.5-122b-a10b (LAYOUT, default nvfp4-fp8dense),
#          CUDA graphs on (batches 1, 4, 16) and off (batch 1)
# Logs go to $OUT (or /tmp/decode-bench-out); the last lines printed are a short summary.
set -uo pipefail
BIN=$1
shift
LOG=${OUT:-/tmp/decode-bench-out}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=$PWD/$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
summary=()
for step in "$@"; do
  case $step in
    ops)
      timeout 120 "$BIN/gpu_ops" --ops-only >"$LOG/ops.log" 2>&1
      summary+=("ops rc=$? $(tail -1 "$LOG/ops.log")")
      ;;
    full)
      timeout 240 tests/gpu/run_gpu_tests.sh "$BIN" >"$LOG/full.log" 2>&1
      summary+=("full rc=$? $(tail -1 "$LOG/full.log")")
      cp "$LOG/gpu_ops.log" "$LOG/ops.log" 2>/dev/null
      ;;
    bench)
      timeout 90 "$BIN/gpu_ops" --bench-kernels ${BENCH_FILTER:+--bench-filter "$BENCH_FILTER"} >"$LOG/bench.log" 2>&1
      summary+=("bench rc=$?")
      ;;
    slice)
      # The whole model (48 layers) with random weights generated in GPU memory (`bench --synth`).
      timeout 150 "$BIN/sparkserve" bench --synth qwen3.5-122b-a10b --layout "${LAYOUT:-nvfp4-fp8dense}" \
        --batches 1,4,16 --prompt-lens 64 --decode-steps 16 >"$LOG/slice.log" 2>&1
      summary+=("slice rc=$?")
      if [ -n "${NVFP4:-}" ]; then
        timeout 60 "$BIN/sparkserve" bench --synth qwen3.5-122b-a10b --layout nvfp4 --batches 1 --prompt-lens 16 \
          --decode-steps 8 >"$LOG/slice-nvfp4.log" 2>&1
        summary+=("slice-nvfp4 rc=$?")
      fi
      [ -n "${NOGRAPH:-}" ] && timeout 90 "$BIN/sparkserve" bench --no-graphs --synth qwen3.5-122b-a10b \
        --layout "${LAYOUT:-nvfp4-fp8dense}" --batches 1 --prompt-lens 64 --decode-steps 16 >"$LOG/slice-nograph.log" 2>&1
      ;;
  esac
done
echo "==== ops (failures) ===="
[ -f "$LOG/ops.log" ] && { grep -E "^FAIL" "$LOG/ops.log" | head -20; sed -n '/^group /,$p' "$LOG/ops.log"; }
[ -f "$LOG/full.log" ] && grep -A3 -- "---- CLI" "$LOG/full.log" && tail -1 "$LOG/full.log"
echo "==== bench ===="
[ -f "$LOG/bench.log" ] && cat "$LOG/bench.log"
echo "==== slice ===="
[ -f "$LOG/slice.log" ] && tail -25 "$LOG/slice.log"
[ -f "$LOG/slice-nvfp4.log" ] && grep -A2 "^batch" "$LOG/slice-nvfp4.log"
[ -f "$LOG/slice-nograph.log" ] && tail -8 "$LOG/slice-nograph.log"
printf '%s\n' "${summary[@]}"
