#!/usr/bin/env bash
# A rollout engine's memory while its Follower (arc_v3_sync.hpp) applies a step: peak RSS
# over what it held before, per changed element, at each checkpoint size and change rate
# (the generator's BF16 runs at 0.2% and 2% changed, one shard, a local store). The
# follower takes step 0 from its anchor, then step 1's delta in place. Writes
# OUT.{txt,json} (default bench_out/follow_memory).
#   bench/follow_memory.sh [--params P[,P...]] [--regimes low,mid] [--threads N] [--out OUT]
set -euo pipefail
PY=/usr/bin/python3
cd "$(dirname "$0")/.."

params=180000000,720000000
regimes=low,mid
threads=2
out=bench_out/follow_memory
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --regimes) regimes="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //bench:arc_bench //bench:follow_memory //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_follow_memory.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

: > "$work/results.jsonl"
for p in ${params//,/ }; do
  for regime in ${regimes//,/ }; do
    echo "== $p parameters, $regime" >&2
    bazel-bin/bench/arc_bench --params "$p" --deltas 1 --regimes "$regime" --save-generated "$work/gen" \
      --generate-only > /dev/null
    rm -rf "$work/store"
    "$A" publish "$work/store" --step 0 --next "$work/gen/gen_$regime/step_000.safetensors" -q
    "$A" publish "$work/store" --step 1 --next "$work/gen/gen_$regime/step_001.safetensors" \
      --prev "$work/gen/gen_$regime/step_000.safetensors" -q
    rm -rf "$work/gen"
    echo "{\"regime\": \"$regime\", \"result\": $(bazel-bin/bench/follow_memory "$work/store" --threads "$threads")}" \
      >> "$work/results.jsonl"
    rm -rf "$work/store"
  done
done

"$PY" - "$work/results.jsonl" "$out" "$(git rev-parse --short HEAD)" "$threads" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
out, commit, threads = sys.argv[2], sys.argv[3], sys.argv[4]
lines = [f"# bench/follow_memory.sh: commit {commit}; the library Follower, {threads} threads, a local store, one shard;",
         "# step 0 from its anchor, then step 1's delta in place; extra: peak RSS during step 1 over RSS before it",
         f"{'model':>12} {'changed':>7} {'elements':>10} {'fetched':>11} {'undo':>11} {'extra RSS':>11} "
         f"{'B/changed':>9} {'extra/model':>11} {'seconds':>8}"]
for x in rows:
    r = x["result"]
    extra = max(0, r["peak_rss"] - r["held_rss"])
    changed = r["changed_elements"]
    lines.append(f"{r['model_bytes']:>12} {x['regime']:>7} {changed:>10} {r['fetched_bytes']:>11} {r['undo_bytes']:>11} "
                 f"{extra:>11} {extra / max(changed, 1):>9.2f} {extra / r['model_bytes']:>11.4f} {r['seconds']:>8.2f}")
text = "\n".join(lines) + "\n"
open(out + ".txt", "w").write(text)
json.dump({"commit": commit, "threads": int(threads), "results": rows}, open(out + ".json", "w"), indent=1)
print(text, end="")
PYEOF
