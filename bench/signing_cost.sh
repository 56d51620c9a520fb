#!/usr/bin/env bash
# What signing a run costs: SHA-256 and Ed25519 on this machine (bench/signing_primitives),
# then one checkpoint (the generator's BF16 run at 0.2% changed, one shard, a directory
# store) published unsigned and signed (step 0 an anchor, step 1 a delta), and pulled full
# and as a row slice without and with --trusted-keys. Medians of --repeats runs. Writes
# OUT.{txt,json} (default bench_out/signing_cost).
#   bench/signing_cost.sh [--params P] [--repeats N] [--out OUT]
set -euo pipefail
PY=/usr/bin/python3
cd "$(dirname "$0")/.."

params=180000000
repeats=3
out=bench_out/signing_cost
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //bench:arc_bench //bench:signing_primitives //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_signing_cost.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

bazel-bin/bench/signing_primitives > "$work/primitives.json"
bazel-bin/bench/arc_bench --params "$params" --deltas 1 --regimes low --save-generated "$work/gen" \
  --generate-only > /dev/null
G="$work/gen/gen_low"
"$A" keygen "$work/trainer.key" > /dev/null
: > "$work/results.jsonl"
for r in $(seq "$repeats"); do
  for mode in unsigned signed; do
    key=()
    trust=()
    [ "$mode" = signed ] && key=(--sign-key "$work/trainer.key") && trust=(--trusted-keys "$work/trainer.key.pub")
    rm -rf "$work/store" "$work/full" "$work/rows"
    for step in 0 1; do
      prev=()
      [ "$step" = 1 ] && prev=(--prev "$G/step_000.safetensors")
      "$A" publish "$work/store" --step "$step" --next "$G/step_00$step.safetensors" "${prev[@]}" "${key[@]}" \
        --json > "$work/publish.json"
      echo "{\"mode\": \"$mode\", \"what\": \"publish\", \"step\": $step, \"report\": $(cat "$work/publish.json")}" \
        >> "$work/results.jsonl"
    done
    for kind in full rows; do
      args=()
      [ "$kind" = rows ] && args=(--rows 0:1024)
      for step in 0 1; do
        "$A" pull "$work/store" "$work/$kind" --step "$step" "${args[@]}" "${trust[@]}" --json --no-sync \
          > "$work/pull.json"
        echo "{\"mode\": \"$mode\", \"what\": \"$kind\", \"step\": $step, \"report\": $(cat "$work/pull.json")}" \
          >> "$work/results.jsonl"
      done
    done
  done
done

"$PY" - "$work/results.jsonl" "$work/primitives.json" "$out" "$(git rev-parse --short HEAD)" "$params" <<'PYEOF'
import json, statistics, sys
text, rows, at, decoder = open(sys.argv[1]).read(), [], 0, json.JSONDecoder()
while text[at:].strip():
    at = len(text) - len(text[at:].lstrip())
    doc, at = decoder.raw_decode(text, at)
    rows.append(doc)
prim = json.load(open(sys.argv[2]))
out, commit, params = sys.argv[3], sys.argv[4], sys.argv[5]
lines = [f"# bench/signing_cost.sh: commit {commit}; {params} BF16 parameters (the generator's run at 0.2% changed),",
         "# one shard, a local store; medians of the repeats; step 0 an anchor, step 1 a delta",
         f"# SHA-256 {prim['sha256_gb_per_s']:.2f} GB/s on one core; Ed25519 sign {prim['ed25519_sign_us']:.0f} us, "
         f"verify {prim['ed25519_verify_us']:.0f} us (bench/signing_primitives)",
         f"{'what':<8} {'step':>4} {'unsigned s':>11} {'signed s':>9} {'added s':>8} {'unsigned B':>12} {'signed B':>12} "
         f"{'requests':>9}"]
summary = []
for what in ("publish", "full", "rows"):
    for step in (0, 1):
        def pick(mode):
            sel = [x["report"] for x in rows if x["mode"] == mode and x["what"] == what and x["step"] == step]
            secs = statistics.median(r["seconds"]["total"] for r in sel)
            size = sel[0]["uploaded_bytes"] if what == "publish" else sel[0]["fetched_bytes"]
            reqs = sel[0].get("requests", sel[0].get("uploaded_objects", 0))
            return secs, size, reqs
        (us, ub, ur), (ss, sb, sr) = pick("unsigned"), pick("signed")
        summary.append({"what": what, "step": step, "unsigned_seconds": us, "signed_seconds": ss,
                        "unsigned_bytes": ub, "signed_bytes": sb, "unsigned_requests": ur, "signed_requests": sr})
        lines.append(f"{what:<8} {step:>4} {us:>11.3f} {ss:>9.3f} {ss - us:>+8.3f} {ub:>12} {sb:>12} {ur:>4} {sr:>4}")
text = "\n".join(lines) + "\n"
open(out + ".txt", "w").write(text)
json.dump({"commit": commit, "params": int(params), "primitives": prim, "summary": summary, "runs": rows},
          open(out + ".json", "w"), indent=1)
print(text, end="")
PYEOF
