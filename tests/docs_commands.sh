#!/usr/bin/env bash
# The commands the README and docs/ tell a user to run, run as a user would from the
# repository root, each judged by its exit status and by what it promises to write:
#   1. bench/main_job.sh, exactly as the README writes it: its table, bench_out/arc_bench.
#      {json,csv,png} and nothing else there, no work folder left in $TMPDIR;
#   2. the scripts docs/ names: bench/sync_bench.sh, bench/sync_scale.sh (256 shards, its
#      limits asserted: --check), bench/scale_model.py, bench/pull_memory.sh,
#      bench/follow_memory.sh, bench/signing_cost.sh, bench/pull_overlap.sh and
#      bench/cross_region.py (sync.md), bench/region_cache.sh, bench/notify_latency.sh,
#      bench/regions_bench.py (regions.md),
#      arc_bench and checkpoint_bench (bench.md), python/bench/bench_binding.py
#      (python/README.md), each on a small input (their defaults take tens of minutes) and
#      checked for its output files.
# Ends with "N passed, N failed, N skipped". Needs what tests/run_tests.sh installed (the
# Python module for bench_binding.py); cross_region.py needs root (network namespaces).
#   tests/docs_commands.sh
set -uo pipefail
cd "$(dirname "$0")/.."
passed=0
failed=0
skipped=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_docs.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# check NAME COMMAND...: runs COMMAND (output in $logs/NAME.log, its tail shown on failure).
check() {
  local name="$1"; shift
  echo "-- $name: $*"
  local start=$SECONDS
  if "$@" > "$logs/$name.log" 2>&1; then
    echo "   ok ($((SECONDS - start)) s)"
    passed=$((passed + 1))
    return 0
  fi
  echo "   FAILED (exit $?, $((SECONDS - start)) s); the end of its output:"
  tail -n 30 "$logs/$name.log" | sed 's/^/   | /'
  failed=$((failed + 1))
  return 1
}
# expect NAME CONDITION MESSAGE: one assertion on what a command left behind.
expect() {
  if eval "$2"; then
    passed=$((passed + 1))
  else
    echo "   FAILED [$1]: $3"
    failed=$((failed + 1))
  fi
}
temp_leftovers() {
  ls -d "${TMPDIR:-/tmp}"/arc_v3_demo.* "${TMPDIR:-/tmp}"/arc_v3_sync_bench.* "${TMPDIR:-/tmp}"/arc_v3_sync_scale.* \
    "${TMPDIR:-/tmp}"/arc_v3_pull_memory.* "${TMPDIR:-/tmp}"/arc_v3_follow_memory.* \
    "${TMPDIR:-/tmp}"/arc_v3_signing_cost.* "${TMPDIR:-/tmp}"/arc_v3_pull_overlap.* \
    "${TMPDIR:-/tmp}"/arc_v3_region_cache.* \
    "${TMPDIR:-/tmp}"/arc_v3_notify.* "${TMPDIR:-/tmp}"/arc_v3_regions.* \
    2> /dev/null | sort
}

# 1. The main job, as the README's "Two commands" block writes it.
readme_line=$(grep -m1 '^bench/main_job.sh' README.md | sed 's/ *#.*//')
expect readme "[ \"$readme_line\" = bench/main_job.sh ]" "the README's main-job line is '$readme_line'"
before=$(temp_leftovers)
rm -rf bench_out
if check main_job bash -c "$readme_line"; then
  out="$logs/main_job.log"
  expect main_job "grep -q 'both regions hold step 4, bit-identical' '$out'" "the sync demo's regions did not end bit-identical"
  expect main_job "grep -q '^headline' '$out' || grep -qi 'headline' '$out'" "no closing headline table"
  expect main_job "python3 -c 'import json,sys; d=json.load(open(\"bench_out/arc_bench.json\")); sys.exit(not d)'" \
    "bench_out/arc_bench.json is missing or not JSON"
  expect main_job "[ -s bench_out/arc_bench.csv ] && [ -s bench_out/arc_bench.png ]" "bench_out lacks the CSV or the chart"
  expect main_job "[ \"\$(ls bench_out | sort | tr '\n' ' ')\" = 'arc_bench.csv arc_bench.json arc_bench.png ' ]" \
    "bench_out holds $(ls bench_out 2> /dev/null | tr '\n' ' ')"
fi
expect main_job "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left in ${TMPDIR:-/tmp}: $(temp_leftovers)"

# 2. docs/sync.md: what the store costs, and the cross-region benchmark (small runs).
if check sync_bench bench/sync_bench.sh --params 4000000 --repeats 1 --no-sync; then
  expect sync_bench "python3 -c 'import json; json.load(open(\"bench_out/sync_bench.json\"))' && [ -s bench_out/sync_bench.txt ]" \
    "bench_out/sync_bench.{json,txt}"
fi
expect sync_bench "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
# ... and a step's cost at 256 trainer shards (separate publish processes against radosgw),
# with the limits the protocol holds asserted and every pulled tensor compared bit for bit.
check sync_scale bench/sync_scale.sh --shards 256 --check --out bench_out/sync_scale_ci
expect sync_scale "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
# ... what crosses a region's link through the region cache of docs/regions.md (nginx).
if check region_cache bench/region_cache.sh --out bench_out/region_cache_ci.txt; then
  expect region_cache "grep -q '^== documented: PASS' bench_out/region_cache_ci.txt" \
    "bench_out/region_cache_ci.txt: the documented configuration"
fi
# ... the model built on the committed results, and a host's memory at two small sizes.
if check scale_model /usr/bin/python3 bench/scale_model.py --out bench_out/scale_model_ci; then
  expect scale_model "grep -q '^3. Trained -> served' bench_out/scale_model_ci.txt" "bench_out/scale_model_ci.txt"
fi
if check pull_memory bench/pull_memory.sh --params 2000000,4000000 --rows 64 --out bench_out/pull_memory_ci; then
  expect pull_memory "[ \"\$(grep -c ' anchor 0 -> 0 ' bench_out/pull_memory_ci.txt)\" = 4 ]" "bench_out/pull_memory_ci.txt"
fi
expect pull_memory "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
if check follow_memory bench/follow_memory.sh --params 2000000,4000000 --out bench_out/follow_memory_ci; then
  expect follow_memory "[ \"\$(grep -c ' mid ' bench_out/follow_memory_ci.txt)\" = 2 ]" "bench_out/follow_memory_ci.txt"
fi
expect follow_memory "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
if check signing_cost bench/signing_cost.sh --params 2000000 --repeats 1 --out bench_out/signing_cost_ci; then
  expect signing_cost "grep -q '^publish .* 1 ' bench_out/signing_cost_ci.txt && grep -q 'Ed25519 sign' bench_out/signing_cost_ci.txt" \
    "bench_out/signing_cost_ci.txt"
fi
expect signing_cost "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
if check pull_overlap bench/pull_overlap.sh --params 4000000 --shards 4 --repeats 1 --out bench_out/pull_overlap_ci; then
  expect pull_overlap "grep -q '^this build  *8 ' bench_out/pull_overlap_ci.txt" "bench_out/pull_overlap_ci.txt"
fi
expect pull_overlap "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
if check notify_latency bench/notify_latency.sh --steps 2 --out bench_out/notify_latency_ci; then
  expect notify_latency "grep -q '^--events .* 2 ' bench_out/notify_latency_ci.txt" \
    "bench_out/notify_latency_ci.txt"
fi
expect notify_latency "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
# Two regions of 1 and 8 hosts behind the region cache and behind a mirror: --check fails
# unless every host is bit-exact and each link carries at most 1.15x one host's bytes.
if check regions_bench python3 bench/regions_bench.py --hosts 1,8 --params 2000000 --steps 2 --interval 2 \
    --check --out bench_out/regions_bench_ci; then
  expect regions_bench "grep -q '^mirror  *8 ' bench_out/regions_bench_ci.txt" "bench_out/regions_bench_ci.txt"
fi
expect regions_bench "[ \"\$(temp_leftovers)\" = \"$before\" ]" "work folders left: $(temp_leftovers)"
if [ "$(id -u)" -eq 0 ] && command -v ip > /dev/null; then
  if check cross_region python3 bench/cross_region.py --params 2000000 --densities low --steps 3 --interval 1 \
      --regions fast:1000:20 --codecs arc_v3,full --out bench_out/cross_region_docs; then
    expect cross_region "python3 -c 'import json; json.load(open(\"bench_out/cross_region_docs.json\"))'" "its JSON"
    expect cross_region "[ ! -e bench_out/cross_region_docs.png.dat ]" "a stray chart data file"
  fi
else
  echo "-- cross_region: SKIP (needs root and iproute2 for network namespaces)"
  skipped=$((skipped + 1))
fi

# 3. docs/bench.md: arc_bench on a checkpoint of your own, and checkpoint_bench end to end.
gen="$logs/gen"
if check bench_generate bazel-bin/bench/arc_bench --params 2000000 --deltas 1 --regimes low \
    --save-generated "$gen" --generate-only; then
  check checkpoint_bench bazel-bin/bench/checkpoint_bench "$gen/gen_low/step_000.safetensors" \
    "$gen/gen_low/step_001.safetensors" -T 2 --scaling --no-sync -r 2 &&
    expect checkpoint_bench "grep -q 'rebuilt checkpoint identical' '$logs/checkpoint_bench.log'" "the rebuild is not identical"
  check arc_bench_dir bazel-bin/bench/arc_bench --dir "$gen/gen_low" --quick --no-session
fi

# 4. python/README.md: the binding's cost (small).
if /usr/bin/python3 -c 'import arc_v3' 2> /dev/null; then
  check bench_binding /usr/bin/python3 python/bench/bench_binding.py --elements 1048576 --repeats 2
else
  echo "-- bench_binding: FAILED: the arc_v3 module is not installed (tests/run_tests.sh installs it)"
  failed=$((failed + 1))
fi

echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" -eq 0 ]
