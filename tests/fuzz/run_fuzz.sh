#!/usr/bin/env bash
# Builds every tests/fuzz/fuzz_*.cpp as a libFuzzer binary (clang, ASan + UBSan) and runs each
# for a few seconds from its committed seed corpus. Exits non-zero when a target fails to build
# or finds a crash, leak, sanitizer error or timeout (the reproducer is kept under
# $BUILD/artifacts/).
#
#   tests/fuzz/run_fuzz.sh [SECONDS_PER_TARGET]      (default 20; env FUZZ_SECONDS also works)
#   FUZZ_RUNS=1000000 tests/fuzz/run_fuzz.sh 3600   (each target until 1M executions; the seconds
#                                                    are then a cap, 0 = none, and a target that
#                                                    hits the cap first fails the run)
#   env: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (build parallelism, default nproc),
#        FUZZ_TARGETS (space-separated subset to run), CXX (a clang++ to use),
#        FUZZ_EXCLUDE (regex of src/ paths to leave out of the build, for a file clang rejects)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECS="${1:-${FUZZ_SECONDS:-20}}"
RUNS="${FUZZ_RUNS:-}"
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${FUZZ_JOBS:-$(nproc)}"

# --- toolchain: clang + the compiler-rt runtime that holds libFuzzer and the sanitizers ---------
pick_clang() {
  if [[ -n "${CXX:-}" ]] && "$CXX" --version 2>/dev/null | grep -q clang; then echo "$CXX"; return; fi
  for c in clang++ clang++-14 clang++-15 clang++-16; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi
  done
}
has_libfuzzer() {
  # A tiny program linked with -fsanitize=fuzzer proves the runtime is installed.
  local cxx="$1" tmp
  tmp="$(mktemp -d)"
  printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t){return 0;}\n' > "$tmp/t.cpp"
  "$cxx" -fsanitize=fuzzer,address,undefined "$tmp/t.cpp" -o "$tmp/t" >/dev/null 2>&1
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
CLANGXX="$(pick_clang || true)"
if [[ -z "$CLANGXX" ]] || ! has_libfuzzer "$CLANGXX"; then
  echo "run_fuzz: installing clang and libFuzzer (Debian packages clang, libclang-rt-dev)"
  SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  # Debian 12 names the runtime libclang-rt-14-dev; the unversioned name is tried first.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null 2>&1 ||
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-14 libclang-rt-14-dev
  CLANGXX="$(pick_clang)"
  has_libfuzzer "$CLANGXX" || { echo "run_fuzz: $CLANGXX cannot link -fsanitize=fuzzer" >&2; exit 2; }
fi

# --- build -----------------------------------------------------------------------------------
start=$(date +%s)
GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S "$ROOT/tests/fuzz" -B "$BUILD" "${GEN[@]}" -DCMAKE_CXX_COMPILER="$CLANGXX" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARKSERVE_FUZZ_EXCLUDE="${FUZZ_EXCLUDE:-}" >/dev/null
build_ok=1
# Keep going past a target that fails to build so the others still run (the run still fails).
KEEP=(-k); [[ ${#GEN[@]} -gt 0 ]] && KEEP=(-k 0)
cmake --build "$BUILD" -j "$JOBS" -- "${KEEP[@]}" || build_ok=0
built=$(date +%s)
echo "run_fuzz: build took $((built - start)) s"

# --- run -------------------------------------------------------------------------------------
mapfile -t TARGETS < <(if [[ -n "${FUZZ_TARGETS:-}" ]]; then tr ' ' '\n' <<<"$FUZZ_TARGETS" | grep .; else cat "$BUILD/fuzz_targets.txt"; fi)
mkdir -p "$BUILD/artifacts"
failed=()
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
for t in "${TARGETS[@]}"; do
  bin="$BUILD/$t"
  [[ -x "$bin" ]] || { echo "run_fuzz: $t was not built" >&2; failed+=("$t"); continue; }
  seeds="$ROOT/tests/fuzz/corpus/$t"
  work="$BUILD/corpus/$t"          # new inputs land here, never in the repository
  mkdir -p "$work"
  args=(-max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=0
        -artifact_prefix="$BUILD/artifacts/$t-")
  [[ -n "$RUNS" ]] && args+=(-runs="$RUNS")
  [[ -f "$ROOT/tests/fuzz/$t.dict" ]] && args+=(-dict="$ROOT/tests/fuzz/$t.dict")
  dirs=("$work"); [[ -d "$seeds" ]] && dirs+=("$seeds")
  if [[ -n "$RUNS" ]]; then echo "run_fuzz: $t for $RUNS runs (cap ${SECS}s)"; else echo "run_fuzz: $t for ${SECS}s"; fi
  if ! "$bin" "${args[@]}" "${dirs[@]}" >"$BUILD/$t.log" 2>&1; then
    echo "run_fuzz: $t FAILED; log: $BUILD/$t.log" >&2
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$BUILD/$t.log" | head -20 >&2 || true
    failed+=("$t")
    continue
  fi
  # libFuzzer's last status line holds the coverage; "Done N runs in T second(s)" the totals.
  done_line="$(grep -E "^Done [0-9]+ runs" "$BUILD/$t.log" | tail -1 || true)"
  cov="$(grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+" "$BUILD/$t.log" | tail -1 || true)"
  echo "run_fuzz: $t: ${done_line:-no Done line} ($cov)"
  executed="$(sed -E 's/^Done ([0-9]+) runs.*/\1/' <<<"$done_line")"
  if [[ -n "$RUNS" && "${executed:-0}" -lt "$RUNS" ]]; then
    echo "run_fuzz: $t stopped at ${executed:-0} of $RUNS runs (time cap ${SECS}s)" >&2
    failed+=("$t(short)")
  fi
done
end=$(date +%s)
echo "run_fuzz: ${#TARGETS[@]} targets, ${RUNS:+$RUNS runs or }${SECS}s each; total $((end - start)) s (build $((built - start)) s)"
((build_ok)) || failed+=("(build)")
if ((${#failed[@]})); then
  echo "run_fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "run_fuzz: all targets clean"
