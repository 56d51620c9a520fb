#!/bin/bash
# End-to-end test of `arc_v3 mirror` with real processes: a trainer publishes signed steps
# into SRC while `arc_v3 mirror --follow --trusted-keys` copies them into DST and a region's
# `arc_v3 follow --trusted-keys` follows DST. The mirror is killed with SIGKILL in the middle of
# copying steps (some of a step's objects in DST, not its root) and restarted; after each
# kill DST is a valid store (a pull of its latest succeeds and is bit-exact), and the
# region reaches the trainer's last step bit-exactly. Then DST is pruned on its own.
#
#   bash tests/cli/mirror_cli_test.sh bazel-bin/tools/cli/arc_v3_cli
#
# Runs against local stores and, when ARC_V3_TEST_S3 names a bucket (tests/s3/radosgw.sh;
# with AWS_ENDPOINT_URL and the credentials), from an s3:// SRC into an s3:// DST too.
# Without it that half is skipped ("SKIP: ..."), unless ARC_V3_REQUIRE_S3=1.
set -u
[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/arc_v3_cli"; exit 2; }
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$CLI" ] || { echo "FAIL: $CLI is not executable"; exit 1; }
AWS=/usr/bin/aws
REQUIRE_S3="${ARC_V3_REQUIRE_S3:-0}"
LAST=7  # steps 0..LAST; anchors at 0, 3, 6

T="$(mktemp -d)"
mkdir -p "$T/tmp" && export TMPDIR="$T/tmp"
BG_PIDS=()
S3_PREFIXES=()
cleanup() {
  local pid
  for pid in "${BG_PIDS[@]}"; do kill -9 "$pid" 2> /dev/null; done
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

KIND=setup
fail() { echo "FAIL [$KIND]: $*"; exit 1; }
expect_rc() {
  local want="$1"; shift
  "$@" > out.txt 2> err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat out.txt err.txt; fail "'$*' exited $rc, want $want"; }
}

PY=
for p in python3 /usr/bin/python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || fail "no python3 with numpy"

cat > tool.py <<'EOF'
import json, os, signal, sys, time

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
    """Two trainer shards, BF16 bits; each step moves ~1% of the values by one unit."""
    import numpy as np
    rng = np.random.default_rng(20261207)
    def init(shape):
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
        return (x >> 16).astype(np.uint16)
    shards = [{"embed": init((2048, 512)), "norm": init((512,))}, {"w1": init((4096, 512))}]
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
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"step": step}, "weight_map": weight_map}, f, indent=2)

def killmid(dst, step, pid, timeout, ready):
    """SIGKILLs PID once DST (a local store) holds an object of STEP but not its root.
    Prints "killed", or "late" if the root came first, or "timeout". Creates READY once
    it watches."""
    open(ready, "w").close()
    prefix = "%012d-" % step
    root = os.path.join(dst, "steps", "%012d.json" % step)
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(root):
            print("late"); return
        o = os.path.join(dst, "o")
        try:
            for hh in os.listdir(o):
                for name in os.listdir(os.path.join(o, hh)):
                    if name.startswith(prefix) and os.listdir(os.path.join(o, hh, name)):
                        if os.path.exists(root):
                            print("late"); return
                        os.kill(pid, signal.SIGKILL)
                        print("killed"); return
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    print("timeout")

def mirrorlog(path):
    """The mirror's JSON lines: the steps copied, and objects skipped (found in DST)."""
    steps, skipped = [], 0
    for l in open(path).read().splitlines():
        if l.strip():
            j = json.loads(l)
            if j.get("command") != "mirror" or j.get("ok") is not True:
                sys.exit("not a mirror report: " + l)
            steps += j["steps_copied"]
            skipped += j["skipped_objects"]
    print(" ".join(map(str, steps)), skipped)

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "gen":
    gen(args[0], int(args[1]))
elif cmd == "killmid":
    killmid(args[0], int(args[1]), int(args[2]), float(args[3]), args[4])
elif cmd == "mirrorlog":
    mirrorlog(args[0])
EOF

"$PY" tool.py gen data $((LAST + 1)) || fail "generating the test data"
F0=model-00001-of-00002.safetensors
F1=model-00002-of-00002.safetensors
expect_rc 0 "$CLI" keygen trainer.key

publish_step() {  # STORE STEP: both shards, signed (the second commits)
  local store="$1" step="$2" k
  for k in 0 1; do
    local f; f=$([ "$k" = 0 ] && echo "$F0" || echo "$F1")
    local prev=()
    [ "$step" -gt 0 ] && prev=(--prev "data/step$((step - 1))/$f")
    expect_rc 0 "$CLI" publish "$store" --step "$step" --next "data/step$step/$f" "${prev[@]}" \
      --shard "$k/2" --anchor-every 3 --sign-key trainer.key -q
  done
}

# valid DST W: DST is a valid store: no latest yet, or a pull of it is bit-exact.
valid() {
  local dst="$1" w="$2"
  rm -rf "$w/check"
  "$CLI" pull "$dst" "$w/check" --trusted-keys trainer.key.pub --json > "$w/check.json" 2> "$w/check.err"
  local rc=$?
  if [ "$rc" = 6 ] && grep -q "no committed step yet" "$w/check.err"; then return 0; fi
  [ "$rc" = 0 ] || { cat "$w/check.err"; fail "a pull of $dst after the kill exited $rc"; }
  local step; step=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$w/check.json")
  cmp -s "$w/check/$F0" "data/step$step/$F0" && cmp -s "$w/check/$F1" "data/step$step/$F1" ||
    fail "DST's step $step is not the trainer's"
}

start_mirror() {  # SRC DST LOG
  "$CLI" mirror "$1" "$2" --follow --trusted-keys trainer.key.pub --interval 0.05 --parallel 1 --json \
    > "$3" 2>> "$W/mirror.err" &
  MIRROR=$!
  BG_PIDS+=("$MIRROR")
}

# run_kind SRC DST LOCAL_DST: the whole scenario; LOCAL_DST is DST's directory ("" for s3).
run_kind() {
  local src="$1" dst="$2" local_dst="$3"
  W="$T/$KIND" && mkdir -p "$W"
  publish_step "$src" 0
  start_mirror "$src" "$dst" "$W/mirror.0.log"
  timeout 120 "$CLI" follow "$dst" "$W/region" --trusted-keys trainer.key.pub --interval 0.05 --until "$LAST" \
    --json > "$W/follow.log" 2> "$W/follow.err" &
  local follower=$!
  BG_PIDS+=("$follower")
  local step killed=0 runs=1
  for step in $(seq 1 "$LAST"); do
    if [ -n "$local_dst" ]; then  # watching before the step is committed
      rm -f "$W/ready"
      "$PY" tool.py killmid "$local_dst" "$step" "$MIRROR" 60 "$W/ready" > "$W/killmid.txt" &
      local watcher=$!
      while [ ! -e "$W/ready" ]; do sleep 0.01; done
    fi
    publish_step "$src" "$step"
    if [ -n "$local_dst" ]; then
      wait "$watcher"
      local what; what=$(cat "$W/killmid.txt")
      [ "$what" = timeout ] && fail "the mirror did not copy step $step within 60 s"
      [ "$what" = killed ] || continue
      killed=$((killed + 1))
    else  # s3: a kill at some moment of the copy
      sleep "0.0$((RANDOM % 10))"
      kill -9 "$MIRROR" 2> /dev/null
    fi
    { wait "$MIRROR"; } 2> /dev/null
    valid "$dst" "$W"
    start_mirror "$src" "$dst" "$W/mirror.$runs.log"
    runs=$((runs + 1))
  done
  wait "$follower" || { cat "$W/follow.err"; fail "follow of DST exited $?"; }
  cmp -s "$W/region/$F0" "data/step$LAST/$F0" && cmp -s "$W/region/$F1" "data/step$LAST/$F1" ||
    fail "the region's files are not the trainer's step $LAST"
  cmp -s "$W/region/model.safetensors.index.json" "data/step$LAST/model.safetensors.index.json" ||
    fail "the region's index file is not the trainer's"
  kill -9 "$MIRROR" 2> /dev/null; { wait "$MIRROR"; } 2> /dev/null
  if [ -n "$local_dst" ]; then
    [ "$killed" -ge 1 ] || fail "no kill landed mid-step (every root came first)"
    # The restarted mirrors found what the killed ones had written.
    local skipped=0 i
    for i in $(seq 1 $((runs - 1))); do
      skipped=$((skipped + $("$PY" tool.py mirrorlog "$W/mirror.$i.log" | awk '{print $NF}')))
    done
    [ "$skipped" -ge 1 ] || fail "no restarted mirror skipped an object the killed one had copied"
  fi
  # A one-shot mirror now has nothing to do; DST verifies as signed; DST is pruned on its own.
  expect_rc 0 "$CLI" mirror "$src" "$dst" --trusted-keys trainer.key.pub --json
  grep -q '"up_to_date": true' out.txt || { cat out.txt; fail "a second mirror copied again"; }
  expect_rc 0 "$CLI" log "$dst" --verify --trusted-keys trainer.key.pub
  expect_rc 0 "$CLI" prune "$dst" --keep-anchors 1 --json
  expect_rc 0 "$CLI" log "$src" --json
  "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s[0]["step"] == 0 else 1)' out.txt ||
    fail "pruning DST touched SRC"
  rm -rf "$W/fresh"
  expect_rc 0 "$CLI" pull "$dst" "$W/fresh" --trusted-keys trainer.key.pub
  cmp -s "$W/fresh/$F0" "data/step$LAST/$F0" || fail "a pull of the pruned DST is not step $LAST"
  # Another trust: refused (exit 8), DST untouched.
  expect_rc 0 "$CLI" keygen other.key
  expect_rc 8 "$CLI" mirror "$src" "$W/other-dst" --trusted-keys other.key.pub
  rm -f other.key other.key.pub
  echo "ok [$KIND]: $killed kills seen mid-step, $((runs - 1)) restarts, region at step $LAST bit-exact"
}

KIND=local
run_kind "$T/src" "$T/dst" "$T/dst"

if [ -z "${ARC_V3_TEST_S3:-}" ]; then
  [ "$REQUIRE_S3" = 1 ] && { KIND=s3; fail "ARC_V3_REQUIRE_S3=1 but ARC_V3_TEST_S3 is unset"; }
  echo "SKIP: no S3 server (ARC_V3_TEST_S3 unset): the s3:// mirror did not run"
else
  KIND=s3
  PREFIX="$ARC_V3_TEST_S3/mirror-cli-$$-$RANDOM"
  S3_PREFIXES+=("$PREFIX-src" "$PREFIX-dst")
  run_kind "$PREFIX-src" "$PREFIX-dst" ""
fi
echo "PASS"
