#!/usr/bin/env bash
# What one step of the sync protocol costs as the trainer's shard count N grows, counted on
# the wire: every request radosgw serves is in its access log (method, key, status, bytes).
# N trainer shards publish two steps (an anchor step, then a delta step at ~2% changed) as
# separate `arc_v3 publish` processes. Three hosts each pull step 0, then step 1 (the
# phase measured: what a host pays per step): one whole files, one the tensors of N/64
# shards, one 1/8 of every tensor's rows. Per phase: requests (by method), bytes moved,
# metadata bytes (documents: roots, group indexes, layouts, records, `latest`), the largest
# share of requests under one key prefix (its first two components, e.g. `r/3f` or
# `steps/000000000001`: S3 partitions request capacity by prefix), wall time, the
# committers' latest commit time, and the pulling process's peak RSS. Writes
# OUT.{txt,json} (default bench_out/sync_scale).
# --check (CI) also asserts, per N, that every pulled tensor is bit-exact and the limits
# of sync protocol 2: publishing a step <= 12 N requests; per step, a full pull <= 2 N + 50,
# a pull of N/64 shards' tensors <= 4 x those shards + 30 requests and <= 1/32 of the full
# pull's bytes + 64 KiB; from 256 shards on, no key prefix with more than 1/8 of a
# publish's requests; it ends with "N passed, N failed".
#   bench/sync_scale.sh [--shards N[,N...]] [--tensors T] [--rows R] [--cols C] [--out OUT] [--check]
set -euo pipefail
PY=/usr/bin/python3  # Debian's, with numpy (a pyenv shim may come first on PATH)
cd "$(dirname "$0")/.."

shard_counts=64,256
tensors=4   # per shard
rows=64
cols=256
out=bench_out/sync_scale
check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1; shift ;;
    --shards) shard_counts="$2"; shift 2 ;;
    --tensors) tensors="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --cols) cols="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_sync_scale.XXXXXX")
rgw="$work/rgw"
cleanup() { tests/s3/radosgw.sh stop "$rgw" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
mkdir -p "$(dirname "$out")"

port=""
for p in $(seq 18480 2 18980); do
  if ! ss -Htln "sport = :$p or sport = :$((p + 1))" | grep -q .; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port for radosgw" >&2; exit 1; }
tests/s3/radosgw.sh start "$rgw" "$port" >/dev/null
# shellcheck source=/dev/null
source "$rgw/env.sh"
access_log="$rgw/log/client.rgw.a.log"

# count FROM PREFIX: the gateway's requests under PREFIX logged after line FROM of its log.
# Prints JSON: requests, by method, bytes served, the largest share under one key prefix.
cat > "$work/count.py" <<'EOF'
import collections, json, re, sys, urllib.parse
prefix = sys.argv[1]
line_re = re.compile(r'beast: \S+ \S+ - \S+ \[[^\]]*\] "(\w+) (\S+) HTTP/[\d.]+" (\d+) (\d+|-)')
methods, prefixes, total, served, meta, lists = collections.Counter(), collections.Counter(), 0, 0, 0, 0
for line in sys.stdin:
    m = line_re.search(line)
    if not m or prefix not in m.group(2):
        continue
    method, (path, _, query) = m.group(1), m.group(2).partition("?")
    if prefix in path:
        key = path.split(prefix, 1)[1].lstrip("/")
    else:  # a listing: ?list-type=2&prefix=PREFIX/steps/... names what it lists
        listed = urllib.parse.parse_qs(query).get("prefix", [""])[0]
        key = listed.split(prefix, 1)[1].lstrip("/") if prefix in listed else ""
        lists += 1
    total += 1
    methods[method] += 1
    n = int(m.group(4)) if m.group(4) != "-" else 0
    served += n
    if method == "GET" and (key.endswith(".json") or key == "latest"):
        meta += n
    # The key prefix S3 would partition on: the key's first two components.
    prefixes["/".join(key.split("/")[:2])] += 1
top = prefixes.most_common(1)
print(json.dumps({"requests": total, "methods": dict(methods), "bytes_served": served, "meta_bytes": meta, "lists": lists,
                  "top_prefix": top[0][0] if top else None,
                  "top_prefix_share": (top[0][1] / total) if total else 0}))
EOF
count() {  # FROM PREFIX
  sleep 1  # the log is written asynchronously
  tail -n +"$(($1 + 1))" "$access_log" | "$PY" "$work/count.py" "$2"
}
lines() { wc -l < "$access_log"; }

results="$work/results.jsonl"
: > "$results"
for n in ${shard_counts//,/ }; do
  echo "== $n shards x $tensors tensors of ${rows}x${cols} BF16" >&2
  data="$work/data-$n"
  "$PY" - "$data" "$n" "$tensors" "$rows" "$cols" <<'EOF'
import json, os, sys
import numpy as np
out, n, t, rows, cols = sys.argv[1], *map(int, sys.argv[2:])
rng = np.random.default_rng(n)
def write(path, tensors):
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little")); f.write(h)
        for a in tensors.values():
            f.write(a.astype("<u2").tobytes())
for k in range(n):
    x = (rng.standard_normal((t, rows, cols), dtype=np.float32) * 0.02).view(np.uint32)
    w = (x >> 16).astype(np.uint16)
    for step in (0, 1):
        if step:
            flat = w.reshape(-1)
            idx = rng.choice(flat.size, flat.size // 50, replace=False)
            flat[idx] += rng.choice(np.array([1, 0xFFFF], dtype=np.uint16), idx.size)
        os.makedirs(f"{out}/{step}", exist_ok=True)
        write(f"{out}/{step}/shard-{k:05d}.safetensors", {f"layers.{k}.w{j}": w[j] for j in range(t)})
EOF
  store="$ARC_V3_TEST_S3/scale-$n-$$"
  prefix="${store#s3://*/}"
  for step in 0 1; do
    from=$(lines)
    start=$(date +%s%N)
    seq 0 $((n - 1)) | xargs -P 16 -I{} sh -c '
      k={}; f=$(printf "shard-%05d.safetensors" "$k")
      prev=""; [ "$2" -gt 0 ] && prev="--prev $3/$(($2 - 1))/$f"
      exec "$1" publish "$4" --step "$2" --next "$3/$2/$f" $prev --shard "$k/$5" --anchor-every 0 --json -q \
        > "$3/publish-$2-$k.json"' _ "$A" "$step" "$data" "$store" "$n"
    secs=$("$PY" -c "print(($(date +%s%N) - $start) / 1e9)")
    sums=$("$PY" -c '
import glob, json, sys
r = [json.load(open(f)) for f in glob.glob(sys.argv[1])]
print(json.dumps({"uploaded_bytes": sum(x["uploaded_bytes"] for x in r),
                  "commit_seconds": max(x["seconds"]["commit"] for x in r)}))' "$data/publish-$step-*.json")
    echo "{\"shards\": $n, \"phase\": \"publish step $step\", \"seconds\": $secs, \"publish\": $sums, \"wire\": $(count "$from" "$prefix")}" >> "$results"
  done
  sel=""
  for k in $(seq 0 $(( (n + 63) / 64 - 1 ))); do sel="$sel${sel:+|}$k"; done
  for phase in full tensors rows; do
    args=()
    case "$phase" in
      tensors) args=(--tensors "layers\\.($sel)\\..*") ;;
      rows) args=(--rows "0:$((rows / 8))") ;;
    esac
    "$A" pull "$store" "$work/region-$n-$phase" --step 0 --json "${args[@]}" > "$work/pull.json"
    from=$(lines)
    /usr/bin/time -f %M -o "$work/rss" "$A" pull "$store" "$work/region-$n-$phase" --step 1 --json "${args[@]}" \
      > "$work/pull.json"
    echo "{\"shards\": $n, \"phase\": \"pull $phase\", \"report\": $(cat "$work/pull.json"), \"rss_kb\": $(cat "$work/rss"), \"wire\": $(count "$from" "$prefix")}" >> "$results"
  done
  # Every pulled tensor, bit for bit: whole files, the selected shards' tensors, the rows.
  "$PY" - "$data/1" "$work/region-$n" "$n" "$((rows / 8))" "$sel" >> "$work/exact.txt" <<'EOF'
import json, re, sys
truth, region, n, rows, sel = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def read(path):
    """{name: (shape, bytes)} of a safetensors file, and the file's bytes."""
    raw = open(path, "rb").read()
    h = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + h])
    return {k: (v["shape"], raw[8 + h + v["data_offsets"][0]:8 + h + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}, raw
bad = []
selected = re.compile(r"layers\.(%s)\..*" % sel)
for k in range(n):
    name = "shard-%05d.safetensors" % k
    want, raw = read(f"{truth}/{name}")
    if open(f"{region}-full/{name}", "rb").read() != raw:
        bad.append(f"full {name}")
    got, _ = read(f"{region}-tensors/{name}")
    if {t: v[1] for t, v in got.items()} != {t: v[1] for t, v in want.items() if selected.fullmatch(t)}:
        bad.append(f"tensors {name}")
    got, _ = read(f"{region}-rows/{name}")
    for t, (shape, data) in want.items():
        row = len(data) // shape[0]
        if t not in got or got[t][1] != data[:min(rows, shape[0]) * row]:
            bad.append(f"rows {name} {t}")
print(json.dumps({"shards": n, "bad": bad}))
EOF
done

"$PY" - "$results" "$out" "$(git rev-parse --short HEAD)" "$tensors" "$rows" "$cols" <<'EOF'
import json, sys
text, rows, at, decoder = open(sys.argv[1]).read(), [], 0, json.JSONDecoder()
while text[at:].strip():  # one JSON document per phase (the pull reports span lines)
    at = len(text) - len(text[at:].lstrip())
    doc, at = decoder.raw_decode(text, at)
    rows.append(doc)
out, commit, t, r, c = sys.argv[2], sys.argv[3], *sys.argv[4:]
lines = [f"# bench/sync_scale.sh: commit {commit}; radosgw on loopback; {t} BF16 tensors of {r}x{c} per shard, ~2% changed;",
         "# pulls: step 1 onto a host holding step 0 (what a host pays per step); metadata: documents read",
         f"{'shards':>6} {'phase':<16} {'requests':>9} {'GET':>8} {'PUT':>6} {'HEAD':>6} {'LIST':>6} {'bytes up/down':>14} "
         f"{'metadata':>10} {'top prefix':>11} {'seconds':>8} {'commit s':>8} {'peak RSS':>9}"]
for x in rows:
    w, m = x["wire"], x["wire"]["methods"]
    if x["phase"].startswith("publish"):
        moved, secs, rss, commit_s = x["publish"]["uploaded_bytes"], x["seconds"], "-", f"{x['publish']['commit_seconds']:.2f}"
    else:
        moved, secs, rss, commit_s = x["report"]["fetched_bytes"], x["report"]["seconds"]["total"], f"{x['rss_kb'] / 1024:.0f} MB", "-"
    lines.append(f"{x['shards']:>6} {x['phase']:<16} {w['requests']:>9} {m.get('GET', 0):>8} {m.get('PUT', 0):>6} "
                 f"{m.get('HEAD', 0):>6} {w.get('lists', 0):>6} {moved:>14} {w['meta_bytes']:>10} "
                 f"{w['top_prefix_share']:>10.1%} {secs:>8.2f} {commit_s:>8} {rss:>9}")
text = "\n".join(lines) + "\n"
open(out + ".txt", "w").write(text)
json.dump({"commit": commit, "results": rows}, open(out + ".json", "w"), indent=1)
print(text)
EOF

[ "$check" = 1 ] || exit 0
"$PY" - "$out.json" "$work/exact.txt" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
exact = {e["shards"]: e["bad"] for e in map(json.loads, open(sys.argv[2]))}
passed = failed = 0
def expect(ok, what):
    global passed, failed
    print(("ok      " if ok else "FAILED  ") + what)
    passed, failed = passed + ok, failed + (not ok)
for n in sorted({x["shards"] for x in rows}):
    at = {x["phase"]: x for x in rows if x["shards"] == n}
    for step in (0, 1):
        wire = at[f"publish step {step}"]["wire"]
        got = wire["requests"]
        expect(got <= 12 * n, f"{n} shards: publishing step {step} took {got} requests (<= 12 N = {12 * n})")
        # A group's 32 records share the prefix its completer lists: below 256 shards
        # (8 groups) one group's prefix is a large share of a small load by design.
        if n >= 256:
            got = wire["top_prefix_share"]
            expect(got <= 1 / 8, f"{n} shards: ... at most {got:.1%} of them under one key prefix (<= 1/8)")
    full = at["pull full"]
    got = full["wire"]["requests"]
    expect(got <= 2 * n + 50, f"{n} shards: a full pull took {got} requests (<= 2 N + 50 = {2 * n + 50})")
    touched = (n + 63) // 64
    part = at["pull tensors"]
    got, limit = part["wire"]["requests"], 4 * touched + 30
    expect(got <= limit, f"{n} shards: a pull of {touched} shards' tensors took {got} requests (<= {limit})")
    got, limit = part["report"]["fetched_bytes"], full["report"]["fetched_bytes"] // 32 + 65536
    expect(got <= limit, f"{n} shards: ... and {got} bytes (<= a full pull's / 32 + 64 KiB = {limit})")
    bad = exact.get(n, ["not checked"])
    expect(not bad, f"{n} shards: every pulled tensor bit-exact" + (f" (differ: {bad[:5]})" if bad else ""))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
