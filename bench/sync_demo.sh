#!/usr/bin/env bash
# The product in one minute, on the embedded default store (a directory): a trainer
# publishes a short run of generated checkpoints, a step every second, while two regions
# follow it (one from the start, one that joins late), and both end bit-identical to the
# trainer. Prints what each side did. Used by bench/main_job.sh.
#   bench/sync_demo.sh [--params N] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
params=20000000
steps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_demo.XXXXXX")
pids=()
# Stops the followers still running (none once they are waited for) and removes the work
# folder, whatever the exit; never fails itself, so the script's own status is kept.
cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then kill "${pids[@]}" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
bazel-bin/bench/arc_bench --params "$params" --deltas "$((steps - 1))" --regimes mid \
  --save-generated "$work/gen" --generate-only >/dev/null
store="$work/store"
mkdir -p "$work/trainer"  # the store: made by the first publish
last=$((steps - 1))
echo "== sync: a trainer publishes $steps steps of a ${params}-parameter model (2% changed per step) to $store"
"$A" follow "$store" "$work/region-a" --interval 0.2 --until "$last" > "$work/a.log" 2>&1 &
pids+=($!)
for s in $(seq 0 "$last"); do
  # The trainer's file for step s (one name, as a trainer shard writes it).
  cp "$work/gen/gen_mid/step_$(printf %03d "$s").safetensors" "$work/trainer/next.safetensors"
  mkdir -p "$work/trainer/$s" && cp "$work/trainer/next.safetensors" "$work/trainer/$s/model.safetensors"
  prev=()
  [ "$s" -gt 0 ] && prev=(--prev "$work/trainer/$((s - 1))/model.safetensors")
  echo -n "trainer  "
  "$A" publish "$store" --step "$s" --next "$work/trainer/$s/model.safetensors" "${prev[@]}" --anchor-every 3
  if [ "$s" -eq 2 ]; then
    "$A" follow "$store" "$work/region-b" --interval 0.2 --until "$last" > "$work/b.log" 2>&1 &
    pids+=($!)
  fi
  sleep 1
done
wait "${pids[@]}"
pids=()
sed 's/^/region A /' "$work/a.log"
sed 's/^/region B /' "$work/b.log"
for r in a b; do
  cmp -s "$work/region-$r/model.safetensors" "$work/trainer/$last/model.safetensors" ||
    { echo "region $r differs from the trainer's step $last" >&2; exit 1; }
done
echo "both regions hold step $last, bit-identical to the trainer's file"
"$A" log "$store"
echo
