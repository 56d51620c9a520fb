#!/bin/bash
# Runs one fuzz target built by build.sh on its working corpus ($OUT/live/TARGET, seeded
# from the committed replay corpus tests/fuzz/corpus/TARGET and $OUT/seeds/TARGET if
# present). Crashes land in $OUT/crashes/TARGET/.
#   tests/fuzz/run.sh decode -runs=1000000        (any libFuzzer flags)
#   tests/fuzz/run.sh roundtrip -max_total_time=600
#   ARC_V3_FUZZ_FAST=1 tests/fuzz/run.sh decode ...   the throughput build (build.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${ARC_V3_FUZZ_FAST:-}" ]]; then
  OUT="${ARC_V3_FUZZ_OUT:-/tmp/arc_v3_fuzz_fast}"
else
  OUT="${ARC_V3_FUZZ_OUT:-/tmp/arc_v3_fuzz}"
fi
target="$1"
shift
mkdir -p "$OUT/live/$target" "$OUT/crashes/$target"
dirs=("$OUT/live/$target")
[[ -d "tests/fuzz/corpus/$target" ]] && dirs+=("tests/fuzz/corpus/$target")
[[ -d "$OUT/seeds/$target" ]] && dirs+=("$OUT/seeds/$target")
exec "$OUT/fuzz_$target" -max_len=16384 -print_final_stats=1 \
  -artifact_prefix="$OUT/crashes/$target/" "$@" "${dirs[@]}"
