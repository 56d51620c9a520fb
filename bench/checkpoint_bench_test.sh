#!/bin/bash
# checkpoint_bench end to end on a small generated checkpoint pair: it checks the rebuild,
# reports the medians (and with --scaling the one-thread timings and the speed-up) and
# removes its temporary directory.
# Usage: checkpoint_bench_test.sh CHECKPOINT_BENCH ARC_BENCH
set -u
BENCH="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
GEN="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
expect_rc() {  # expect_rc CODE COMMAND...
  local want="$1"; shift
  "$@" > out.txt 2> err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat out.txt err.txt; fail "'$*' exited $rc, want $want"; }
}

expect_rc 0 "$GEN" --params 200000 --deltas 1 --regimes low --save-generated gen --generate-only
prev=gen/gen_low/step_000.safetensors next=gen/gen_low/step_001.safetensors
mkdir tmp
expect_rc 0 env TMPDIR="$T/tmp" "$BENCH" -r 2 --no-sync "$prev" "$next"
grep -q "rebuilt checkpoint identical" out.txt || { cat out.txt; fail "bench checks the rebuild"; }
expect_rc 0 env TMPDIR="$T/tmp" "$BENCH" -r 3 -T 2 --scaling --json --no-sync "$prev" "$next"
for key in '"identical": true' '"threads": 2' '"one_thread": {' '"diff_speedup": ' '"repeats": 3'; do
  grep -q "$key" out.txt || { cat out.txt; fail "--scaling --json lacks $key"; }
done
expect_rc 2 "$BENCH" -T 1 --scaling "$prev" "$next"
# A NEXT that is not PREV's successor's rebuild: a corrupt copy is an error, not a result.
expect_rc 1 env TMPDIR="$T/tmp" "$BENCH" -r 1 --no-sync "$prev" /nonexistent.safetensors
[ -z "$(ls -A tmp)" ] || fail "bench left files in TMPDIR: $(ls tmp)"
echo "PASS"
