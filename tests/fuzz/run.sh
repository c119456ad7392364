#!/usr/bin/env bash
# Runs every libFuzzer target from its seed corpus for a bounded time; exits 1
# if any finds a crash, a leak, undefined behaviour or a timeout. `make fuzz`
# builds the targets (clang, ASan+UBSan; CMake preset `asan`, the tree that
# also holds the ASan test suite) and calls this.
#
# Usage: tests/fuzz/run.sh [BUILD_DIR]    (default build-asan)
#   FUZZ_SECONDS  time per target (default 60)
#   FUZZ_JOBS     targets run at once (default: the number of cores)
#
# Target NAME_fuzz starts from tests/fuzz/corpus/NAME, which it only reads:
# the inputs it adds go to BUILD_DIR/fuzz-run/corpus/NAME, its log to
# BUILD_DIR/fuzz-run/NAME.log, and a finding to BUILD_DIR/fuzz-run/findings/.
# Every seed is replayed first, so a finding copied into the corpus (after
# the fix) is a regression test from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build-asan}
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
out="$build/fuzz-run"

names=()
for dir in tests/fuzz/corpus/*/; do
  name=$(basename "$dir")
  if [ ! -x "$build/tests/fuzz/${name}_fuzz" ]; then
    echo "fuzz: $build/tests/fuzz/${name}_fuzz: not built (corpus tests/fuzz/corpus/$name has no target); run make fuzz" >&2
    exit 1
  fi
  names+=("$name")
done
for exe in "$build"/tests/fuzz/*_fuzz; do
  name=$(basename "$exe" _fuzz)
  if [ ! -d "tests/fuzz/corpus/$name" ]; then
    echo "fuzz: $exe has no seed corpus tests/fuzz/corpus/$name" >&2
    exit 1
  fi
done

rm -rf "$out"
mkdir -p "$out/findings"
echo "fuzz: ${#names[@]} targets x ${seconds} s, ${jobs} at a time"
run_one() {
  local name=$1
  mkdir -p "$out/corpus/$name"
  local start=$SECONDS rc=0
  "$build/tests/fuzz/${name}_fuzz" "$out/corpus/$name" "tests/fuzz/corpus/$name" \
    -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 \
    -artifact_prefix="$out/findings/$name-" -print_final_stats=1 >"$out/$name.log" 2>&1 || rc=$?
  local runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/$name.log" | grep -o '[0-9]*$' || echo '?')
  echo "$rc" >"$out/$name.rc"
  printf 'fuzz: %-16s %s  %s inputs in %d s\n' "$name" "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)")" \
    "$runs" $((SECONDS - start))
}
export -f run_one
export build out seconds
printf '%s\n' "${names[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}

failed=0
for name in "${names[@]}"; do
  if [ "$(cat "$out/$name.rc")" != 0 ]; then
    failed=1
    echo "---- $name: the end of $out/$name.log" >&2
    tail -n 60 "$out/$name.log" >&2
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "fuzz: findings in $out/findings/ (reproduce: $build/tests/fuzz/NAME_fuzz FILE). Once fixed, copy the" >&2
  echo "      input into tests/fuzz/corpus/NAME/ under a name that says what it caught; every run replays it." >&2
  ls -l "$out/findings" >&2
  exit 1
fi
echo "fuzz: no findings"
