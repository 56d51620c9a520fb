#!/usr/bin/env bash
# What a full pull waits for, on one machine: a region pulls a sharded step from radosgw
# (loopback) into an empty directory - the anchor route, every shard's anchor object and
# then its delta - and reports its wall time beside its phases (download, decode, the time
# decoding waited for objects). Decoding objects while the next ones download makes the
# wall time approach the larger of download and decode instead of their sum.
# --rate MBIT limits what radosgw sends to that many Mbit/s (tbf on loopback for its port
# alone; needs root and iproute2), as a region's link would: then download and decode
# each take their own time instead of sharing this machine's cores with the server.
# With --baseline CLI, another build of the command (e.g. one that fetches every object
# before decoding) pulls the same step in alternating runs; medians of --repeats each.
# The checkpoints come from the built-in generator (one file), split into --shards files
# of whole tensors. Writes OUT.{txt,json} (default bench_out/pull_overlap).
#   bench/pull_overlap.sh [--params N] [--shards N] [--density low|mid|high] [--repeats R]
#                         [--rate MBIT] [--baseline PATH] [--out OUT]
set -euo pipefail
PY=/usr/bin/python3  # Debian's (a pyenv shim may come first on PATH)
cd "$(dirname "$0")/.."

params=720000000
shards=8
regime=low
repeats=3
baseline=""
rate=""
out=bench_out/pull_overlap
while [ $# -gt 0 ]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --shards) shards="$2"; shift 2 ;;
    --density) regime="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --baseline) baseline="$(realpath "$2")"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //bench:arc_bench //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_pull_overlap.XXXXXX")
rgw="$work/rgw"
shaped=""
cleanup() {
  [ -z "$shaped" ] || tc qdisc del dev lo root 2>/dev/null || true
  tests/s3/radosgw.sh stop "$rgw" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$(dirname "$out")"

echo "generating a ${params}-parameter run ($regime density), split into $shards shards..." >&2
bazel-bin/bench/arc_bench --params "$params" --deltas 1 --regimes "$regime" \
  --save-generated "$work/gen" --generate-only >/dev/null
# Each step's file split into SHARDS safetensors files of whole tensors (the same tensors
# in the same shard at every step; the largest tensors first, each to the lightest shard).
"$PY" - "$work/gen/gen_$regime" "$work/shards" "$shards" <<'PY'
import json, os, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = sorted(f for f in os.listdir(src) if f.startswith("step_") and f.endswith(".safetensors"))
plan = None
for step_file in steps:
    with open(os.path.join(src, step_file), "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        base = 8 + size
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        if plan is None:
            load, plan = [0] * n, {}
            for name in sorted(tensors, key=lambda k: -(tensors[k]["data_offsets"][1] - tensors[k]["data_offsets"][0])):
                k = load.index(min(load))
                plan[name] = k
                load[k] += tensors[name]["data_offsets"][1] - tensors[name]["data_offsets"][0]
        step = int(step_file[5:-12])
        os.makedirs(os.path.join(dst, str(step)), exist_ok=True)
        for k in range(n):
            names = sorted(name for name in tensors if plan[name] == k)
            out_header, offset, blobs = {}, 0, []
            for name in names:
                begin, end = tensors[name]["data_offsets"]
                f.seek(base + begin)
                blobs.append(f.read(end - begin))
                out_header[name] = dict(tensors[name], data_offsets=[offset, offset + end - begin])
                offset += end - begin
            text = json.dumps(out_header, separators=(",", ":")).encode()
            text += b" " * (-len(text) % 8)
            with open(os.path.join(dst, str(step), f"model-{k + 1:05d}-of-{n:05d}.safetensors"), "wb") as o:
                o.write(struct.pack("<Q", len(text)) + text)
                for blob in blobs:
                    o.write(blob)
PY

port=""
for p in $(seq 18480 2 18980); do
  if ! ss -Htln "sport = :$p or sport = :$((p + 1))" | grep -q .; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port for radosgw" >&2; exit 1; }
tests/s3/radosgw.sh start "$rgw" "$port" >/dev/null
# shellcheck source=/dev/null
source "$rgw/env.sh"
bucket="$ARC_V3_TEST_S3/pull-overlap"  # the bucket radosgw.sh creates
for step in 0 1; do
  for k in $(seq 0 $((shards - 1))); do
    file="$work/shards/$step/model-$(printf %05d $((k + 1)))-of-$(printf %05d "$shards").safetensors"
    prev=()
    [ "$step" -eq 0 ] || prev=(--prev "$work/shards/0/$(basename "$file")")
    "$A" publish "$bucket" --step "$step" --next "$file" "${prev[@]}" --shard "$k/$shards" \
      --anchor-every 4 >/dev/null
  done
done

if [ -n "$rate" ]; then
  # Loopback's other traffic keeps an unlimited class; radosgw's answers go through one
  # of RATE.
  shaped=1
  tc qdisc add dev lo root handle 1: htb default 10
  tc class add dev lo parent 1: classid 1:10 htb rate 100gbit burst 4mb
  tc class add dev lo parent 1: classid 1:20 htb rate "${rate}mbit" ceil "${rate}mbit" burst 1mb
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport "$port" 0xffff flowid 1:20
fi

# Alternating runs into fresh directories, the page cache dropped of nothing (loopback).
pull() {  # CLI OUT_JSON
  rm -rf "$work/region"
  sync
  "$1" pull "$bucket" "$work/region" --step 1 --no-sync --json >"$2"
  for k in $(seq 0 $((shards - 1))); do
    name="model-$(printf %05d $((k + 1)))-of-$(printf %05d "$shards").safetensors"
    cmp -s "$work/region/$name" "$work/shards/1/$name" || { echo "shard $k differs after pull" >&2; exit 1; }
  done
}
for r in $(seq 1 "$repeats"); do
  pull "$A" "$work/new-$r.json"
  [ -z "$baseline" ] || pull "$baseline" "$work/old-$r.json"
done

"$PY" - "$work" "$repeats" "$out" "$params" "$shards" "$regime" "${baseline:+1}" "$rate" <<'PY'
import json, os, statistics, subprocess, sys
work, repeats, out, params, shards, regime, has_old, rate = sys.argv[1:9]
repeats = int(repeats)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
rows = {}
for label, prefix in [("this build", "new")] + ([("baseline", "old")] if has_old else []):
    runs = [json.load(open(os.path.join(work, f"{prefix}-{r}.json"))) for r in range(1, repeats + 1)]
    med = lambda key: statistics.median(r["seconds"].get(key, 0.0) for r in runs)
    rows[label] = {"runs": runs, "fetched_bytes": runs[0]["fetched_bytes"], "objects": runs[0]["fetched_objects"],
                   "median": {k: med(k) for k in ("total", "fetch", "verify", "decode", "write", "wait", "commit")}}
lines = [f"# bench/pull_overlap.sh --params {params} --shards {shards} --density {regime} --repeats {repeats}"
         f"{' --rate ' + rate if rate else ''}{' --baseline CLI' if has_old else ''}",
         f"# commit {commit}, {os.cpu_count()} cores; radosgw on loopback"
         f"{', its answers limited to ' + rate + ' Mbit/s' if rate else ''}; a fresh region pulls step 1 "
         "(anchor route: every shard's anchor, then its delta); --no-sync; medians",
         "",
         f"{'build':<12} {'objects':>7} {'fetched MB':>10} {'total s':>8} {'fetch s':>8} {'decode s':>9} "
         f"{'write s':>8} {'waited s':>9} {'fetch+decode+write':>19}"]
for label, row in rows.items():
    m = row["median"]
    lines.append(f"{label:<12} {row['objects']:>7} {row['fetched_bytes'] / 1e6:>10.1f} {m['total']:>8.3f} "
                 f"{m['fetch']:>8.3f} {m['decode']:>9.3f} {m['write']:>8.3f} {m['wait']:>9.3f} "
                 f"{m['fetch'] + m['decode'] + m['write']:>19.3f}")
lines.append("")
lines.append("decode and write: summed over the decoding threads; waited: time decoding waited for an object")
text = "\n".join(lines) + "\n"
print(text, end="")
open(out + ".txt", "w").write(text)
json.dump({"params": int(params), "shards": int(shards), "density": regime, "rate_mbit": int(rate) if rate else None,
           "commit": commit, "builds": rows},
          open(out + ".json", "w"), indent=1)
PY
