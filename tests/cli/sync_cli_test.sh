#!/bin/bash
# End-to-end test of the sync subcommands (publish, pull, follow, log, prune) with real
# processes, against a local store and, when ARC_V3_TEST_S3 names a bucket, a real S3
# server (tests/s3/radosgw.sh start DIR; then `source DIR/env.sh`).
#
#   bash tests/cli/sync_cli_test.sh bazel-bin/tools/cli/arc_v3_cli
#
# Environment: ARC_V3_TEST_S3 (s3://BUCKET, private), ARC_V3_TEST_PUBLIC_S3 (s3://BUCKET,
# anonymously readable) and ARC_V3_TEST_PUBLIC_HTTP (the same bucket over http://), with
# AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION. Without
# ARC_V3_TEST_S3 only the local store is tested ("SKIP: ..."), unless
# ARC_V3_REQUIRE_S3=1, which makes a missing server (or awscli) a failure.
#
# Every S3 run writes under its own prefix (cli-test-PID-RANDOM), so parallel runs never
# collide; the prefixes are removed at exit when /usr/bin/aws is there.
set -u
[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/arc_v3_cli"; exit 2; }
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$CLI" ] || { echo "FAIL: $CLI is not executable"; exit 1; }
AWS=/usr/bin/aws  # Debian's awscli: "a client nobody here wrote" (never a PATH shim)
REQUIRE_S3="${ARC_V3_REQUIRE_S3:-0}"
START=$SECONDS

T="$(mktemp -d)"
# The CLI's scratch files (publish's containers) go under $T too, even those of a killed one.
mkdir -p "$T/tmp" && export TMPDIR="$T/tmp"
BG_PIDS=()      # background processes still to reap: killed at exit
S3_PREFIXES=()  # s3:// prefixes this run wrote: removed at exit
cleanup() {
  local pid
  for pid in "${BG_PIDS[@]}"; do kill "$pid" 2> /dev/null; done
  for pid in "${BG_PIDS[@]}"; do wait "$pid" 2> /dev/null; done
  if [ -x "$AWS" ] && [ -n "${AWS_ENDPOINT_URL:-}" ]; then
    local p
    for p in "${S3_PREFIXES[@]}"; do
      timeout 30 "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 rm --recursive --quiet "$p/" > /dev/null 2>&1
    done
  fi
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$T" || exit 1

KIND=setup  # which store the checks run against, for messages
fail() { echo "FAIL [$KIND]: $*"; exit 1; }
# expect_rc CODE COMMAND...: runs COMMAND (stdout in out.txt, stderr in err.txt) and fails
# unless it exits CODE.
expect_rc() {
  local want="$1"; shift
  "$@" > out.txt 2> err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat out.txt err.txt; fail "'$*' exited $rc, want $want"; }
}
same() {  # same FILE WANT MESSAGE: FILE is byte for byte WANT
  cmp -s "$1" "$2" || fail "$3: $1 differs from $2"
}

# A python3 with numpy (the one on PATH may be a shim without it).
PY=
for p in python3 /usr/bin/python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || fail "no python3 with numpy"

# Helpers in python: test data, JSON checks, byte flips.
cat > tool.py <<'EOF'
import json, os, sys
import numpy as np

def read_st(path):
    """A safetensors file: ({name: info}, data bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]

def write_st(path, tensors):
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for a in tensors.values():
            f.write(a.astype("<u2").tobytes())

def gen(out, steps):
    """STEPS steps of two trainer shards, BF16 bits as uint16; each step moves ~1% of each
    tensor's values by +-1 in their bit pattern (a small optimizer update). Seeded."""
    rng = np.random.default_rng(20240601)
    def init(shape):  # N(0, 0.02) truncated to BF16
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
        return (x >> 16).astype(np.uint16)
    shards = [
        {"embed": init((1024, 512)),
         **{"norm.%d" % i: np.uint16(0x3F80) + rng.integers(0, 4, 512, dtype=np.uint16) for i in range(3)}},
        # w1 has >= 2^21 elements, so it is not grouped and is coded in two row pieces
        # (4096 rows of 512): a partial pull of a few rows fetches one of them.
        {"w1": init((6144, 512)), "b1": init((512,))},
    ]
    for step in range(steps):
        if step > 0:
            for tensors in shards:
                for a in tensors.values():
                    flat = a.reshape(-1)
                    k = max(1, flat.size // 100)
                    idx = rng.choice(flat.size, k, replace=False)
                    flat[idx] = (flat[idx].astype(np.int32) + rng.choice([-1, 1], k)).astype(np.uint16)
        d = os.path.join(out, "step%d" % step)
        os.makedirs(d, exist_ok=True)
        weight_map = {}
        for k, tensors in enumerate(shards):
            name = "model-%05d-of-00002.safetensors" % (k + 1)
            write_st(os.path.join(d, name), tensors)
            weight_map.update({t: name for t in tensors})
        # The sharded checkpoint's index, as trainers write it (publish carries it along).
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(a.nbytes for t in shards for a in t.values()),
                                    "step": step}, "weight_map": weight_map}, f, indent=2)

def load(path):
    with open(path) as f:
        return json.load(f)

def check(ok, msg):
    if not ok:
        sys.exit(msg)

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "gen":  # OUT STEPS
    gen(args[0], int(args[1]))
elif cmd == "get":  # FILE KEY: a top-level value of a JSON document
    print(load(args[0])[args[1]])
elif cmd == "flip":  # FILE: flips one byte inside the first tensor's data
    h, _ = read_st(args[0])
    n = int.from_bytes(open(args[0], "rb").read(8), "little")
    first = min(v["data_offsets"][0] for k, v in h.items() if k != "__metadata__")
    with open(args[0], "r+b") as f:
        f.seek(8 + n + first + 4321)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
elif cmd == "follow":  # LOG UNTIL: one JSON line per pulled step, ascending, ending at UNTIL
    lines = [l for l in open(args[0]).read().splitlines() if l.strip()]
    check(lines, "follow printed nothing")
    last = -1
    for l in lines:
        j = json.loads(l)
        check(j.get("command") == "follow" and j.get("ok") is True, "not a follow report: " + l)
        check(isinstance(j.get("lag_seconds"), (int, float)) and 0 <= j["lag_seconds"] < 60, "lag_seconds: " + l)
        check(j["step"] > last, "steps not ascending: " + l)
        check(j["steps_applied"] and j["steps_applied"][-1] == j["step"], "steps_applied: " + l)
        last = j["step"]
    check(last == int(args[1]), "the last line is step %d, want %s" % (last, args[1]))
    print(len(lines))
elif cmd == "log":  # LOG_JSON FIRST LAST ANCHOR...: steps FIRST..LAST, committed, these anchors
    steps = load(args[0])
    first, last, anchors = int(args[1]), int(args[2]), [int(a) for a in args[3:]]
    check([s["step"] for s in steps] == list(range(first, last + 1)),
          "log lists steps %s, want %d..%d" % ([s["step"] for s in steps], first, last))
    for s in steps:
        check(s["committed"] is True, "step %d is not committed" % s["step"])
        check(len(s["shards"]) == 2, "step %d has %d shards" % (s["step"], len(s["shards"])))
        is_anchor = s["anchor_step"] == s["step"]
        check(is_anchor == (s["step"] in anchors), "step %d: anchor_step %s" % (s["step"], s["anchor_step"]))
        check(s["base_step"] == (None if s["step"] == 0 else s["step"] - 1), "step %d: base_step" % s["step"])
        check(all((x["anchor_bytes"] is not None) == is_anchor for x in s["shards"]), "anchor objects of step %d" % s["step"])
        check(s["anchor_step"] == max(a for a in [0, 3, 6] if a <= s["step"]), "step %d: anchor_step" % s["step"])
        check(s["incarnation"] == "0", "step %d: incarnation %s" % (s["step"], s["incarnation"]))
        check(s["run"] == steps[0]["run"] and len(s["run"]) == 16, "step %d: run %s" % (s["step"], s["run"]))
elif cmd == "route_bytes":  # LOG_JSON ANCHOR LAST [SHARD]: bytes of the anchor's and later deltas' objects
    steps = {s["step"]: s for s in load(args[0])}
    a, n = int(args[1]), int(args[2])
    shards = [int(args[3])] if len(args) > 3 else [0, 1]
    total = sum(steps[a]["shards"][k]["anchor_bytes"] for k in shards)
    total += sum(steps[s]["shards"][k]["delta_bytes"] for s in range(a + 1, n + 1) for k in shards)
    print(total)
elif cmd == "partial":  # PART FULL TENSOR A B: PART holds only TENSOR, rows A:B of FULL's
    h, data = read_st(args[0])
    fh, fdata = read_st(args[1])
    name, a, b = args[2], int(args[3]), int(args[4])
    names = [k for k in h if k != "__metadata__"]
    check(names == [name], "the partial file holds %s, want [%s]" % (names, name))
    shape = fh[name]["shape"]
    check(h[name]["shape"] == [b - a] + shape[1:], "shape %s" % h[name]["shape"])
    check(h[name]["dtype"] == "BF16", "dtype")
    row = 2 * int(np.prod(shape[1:]))
    fb = fdata[fh[name]["data_offsets"][0]:fh[name]["data_offsets"][1]]
    pb = data[h[name]["data_offsets"][0]:h[name]["data_offsets"][1]]
    check(pb == fb[a * row:b * row], "the partial rows differ from the full file's")
elif cmd == "record":  # RECORD KEY SIZE: a shard record naming object KEY of SIZE bytes
    r = load(args[0])
    check(r["kind"] == "shard" and r["version"] == 2, "not a protocol 2 shard record")
    found = [r[kind] for kind in ("delta", "anchor") if r.get(kind) and r[kind]["key"] == args[1]]
    check(found, "the record does not name " + args[1])
    check(found[0]["size"] == int(args[2]), "the record says %d bytes, the object has %s" % (found[0]["size"], args[2]))
elif cmd == "unsign":  # ROOT_ENVELOPE OUT: a signed root made a valid unsigned one, as an attacker would
    import base64
    e = load(args[0])
    check(set(e) == {"payload", "payloadType", "signatures"}, "not a DSSE envelope: " + args[0])
    root = json.loads(base64.b64decode(e["payload"]))
    root.pop("base_root_sha256")
    root["groups"] = [[g[0], g[1], g[3], g[4]] for g in root["groups"]]
    open(args[1], "w").write(json.dumps(root) + "\n")
else:
    sys.exit("unknown command " + cmd)
EOF
tool() { "$PY" "$T/tool.py" "$@"; }

# Steps 0..8 of a two-shard run (steps 6..8 only for prune).
tool gen data 9 || fail "generating the test data"
F0=model-00001-of-00002.safetensors
F1=model-00002-of-00002.safetensors
FILES=("$F0" "$F1")

# publish_step STORE STEP: both shards publish STEP at once (two processes), the delta
# against the previous step (none for step 0), an anchor every 3 steps.
publish_step() {
  local store="$1" step="$2" k pids=() rc
  for k in 0 1; do
    local prev=()
    [ "$step" -gt 0 ] && prev=(--prev "data/step$((step - 1))/${FILES[$k]}")
    "$CLI" publish "$store" --step "$step" --next "data/step$step/${FILES[$k]}" "${prev[@]}" \
      --shard "$k/2" --anchor-every 3 --json > "publish-$step-$k.json" 2> "publish-$step-$k.err" &
    pids+=($!)
  done
  BG_PIDS+=("${pids[@]}")
  for k in 0 1; do
    wait "${pids[$k]}"; rc=$?
    [ "$rc" -eq 0 ] || { cat "publish-$step-$k.err"; fail "publish of step $step shard $k exited $rc"; }
  done
}

# same_step DIR STEP: DIR holds both shard files of STEP and its index, bit for bit.
same_step() {
  same "$1/$F0" "data/step$2/$F0" "${3:-pull} step $2 shard 0"
  same "$1/$F1" "data/step$2/$F1" "${3:-pull} step $2 shard 1"
  same "$1/model.safetensors.index.json" "data/step$2/model.safetensors.index.json" "${3:-pull} step $2 index"
}
route_is() {  # route_is WANT: the route in out.txt (a pull --json report)
  local got
  got="$(tool get out.txt route)" || fail "no JSON report: $(cat out.txt)"
  [ "$got" = "$1" ] || fail "route '$got', want '$1'"
}

# run_store KIND STORE: every check against one store (empty when starting).
run_store() {
  KIND="$1"
  local S="$2" W="$T/$1" s
  mkdir -p "$W"
  local is_s3=0
  case "$S" in s3://*) is_s3=1 ;; esac

  # 1. A follower started before anything is published ends at step 5 with the files.
  timeout 60 "$CLI" follow "$S" "$W/F" --interval 0.2 --until 5 --json > "$W/follow.log" 2> "$W/follow.err" &
  local follower=$!
  BG_PIDS+=("$follower")
  for s in 0 1 2 3 4 5; do publish_step "$S" "$s"; done
  grep -q '"committed": true' publish-5-0.json publish-5-1.json || fail "step 5 was not committed"
  wait "$follower"; local rc=$?
  [ "$rc" -ne 124 ] || fail "the follower did not reach step 5 within 60 s: $(cat "$W/follow.err")"
  [ "$rc" -eq 0 ] || { cat "$W/follow.err"; fail "follow exited $rc"; }
  same_step "$W/F" 5 follow
  local lines
  lines="$(tool follow "$W/follow.log" 5)" || { cat "$W/follow.log"; fail "follow's JSON lines"; }

  # 2. Step by step into A (each a chain of one delta); B misses steps 2..4; C is new.
  for s in 0 1 2 3 4 5; do
    expect_rc 0 "$CLI" pull "$S" "$W/A" --step "$s" --json
    same_step "$W/A" "$s"
    if [ "$s" -eq 0 ]; then route_is "anchor 0 -> 0"; else route_is "chain $((s - 1)) -> $s"; fi
  done
  expect_rc 0 "$CLI" pull "$S" "$W/A" --json
  [ "$(tool get out.txt up_to_date)" = True ] || fail "a second pull of the latest is not up to date"
  expect_rc 0 "$CLI" pull "$S" "$W/B" --step 1 --json
  same_step "$W/B" 1
  expect_rc 0 "$CLI" pull "$S" "$W/B" --json
  route_is "chain 1 -> 5"
  same_step "$W/B" 5
  expect_rc 0 "$CLI" pull "$S" "$W/C" --json
  route_is "anchor 3 -> 5"
  same_step "$W/C" 5
  local full_fetched
  full_fetched="$(tool get out.txt fetched_bytes)"

  # 4. log: steps 0..5, committed, anchors at 0 and 3.
  expect_rc 0 "$CLI" log "$S" --json
  cp out.txt "$W/log.json"
  tool log "$W/log.json" 0 5 0 3 || { cat "$W/log.json"; fail "log --json"; }

  # 3. Partial pull of rows 100:300 of w1: exactly those rows, fetching less than the
  #    route's whole objects, even less than 3/4 of shard 1's alone (w1 is coded in two
  #    pieces of 4096 rows: the second one, a third of w1, is never fetched).
  local all_objects shard0_objects shard1_objects
  all_objects="$(tool route_bytes "$W/log.json" 3 5)"
  shard0_objects="$(tool route_bytes "$W/log.json" 3 5 0)"
  shard1_objects="$(tool route_bytes "$W/log.json" 3 5 1)"
  [ "$full_fetched" -ge "$all_objects" ] || fail "a full pull fetched $full_fetched bytes < its objects' $all_objects"
  expect_rc 0 "$CLI" pull "$S" "$W/P" --tensors 'w1' --rows 100:300 --json
  route_is "anchor 3 -> 5"
  tool partial "$W/P/$F1" "data/step5/$F1" w1 100 300 || fail "partial pull of w1 rows 100:300"
  [ ! -e "$W/P/model.safetensors.index.json" ] || fail "a partial pull wrote the index of every tensor"
  local part_fetched
  part_fetched="$(tool get out.txt fetched_bytes)"
  [ $((part_fetched * 4)) -lt $((shard1_objects * 3)) ] ||
    fail "the partial pull of w1 fetched $part_fetched bytes, shard 1's objects are $shard1_objects"
  # A small tensor that a group codes (norm.1, in shard 0): shard 0's small tensors are
  # fetched whole (a group decodes onto all its members), of shard 1 only the heads.
  expect_rc 0 "$CLI" pull "$S" "$W/P2" --tensors 'norm\.1' --json
  tool partial "$W/P2/$F0" "data/step5/$F0" norm.1 0 512 || fail "partial pull of norm.1"
  local part2_fetched
  part2_fetched="$(tool get out.txt fetched_bytes)"
  [ "$part2_fetched" -lt $((shard0_objects + 16384)) ] ||
    fail "the partial pull of norm.1 fetched $part2_fetched bytes, shard 0's objects are $shard0_objects"

  # 5. Exit codes, and that a failed pull leaves DIR as it was (a new DIR: not there).
  expect_rc 6 "$CLI" pull "$S" "$W/X" --step 99
  [ ! -e "$W/X" ] || fail "a failed first pull left $(find "$W/X")"
  # A folder of the user's own files is taken only with --force.
  mkdir -p "$W/Mine" && echo notes > "$W/Mine/notes.txt"
  expect_rc 7 "$CLI" pull "$S" "$W/Mine" --step 2
  grep -q "never pulled into" err.txt || fail "pull into other files: $(cat err.txt)"
  grep -q "hint: give -f/--force to pull into it anyway" err.txt || fail "pull into other files, hint: $(cat err.txt)"
  [ "$(ls -A "$W/Mine")" = notes.txt ] || fail "a refused pull changed the folder"
  expect_rc 0 "$CLI" pull "$S" "$W/Mine" --step 2 --force
  same_step "$W/Mine" 2 "pull --force"
  [ "$(cat "$W/Mine/notes.txt")" = notes ] || fail "pull --force touched another file"
  if [ "$is_s3" = 1 ]; then
    expect_rc 0 "$CLI" pull "$S" "$W/D" --step 2
    cp -a "$W/D" "$W/D.before"
    expect_rc 5 env AWS_SECRET_ACCESS_KEY=wrong "$CLI" pull "$S" "$W/D"
    grep -qi "denied\|forbidden\|signature\|credential" err.txt || fail "wrong credentials: $(cat err.txt)"
    diff -r "$W/D" "$W/D.before" > /dev/null || fail "a pull refused by the store changed DIR"
    expect_rc 5 env -u AWS_ENDPOINT_URL_S3 AWS_ENDPOINT_URL=http://127.0.0.1:1 "$CLI" pull "$S" "$W/D" --retries 2
    diff -r "$W/D" "$W/D.before" > /dev/null || fail "a pull of an unreachable store changed DIR"
    same_step "$W/D" 2 "failed pulls"
  fi
  local pub=(publish "$S" --step 5 --prev "data/step4/$F0" --shard 0/2 --anchor-every 3)
  expect_rc 0 "$CLI" "${pub[@]}" --next "data/step5/$F0"        # the same file again: a no-op
  grep -q "already published, nothing uploaded" out.txt || fail "republish: $(cat out.txt)"
  # ... whatever it asks now of the coding (an anchor, another effort): the first stays.
  expect_rc 0 "$CLI" publish "$S" --step 5 --prev "data/step4/$F0" --shard 0/2 --anchor-every 5 -e 3 \
    --next "data/step5/$F0"
  grep -q "already published, nothing uploaded (published first without an anchor, kept)" out.txt ||
    fail "republish with --anchor-every 5: $(cat out.txt)"
  mkdir -p other && cp "data/step6/$F0" "other/$F0"              # same name, other contents
  expect_rc 7 "$CLI" "${pub[@]}" --next "other/$F0"
  grep -q "already published with another file (its tensors (names, order or contents) differ" err.txt || fail "conflict message: $(cat err.txt)"
  expect_rc 3 "$CLI" publish "$S" --step 6 --next "data/step6/$F0" --prev "data/step4/$F0" --shard 0/2
  grep -q "is not the file shard 0 published for step 5" err.txt || fail "wrong --prev message: $(cat err.txt)"
  # A DIR whose file was changed after its pull is refused (and left alone) until --reset.
  expect_rc 0 "$CLI" pull "$S" "$W/R" --step 4
  tool flip "$W/R/$F0" || fail "flipping a byte"
  cp "$W/R/$F0" "$W/R0.copy"
  expect_rc 3 "$CLI" pull "$S" "$W/R"
  grep -q -- "--reset" err.txt || fail "the refusal does not name pull --reset: $(cat err.txt)"
  same "$W/R/$F0" "$W/R0.copy" "a refused pull changed the file"
  same "$W/R/$F1" "data/step4/$F1" "a refused pull changed the other file"
  expect_rc 0 "$CLI" pull "$S" "$W/R" --reset --json
  route_is "anchor 3 -> 5"
  same_step "$W/R" 5 "pull --reset"

  # 6. The store as another S3 client sees it: awscli lists and downloads the objects, and
  #    apply rebuilds step 5 of shard 1 from step 4 and the downloaded delta.
  if [ "$is_s3" = 1 ]; then
    if [ -x "$AWS" ]; then
      local A=("$AWS" --endpoint-url "$AWS_ENDPOINT_URL")
      "${A[@]}" s3 ls --recursive "$S/" > "$W/ls.txt" 2> err.txt || fail "aws s3 ls: $(cat err.txt)"
      # Protocol 2's layout: the root, a group index, records and objects spread over
      # two-hex-digit prefixes (src/sync/PROTOCOL.md, "Object layout").
      local key
      for key in latest 'steps/000000000005\.json' 'groups/000000000005/00002/0/00000\.json' \
                 'r/[0-9a-f][0-9a-f]/000000000005-00002-00000/0/0000[01]\.json'; do
        [ "$(grep -c " ${S#s3://*/}/$key\$" "$W/ls.txt")" -ge 1 ] || { cat "$W/ls.txt"; fail "aws s3 ls lacks $key"; }
      done
      [ "$(grep -c 'o/[0-9a-f][0-9a-f]/000000000003-00002-0000[01]/anchor-[0-9a-f]*\.a3d$' "$W/ls.txt")" -eq 2 ] ||
        { cat "$W/ls.txt"; fail "aws s3 ls lacks the anchors of step 3"; }
      local delta record
      delta="$(grep -o 'o/[0-9a-f][0-9a-f]/000000000005-00002-00001/delta-[0-9a-f]*\.a3d' "$W/ls.txt")"
      [ "$(echo "$delta" | wc -l)" -eq 1 ] && [ -n "$delta" ] || { cat "$W/ls.txt"; fail "one delta of step 5 shard 1"; }
      record="$(grep -o 'r/[0-9a-f][0-9a-f]/000000000005-00002-00000/0/00001\.json' "$W/ls.txt")"
      "${A[@]}" s3 cp --quiet "$S/$record" "$W/record.json" 2> err.txt || fail "aws s3 cp record: $(cat err.txt)"
      "${A[@]}" s3 cp --quiet "$S/$delta" "$W/delta.a3d" 2> err.txt || fail "aws s3 cp delta: $(cat err.txt)"
      local listed
      listed="$(grep -F "/$delta" "$W/ls.txt" | awk '{ print $3 }')"
      [ "$listed" = "$(stat -c %s "$W/delta.a3d")" ] || fail "aws lists $listed bytes for $delta"
      tool record "$W/record.json" "$delta" "$(stat -c %s "$W/delta.a3d")" || fail "step 5's record of shard 1"
      expect_rc 0 "$CLI" apply "data/step4/$F1" "$W/delta.a3d" -o "$W/out.safetensors"
      same "$W/out.safetensors" "data/step5/$F1" "apply of the delta aws downloaded"
    elif [ "$REQUIRE_S3" = 1 ]; then
      fail "$AWS is missing (ARC_V3_REQUIRE_S3=1)"
    else
      echo "SKIP: no $AWS: the awscli interoperability checks"
    fi
  fi

  # 8. prune: steps 6..8 (anchor 6); keeping 1 anchor still keeps the anchor before the
  #    newest (3), so steps 3..8 stay; a region at step 1 then starts over from an anchor.
  expect_rc 0 "$CLI" pull "$S" "$W/Old" --step 1
  for s in 6 7 8; do publish_step "$S" "$s"; done
  expect_rc 0 "$CLI" prune "$S" --keep-anchors 1 --dry-run --json
  [ "$(tool get out.txt keep_from)" = 3 ] || fail "prune --dry-run: keep_from $(cat out.txt)"
  expect_rc 0 "$CLI" prune "$S" --keep-anchors 1 --min-age 2h --dry-run --json  # all committed just now
  [ "$(tool get out.txt keep_from)" = 0 ] || fail "prune --min-age 2h: keep_from $(cat out.txt)"
  expect_rc 2 "$CLI" prune "$S" --min-age 2w
  grep -q "wants a duration like 90s" err.txt || fail "--min-age 2w: $(cat err.txt)"
  expect_rc 0 "$CLI" log "$S" --json
  tool log out.txt 0 8 0 3 6 || fail "prune --dry-run deleted something"
  expect_rc 0 "$CLI" prune "$S" --keep-anchors 1 --json
  [ "$(tool get out.txt deleted_steps)" = "[0, 1, 2]" ] || fail "prune deleted $(cat out.txt)"
  expect_rc 0 "$CLI" log "$S" --json
  tool log out.txt 3 8 3 6 || { cat out.txt; fail "log after prune"; }
  expect_rc 0 "$CLI" pull "$S" "$W/Old" --json
  route_is "anchor 6 -> 8"
  same_step "$W/Old" 8 "pull after prune"
  expect_rc 0 "$CLI" pull "$S" "$W/A" --json  # A (step 5) still goes by its chain
  route_is "chain 5 -> 8"
  same_step "$W/A" 8

  # 9. follow routes around a damaged object, and says so: step 6's delta of shard 0
  #    damaged (a local store's objects are files), a region at step 5 follows to step
  #    8 by anchor 6 instead of its chain.
  if [ "$KIND" = dir ]; then
    expect_rc 0 "$CLI" pull "$S" "$W/Around" --step 5
    local d6
    d6="$(find "$S/o" -path '*/000000000006-00002-00000/delta-*.a3d')"
    [ -f "$d6" ] || fail "no delta of step 6 shard 0 in $S"
    printf 'X' | dd of="$d6" bs=1 seek=100 conv=notrunc 2> /dev/null
    timeout 60 "$CLI" follow "$S" "$W/Around" --interval 0.2 --until 8 --json > "$W/around.log" 2> "$W/around.err" ||
      fail "follow around a damaged delta: $(cat "$W/around.err")"
    grep -q '"rerouted":"[^"]*took anchor 6 -> 8 instead of chain 5 -> 8' "$W/around.log" ||
      fail "follow did not say it routed around: $(cat "$W/around.log")"
    same_step "$W/Around" 8 "follow around a damaged delta"
  fi

  echo "PASS [$KIND]: follow ($lines lines), pulls, partial pulls (w1 rows: $part_fetched, norm.1: $part2_fetched of $all_objects bytes), log, exit codes, prune$([ "$KIND" = dir ] && echo ", follow around a damaged delta")$([ "$is_s3" = 1 ] && echo ", awscli")"
}

# run_signed KIND STORE: the README's three commands with keys (keygen, publish
# --sign-key, pull/follow --trusted-keys), log --verify, and an attacker with the bucket's
# credentials (arc_v3 itself, and awscli or plain files) that a trusting region refuses.
run_signed() {
  KIND="$1-signed"
  local S="$2" W="$T/$1-signed" get put
  mkdir -p "$W"
  expect_rc 0 "$CLI" keygen "$W/trainer.key"
  grep -q "key id [0-9a-f]\{64\}" out.txt || fail "keygen: $(cat out.txt)"
  [ "$(stat -c %a "$W/trainer.key")" = 600 ] || fail "the private key is not mode 0600"
  expect_rc 7 "$CLI" keygen "$W/trainer.key"
  expect_rc 0 "$CLI" keygen "$W/evil.key" --json
  # Shard 0 names its key on the command line, shard 1 through the environment.
  local step k
  for step in 0 1 2; do
    for k in 0 1; do
      local prev=() key=(--sign-key "$W/trainer.key")
      [ "$step" -gt 0 ] && prev=(--prev "data/step$((step - 1))/${FILES[$k]}")
      [ "$k" = 1 ] && key=()
      ARC_V3_SIGN_KEY="$W/trainer.key" expect_rc 0 "$CLI" publish "$S" --step "$step" \
        --next "data/step$step/${FILES[$k]}" "${prev[@]}" --shard "$k/2" "${key[@]}" -q
    done
  done
  expect_rc 0 "$CLI" pull "$S" "$W/R" --step 1 --trusted-keys "$W/trainer.key.pub"
  same_step "$W/R" 1 "trusting pull"
  expect_rc 0 timeout 60 "$CLI" follow "$S" "$W/R" --interval 0.2 --until 2 --trusted-keys "$W/trainer.key.pub" -q
  same_step "$W/R" 2 "trusting follow"
  ! grep -q "not authenticated" err.txt || fail "a trusting follow says steps are not authenticated"
  expect_rc 0 timeout 60 "$CLI" follow "$S" "$W/Plain" --interval 0.2 --until 2 -q
  grep -q "steps are not authenticated" err.txt || fail "follow without --trusted-keys says nothing: $(cat err.txt)"
  # Trust stays on: the trusting DIR refuses a pull or follow without keys, and an emptied
  # ARC_V3_TRUSTED_KEYS is no way to switch it off (exit 8, DIR unchanged).
  local held
  held="$(cd "$W/R" && find . -type f ! -name lock -exec sha256sum {} + | sort)"
  expect_rc 8 "$CLI" pull "$S" "$W/R"
  grep -q "pulled trusting key" err.txt || fail "a pull without --trusted-keys of a trusting DIR: $(cat err.txt)"
  expect_rc 8 timeout 60 "$CLI" follow "$S" "$W/R" --interval 0.2 --until 2
  ARC_V3_TRUSTED_KEYS= expect_rc 8 "$CLI" pull "$S" "$W/R"
  grep -q "ARC_V3_TRUSTED_KEYS is set but empty" err.txt || fail "an empty ARC_V3_TRUSTED_KEYS: $(cat err.txt)"
  ARC_V3_TRUSTED_KEYS= expect_rc 8 "$CLI" pull "$S" "$W/Fresh"
  [ ! -e "$W/Fresh" ] || fail "an empty ARC_V3_TRUSTED_KEYS made a directory"
  # 1.x's spelling, ARC_V3_TRUST, is read too (and so refused empty).
  ARC_V3_TRUST= expect_rc 8 "$CLI" pull "$S" "$W/Fresh"
  grep -q "ARC_V3_TRUST is set but empty" err.txt || fail "an empty ARC_V3_TRUST: $(cat err.txt)"
  [ "$(cd "$W/R" && find . -type f ! -name lock -exec sha256sum {} + | sort)" = "$held" ] ||
    fail "a refused pull without keys changed DIR"
  # A trust file holds every key it lists (here the trainer's second); a private key
  # given for trust is refused, saying what to give.
  cat "$W/evil.key.pub" "$W/trainer.key.pub" > "$W/both.pub"
  # --trust, 1.x's spelling of --trusted-keys, still works (hidden from --help).
  expect_rc 0 "$CLI" pull "$S" "$W/R" --trust "$W/both.pub"
  "$CLI" pull --help | grep -q -- "--trusted-keys" || fail "pull --help names no --trusted-keys"
  ! "$CLI" pull --help | grep -q -- "--trust " || fail "pull --help shows the old --trust"
  expect_rc 1 "$CLI" pull "$S" "$W/R" --trusted-keys "$W/trainer.key"
  grep -q "is a private key: trust takes the public half" err.txt || fail "a private key for --trusted-keys: $(cat err.txt)"
  expect_rc 0 "$CLI" log "$S" --verify --trusted-keys "$W/trainer.key.pub"
  [ "$(grep -c ' verified (key ' out.txt)" = 3 ] || fail "log --verify: $(cat out.txt)"
  expect_rc 8 "$CLI" log "$S" --verify --trusted-keys "$W/evil.key.pub"
  grep -q "NOT verified" out.txt || fail "log --verify with another key: $(cat out.txt)"
  # The attacker publishes its own step 3 (signed by its key, then unsigned): refused,
  # exit 8, DIR unchanged.
  local before
  before="$(cd "$W/R" && find . -type f ! -name lock -exec sha256sum {} + | sort)"
  for k in 0 1; do
    expect_rc 0 "$CLI" publish "$S" --step 3 --next "data/step3/${FILES[$k]}" --shard "$k/2" \
      --incarnation evil --sign-key "$W/evil.key" -q
  done
  expect_rc 8 "$CLI" pull "$S" "$W/R" --trusted-keys "$W/trainer.key.pub" --json
  [ "$(tool get out.txt error)" = untrusted ] || fail "pull of the attacker's step: $(cat out.txt)"
  [ "$(cd "$W/R" && find . -type f ! -name lock -exec sha256sum {} + | sort)" = "$before" ] ||
    fail "a refused pull changed DIR"
  # A trusting follow reports the step it refuses and goes on watching (stopped here by
  # timeout's TERM, exit 124), DIR unchanged.
  expect_rc 124 timeout 3 "$CLI" follow "$S" "$W/R" --interval 0.2 --trusted-keys "$W/trainer.key.pub"
  grep -q "refused step 3" err.txt || fail "a trusting follow of a forged step: $(cat err.txt)"
  [ "$(cd "$W/R" && find . -type f ! -name lock -exec sha256sum {} + | sort)" = "$before" ] ||
    fail "a refusing follow changed DIR"
  # ... and the trainer's step 2 rewritten as an unsigned root of the same contents, by
  # another client: a new trusting region refuses it (exit 8, nothing left), an
  # untrusting one takes it.
  if [ "$1" = s3 ]; then
    [ -x "$AWS" ] || { echo "SKIP: no $AWS: the signed store's awscli attack"; return; }
    get=("$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp --quiet "$S/steps/000000000002.json")
    put=("$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp --quiet "$W/plain.json" "$S/steps/000000000002.json")
  else
    get=(cp "$S/steps/000000000002.json")
    put=(cp "$W/plain.json" "$S/steps/000000000002.json")
  fi
  "${get[@]}" "$W/root2.json" || fail "reading the root of step 2"
  tool unsign "$W/root2.json" "$W/plain.json"
  "${put[@]}" || fail "rewriting the root of step 2"
  expect_rc 8 "$CLI" pull "$S" "$W/New" --step 2 --trusted-keys "$W/trainer.key.pub"
  grep -q "not signed" err.txt || fail "an unsigned root: $(cat err.txt)"
  [ ! -e "$W/New" ] || fail "a refused first pull left $W/New"
  expect_rc 0 "$CLI" pull "$S" "$W/Unauthenticated" --step 2
  echo "PASS [$KIND]: keygen, signed publish, trusting pull and follow, log --verify, the attacker's steps refused"
}

# 7. A read-only http(s):// store: a short run published through S3 to the public bucket
#    is followed and pulled over plain HTTP without credentials. An anonymous reader gets
#    HTTP 403 for a key that does not exist (it may not list the bucket): the follower,
#    started before anything is published, must wait through those.
run_http() {
  KIND=http
  local prefix="cli-test-$$-$RANDOM-http" s
  local S="$ARC_V3_TEST_PUBLIC_S3/$prefix" H="$ARC_V3_TEST_PUBLIC_HTTP/$prefix"
  local anon=(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN)
  S3_PREFIXES+=("$S")
  mkdir -p "$T/http"
  timeout 60 "${anon[@]}" "$CLI" follow "$H" "$T/http/F" --interval 0.2 --until 2 --json \
    > "$T/http/follow.log" 2> "$T/http/follow.err" &
  local follower=$!
  BG_PIDS+=("$follower")
  for s in 0 1 2; do
    local prev=()
    [ "$s" -gt 0 ] && prev=(--prev "data/step$((s - 1))/$F1")
    expect_rc 0 "$CLI" publish "$S" --step "$s" --next "data/step$s/$F1" "${prev[@]}" --shard 0/1
  done
  wait "$follower"; local rc=$?
  [ "$rc" -ne 124 ] || fail "the HTTP follower did not reach step 2 within 60 s: $(cat "$T/http/follow.err")"
  [ "$rc" -eq 0 ] || { cat "$T/http/follow.err"; fail "follow over HTTP exited $rc"; }
  same "$T/http/F/$F1" "data/step2/$F1" "follow over HTTP"
  tool follow "$T/http/follow.log" 2 > /dev/null || { cat "$T/http/follow.log"; fail "follow's JSON lines"; }

  expect_rc 0 "${anon[@]}" "$CLI" pull "$H" "$T/http/H" --step 1 --json
  same "$T/http/H/$F1" "data/step1/$F1" "pull --step 1 over HTTP"
  expect_rc 0 "${anon[@]}" "$CLI" pull "$H" "$T/http/H" --json
  route_is "chain 1 -> 2"
  same "$T/http/H/$F1" "data/step2/$F1" "pull over HTTP"
  same "$T/http/H/model.safetensors.index.json" "data/step2/model.safetensors.index.json" "the index over HTTP"
  expect_rc 0 "${anon[@]}" "$CLI" pull "$H" "$T/http/H2" --json
  route_is "anchor 0 -> 2"
  same "$T/http/H2/$F1" "data/step2/$F1" "pull over HTTP into a new directory"
  expect_rc 6 "${anon[@]}" "$CLI" pull "$H" "$T/http/H" --step 99
  same "$T/http/H/$F1" "data/step2/$F1" "a pull of a missing step"
  # The private bucket (the S3 run's steps) over the same endpoint: refused, nothing
  # written. 403 to an anonymous reader reads as "not found or not readable": 5 or 6.
  local bucket="${PREFIX#s3://}"
  "${anon[@]}" "$CLI" pull "${AWS_ENDPOINT_URL%/}/$bucket" "$T/http/Denied" --retries 2 > out.txt 2> err.txt
  rc=$?
  [ "$rc" -eq 5 ] || [ "$rc" -eq 6 ] || { cat err.txt; fail "an anonymous pull of the private bucket exited $rc, want 5 or 6"; }
  [ ! -e "$T/http/Denied/$F1" ] || fail "a refused pull wrote a file"
  echo "PASS [http]: publish to $ARC_V3_TEST_PUBLIC_S3, anonymous follow and pulls from $ARC_V3_TEST_PUBLIC_HTTP"
}

if [ -z "${ARC_V3_TEST_S3:-}" ] && [ "$REQUIRE_S3" = 1 ]; then
  KIND=s3; fail "ARC_V3_REQUIRE_S3=1 but ARC_V3_TEST_S3 is unset"
fi
# A local store that does not exist yet: the follower waits, the first publish makes it.
expect_rc 6 "$CLI" pull "$T/dirstore" "$T/nothing"
grep -q "local store '.*dirstore' does not exist" err.txt || fail "a missing store: $(cat err.txt)"
run_store dir "$T/dirstore"
run_signed dir "$T/signed-dirstore"

if [ -z "${ARC_V3_TEST_S3:-}" ]; then
  echo "SKIP: no S3 server (ARC_V3_TEST_S3 unset)"
else
  PREFIX="$ARC_V3_TEST_S3/cli-test-$$-$RANDOM"
  S3_PREFIXES+=("$PREFIX")
  run_store s3 "$PREFIX"
  run_signed s3 "$PREFIX-signed"
  S3_PREFIXES+=("$PREFIX-signed")
  if [ -n "${ARC_V3_TEST_PUBLIC_S3:-}" ] && [ -n "${ARC_V3_TEST_PUBLIC_HTTP:-}" ]; then
    run_http
  elif [ "$REQUIRE_S3" = 1 ]; then
    KIND=http; fail "ARC_V3_REQUIRE_S3=1 but ARC_V3_TEST_PUBLIC_S3 or ARC_V3_TEST_PUBLIC_HTTP is unset"
  else
    echo "SKIP: no public bucket (ARC_V3_TEST_PUBLIC_S3, ARC_V3_TEST_PUBLIC_HTTP unset): the http:// store checks"
  fi
fi
echo "sync_cli_test: all checks passed in $((SECONDS - START)) s"
