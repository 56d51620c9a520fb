#!/usr/bin/env bash
# What the sync layer costs on top of the delta itself, on one machine (loopback):
#   1. bytes: per step, what a trainer shard uploads and a region downloads, against the
#      delta file `arc_v3 diff` writes for the same pair (the protocol's overhead);
#   2. time: `arc_v3 pull` of one step from a local store and from radosgw, against
#      `arc_v3 apply` of the same delta file, both writing the same checkpoint (medians,
#      runs alternating so that a shared machine's drift hits both alike).
# The checkpoints come from the built-in generator (1.34 GB of BF16 at 0.2% changed by
# default). Writes bench_out/sync_bench.{txt,json}.
#   bench/sync_bench.sh [--params N] [--density low|mid|high] [--repeats R] [--no-sync]
set -euo pipefail
cd "$(dirname "$0")/.."

params=720000000
regime=low
repeats=5
sync_flag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --density) regime="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --no-sync) sync_flag="--no-sync"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //bench:arc_bench //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_sync_bench.XXXXXX")
rgw="$work/rgw"
cleanup() { tests/s3/radosgw.sh stop "$rgw" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p bench_out

echo "generating a ${params}-parameter checkpoint run ($regime density)..." >&2
bazel-bin/bench/arc_bench --params "$params" --deltas 2 --regimes "$regime" \
  --save-generated "$work/gen" --generate-only >/dev/null
run="$work/gen/gen_$regime"
# One file name for every step, as a trainer shard writes it.
for s in 0 1 2; do
  mkdir -p "$work/step$s"
  ln "$run/step_00$s.safetensors" "$work/step$s/model.safetensors"
done
rm -rf "$work/gen"
tests/s3/radosgw.sh start "$rgw" 17380 >/dev/null
# shellcheck source=/dev/null
source "$rgw/env.sh"

mkdir -p "$work/store"
stores=("$work/store" "$ARC_V3_TEST_S3/sync-bench-$$")
names=("directory" "radosgw")
"$A" diff -q "$work/step0/model.safetensors" "$work/step1/model.safetensors" -o "$work/d1.a3d"
"$A" diff -q "$work/step1/model.safetensors" "$work/step2/model.safetensors" -o "$work/d2.a3d"
delta1=$(stat -c %s "$work/d1.a3d")
delta2=$(stat -c %s "$work/d2.a3d")
checkpoint=$(stat -c %s "$work/step1/model.safetensors")

json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
median() { python3 -c "import statistics,sys; print('%.4f' % statistics.median(map(float, sys.argv[1:])))" "$@"; }

results=()
for i in 0 1; do
  store="${stores[$i]}"
  "$A" publish "$store" --step 0 --next "$work/step0/model.safetensors" --json > "$work/p0.json"
  "$A" publish "$store" --step 1 --next "$work/step1/model.safetensors" --prev "$work/step0/model.safetensors" --json > "$work/p1.json"
  "$A" publish "$store" --step 2 --next "$work/step2/model.safetensors" --prev "$work/step1/model.safetensors" --json > "$work/p2.json"
  up1=$(json_get "$work/p1.json" "d['uploaded_bytes']")
  up2=$(json_get "$work/p2.json" "d['uploaded_bytes']")
  enc1=$(json_get "$work/p1.json" "d['seconds']['encode']")
  pub1=$(json_get "$work/p1.json" "d['seconds']['total']")
  # A region at step 0 (from the anchor), copied aside untimed before every timed pull.
  "$A" pull "$store" "$work/region0" --step 0 -q
  pulls=(); applies=(); fetched=""; phases=""
  for r in $(seq "$repeats"); do
    rm -rf "$work/region" "$work/applied"
    cp -a "$work/region0" "$work/region"
    sync
    t0=$(date +%s.%N)
    "$A" pull "$store" "$work/region" --step 1 $sync_flag --json > "$work/pull.json"
    t1=$(date +%s.%N)
    pulls+=("$(echo "$t1 - $t0" | bc -l)")
    fetched=$(json_get "$work/pull.json" "d['fetched_bytes']")
    phases=$(json_get "$work/pull.json" "' '.join('%s %.3f' % kv for kv in d['seconds'].items())")
    cmp -s "$work/region/model.safetensors" "$work/step1/model.safetensors" || { echo "pull differs" >&2; exit 1; }
    mkdir -p "$work/applied"
    sync
    t0=$(date +%s.%N)
    "$A" apply -q "$work/region0/model.safetensors" "$work/d1.a3d" -o "$work/applied/model.safetensors" $sync_flag
    t1=$(date +%s.%N)
    applies+=("$(echo "$t1 - $t0" | bc -l)")
    cmp -s "$work/applied/model.safetensors" "$work/step1/model.safetensors" || { echo "apply differs" >&2; exit 1; }
  done
  rm -rf "$work/region0"
  mp=$(median "${pulls[@]}")
  ma=$(median "${applies[@]}")
  results+=("$(printf '%s|%s|%s|%s|%s|%s|%s|%s|%s' "${names[$i]}" "$up1" "$up2" "$fetched" "$mp" "$ma" "$enc1" "$pub1" "$phases")")
done

commit=$(git rev-parse --short HEAD)
{
  echo "# bench/sync_bench.sh --params $params --density $regime --repeats $repeats $sync_flag"
  echo "# commit $commit, $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m), $(df -T "$work" | awk 'NR==2 {print $2}'); loopback; fsync $([ -n "$sync_flag" ] && echo off || echo on)"
  echo "# pull and apply: medians of $repeats runs each, alternating, 'sync' before each"
  echo "checkpoint $checkpoint B; delta files (arc_v3 diff): step 1 $delta1 B, step 2 $delta2 B"
  echo
  printf '%-10s %14s %14s %14s %10s %10s %10s %10s %10s\n' store "up step1 B" "up step2 B" "down step1 B" \
    "overhead" "pull s" "apply s" "pull/apply" "publish s"
  for row in "${results[@]}"; do
    IFS='|' read -r name up1 up2 down mp ma enc pub phases <<< "$row"
    printf '%-10s %14s %14s %14s %9.2f%% %10s %10s %10.3f %10.3f\n' "$name" "$up1" "$up2" "$down" \
      "$(echo "100 * ($down - $delta1) / $delta1" | bc -l)" "$mp" "$ma" "$(echo "$mp / $ma" | bc -l)" "$pub"
  done
  echo
  echo "pull phases of the last run (seconds; decode and write summed over threads):"
  for row in "${results[@]}"; do
    IFS='|' read -r name _ _ _ _ _ _ _ phases <<< "$row"
    echo "  $name: $phases"
  done
} | tee bench_out/sync_bench.txt
python3 - "$work" bench_out/sync_bench.json "$checkpoint" "$delta1" "$delta2" "$commit" "${results[@]}" <<'EOF'
import json, sys
work, out, checkpoint, delta1, delta2, commit, *rows = sys.argv[1:]
res = []
for row in rows:
    name, up1, up2, down, mp, ma, enc, pub, phases = row.split('|')
    res.append({"store": name, "uploaded_step1": int(up1), "uploaded_step2": int(up2),
                "downloaded_step1": int(down), "pull_seconds_median": float(mp),
                "apply_seconds_median": float(ma), "publish_seconds": float(pub)})
json.dump({"commit": commit, "checkpoint_bytes": int(checkpoint), "delta_bytes": [int(delta1), int(delta2)],
           "results": res}, open(out, "w"), indent=2)
EOF
