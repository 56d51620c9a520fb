#!/usr/bin/env bash
# A region host's memory as the checkpoint grows: peak RSS of `arc_v3 pull` from a
# local store, at each checkpoint size (the generator's BF16 run at 0.2% changed, one
# shard): a slice of rows 0:ROWS of every tensor from the anchor (a new host) and then the
# next step's delta onto it, and the same whole. Writes OUT.{txt,json}
# (default bench_out/pull_memory).
#   bench/pull_memory.sh [--params P[,P...]] [--rows ROWS] [--out OUT]
set -euo pipefail
PY=/usr/bin/python3
cd "$(dirname "$0")/.."

params=180000000,720000000
rows=1024
out=bench_out/pull_memory
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //bench:arc_bench //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_pull_memory.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

: > "$work/results.jsonl"
for p in ${params//,/ }; do
  echo "== $p parameters" >&2
  bazel-bin/bench/arc_bench --params "$p" --deltas 1 --regimes low --save-generated "$work/gen" \
    --generate-only > /dev/null
  for s in 0 1; do
    mkdir -p "$work/step$s"
    mv "$work/gen/gen_low/step_00$s.safetensors" "$work/step$s/model.safetensors"
  done
  rm -rf "$work/gen" "$work/store"
  "$A" publish "$work/store" --step 0 --next "$work/step0/model.safetensors" -q
  "$A" publish "$work/store" --step 1 --next "$work/step1/model.safetensors" \
    --prev "$work/step0/model.safetensors" -q
  bytes=$(stat -c %s "$work/step1/model.safetensors")
  for kind in rows full; do
    args=()
    [ "$kind" = rows ] && args=(--rows "0:$rows")
    rm -rf "$work/region"
    for step in 0 1; do
      sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true
      /usr/bin/time -f %M -o "$work/rss" "$A" pull "$work/store" "$work/region" --step "$step" --json "${args[@]}" \
        > "$work/pull.json"
      echo "{\"checkpoint_bytes\": $bytes, \"pull\": \"$kind\", \"step\": $step, \"rss_kb\": $(cat "$work/rss"), \"report\": $(cat "$work/pull.json")}" \
        >> "$work/results.jsonl"
    done
  done
  rm -rf "$work/store" "$work/region" "$work/step0" "$work/step1"
done

"$PY" - "$work/results.jsonl" "$out" "$(git rev-parse --short HEAD)" "$rows" <<'EOF'
import json, sys
text, rows, at, decoder = open(sys.argv[1]).read(), [], 0, json.JSONDecoder()
while text[at:].strip():
    at = len(text) - len(text[at:].lstrip())
    doc, at = decoder.raw_decode(text, at)
    rows.append(doc)
out, commit, r = sys.argv[2], sys.argv[3], sys.argv[4]
lines = [f"# bench/pull_memory.sh: commit {commit}; local store, one shard, the generator's BF16 run at 0.2% changed;",
         f"# rows: rows 0:{r} of every tensor; step 0 from its anchor onto nothing, step 1 (a delta) onto it",
         f"{'checkpoint':>12} {'pull':<5} {'step':>4} {'route':<16} {'fetched':>12} {'requests':>9} {'peak RSS':>10} {'seconds':>8}"]
for x in rows:
    rep = x["report"]
    lines.append(f"{x['checkpoint_bytes']:>12} {x['pull']:<5} {x['step']:>4} {rep['route']:<16} {rep['fetched_bytes']:>12} "
                 f"{rep['requests']:>9} {x['rss_kb'] / 1024:>7.0f} MB {rep['seconds']['total']:>8.2f}")
text = "\n".join(lines) + "\n"
open(out + ".txt", "w").write(text)
json.dump({"commit": commit, "results": rows}, open(out + ".json", "w"), indent=1)
print(text, end="")
EOF
