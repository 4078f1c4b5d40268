#!/usr/bin/env bash
# `sparkserve bench --synth` on the GPU machine, for docs/performance.md, from the repository root:
#   tests/gpu/bench_synth.sh BIN_DIR LIKE LAYOUT...
# Environment (defaults in brackets): PROMPTS [512,2048,8192,32768], BATCHES [1,4,16,64],
# CONTEXTS [0,8192,32768], STEPS [16], MAX_CASE [30] (seconds; longer cases are skipped),
# BUDGET [150] (seconds per layout, load included; later cases are skipped), LAYERS [model's].
# Writes $OUT/bench-LIKE-LAYOUT.{txt,json}; prints the tables.
set -uo pipefail
BIN=$1; LIKE=$2; shift 2
LOG=${OUT:-/tmp/bench-out}
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
rc=0
for L in "$@"; do
  extra=()
  [ -n "${LAYERS:-}" ] && extra+=(--layers "$LAYERS")
  echo "==== $LIKE $L ($(date -u +%FT%TZ)) ===="
  "$BIN/sparkserve" bench --synth "$LIKE" --layout "$L" --device cuda "${extra[@]}" \
    --prompt-lens "${PROMPTS:-512,2048,8192,32768}" --batches "${BATCHES:-1,4,16,64}" \
    --contexts "${CONTEXTS:-0,8192,32768}" --decode-steps "${STEPS:-16}" --max-case-s "${MAX_CASE:-30}" \
    --time-budget-s "${BUDGET:-150}" --json-out "$LOG/bench-$LIKE-$L.json" 2>&1 | tee "$LOG/bench-$LIKE-$L.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done
exit $rc
