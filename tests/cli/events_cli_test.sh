#!/bin/bash
# End-to-end test of `arc_v3 follow --events` and `arc_v3 mirror --follow --events` against
# radosgw's own bucket notifications: a topic pushing to each one's endpoint and
# notifications filtered to the run's `latest` key, set up with awscli as docs/regions.md
# shows; a follower and a mirror polling only every 60 s must take each new step, bit for
# bit, long before their next poll would have.
#
#   bash tests/cli/events_cli_test.sh bazel-bin/tools/cli/arc_v3_cli
#
# Environment: that of tests/s3/radosgw.sh (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION, ARC_V3_TEST_S3). Without ARC_V3_TEST_S3 or awscli it
# is skipped ("SKIP: ..."), unless ARC_V3_REQUIRE_S3=1, which makes that a failure. The test
# makes its own bucket and topic (a bucket's notifications are the bucket's), removed at exit.
set -u
[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/arc_v3_cli"; exit 2; }
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$CLI" ] || { echo "FAIL: $CLI is not executable"; exit 1; }
AWS=/usr/bin/aws  # Debian's awscli, which ignores AWS_ENDPOINT_URL: --endpoint-url below
INTERVAL=60       # the follower's poll interval: only an event explains an earlier pull

if [ -z "${ARC_V3_TEST_S3:-}" ] || [ -z "${AWS_ENDPOINT_URL:-}" ] || [ ! -x "$AWS" ]; then
  if [ "${ARC_V3_REQUIRE_S3:-0}" = 1 ]; then
    echo "FAIL: ARC_V3_REQUIRE_S3=1 but no S3 server or awscli"
    exit 1
  fi
  echo "SKIP: no S3 server (ARC_V3_TEST_S3, AWS_ENDPOINT_URL) or no $AWS"
  exit 0
fi
aws_() { timeout 60 "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" "$@"; }

T="$(mktemp -d)"
mkdir -p "$T/tmp" && export TMPDIR="$T/tmp"
BUCKET="arc-v3-events-$$-$RANDOM"
TOPIC_ARN=
MIRROR_TOPIC_ARN=
FOLLOWER=
MIRROR=
cleanup() {
  [ -n "$FOLLOWER" ] && { kill "$FOLLOWER" 2> /dev/null; wait "$FOLLOWER" 2> /dev/null; }
  [ -n "$MIRROR" ] && { kill "$MIRROR" 2> /dev/null; wait "$MIRROR" 2> /dev/null; }
  aws_ s3 rb --force "s3://$BUCKET" > /dev/null 2>&1
  [ -n "$TOPIC_ARN" ] && aws_ sns delete-topic --topic-arn "$TOPIC_ARN" > /dev/null 2>&1
  [ -n "$MIRROR_TOPIC_ARN" ] && aws_ sns delete-topic --topic-arn "$MIRROR_TOPIC_ARN" > /dev/null 2>&1
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$T" || exit 1
fail() { echo "FAIL: $*"; [ -f follow.err ] && tail -20 follow.err; exit 1; }

PY=
for p in python3 /usr/bin/python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || fail "no python3 with numpy"

cat > tool.py <<'EOF'
import json, os, socket, sys
import numpy as np

def write_st(path, tensors):
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for a in tensors.values():
            f.write(a.astype("<u2").tobytes())

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "gen":  # OUT STEPS: one shard, ~1% of its BF16 values moved per step
    rng = np.random.default_rng(56)
    t = {"w": (rng.standard_normal((512, 512), dtype=np.float32) * 0.02).view(np.uint32) >> 16,
         "b": (rng.standard_normal((512,), dtype=np.float32) * 0.02).view(np.uint32) >> 16}
    t = {k: v.astype(np.uint16) for k, v in t.items()}
    for step in range(int(args[1])):
        for a in t.values():
            flat = a.reshape(-1)
            idx = rng.choice(flat.size, max(1, flat.size // 100), replace=False)
            flat[idx] ^= 1
        os.makedirs("%s/step%d" % (args[0], step))
        write_st("%s/step%d/model.safetensors" % (args[0], step), t)
elif cmd == "port":  # a free TCP port on 127.0.0.1
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
EOF
tool() { "$PY" tool.py "$@"; }
holds() { grep -Eq "\"step\":$1[,}]" follow.log; }  # follow --json has reported STEP
mkdir data && tool gen data 3 || fail "test data"

# The store's events: a bucket of its own, a topic pushing to the follower's endpoint and a
# notification of objects created under RUN/latest (radosgw filters by key prefix).
PORT="$(tool port)" || fail "no free port"
MIRROR_PORT="$(tool port)" || fail "no free port"
[ "$PORT" != "$MIRROR_PORT" ] || fail "the same port twice"
STORE="s3://$BUCKET/run"
aws_ s3api create-bucket --bucket "$BUCKET" > /dev/null || fail "create-bucket $BUCKET"
TOPIC_ARN="$(aws_ sns create-topic --name "$BUCKET" \
  --attributes "push-endpoint=http://127.0.0.1:$PORT" --query TopicArn --output text)" ||
  fail "sns create-topic"
MIRROR_TOPIC_ARN="$(aws_ sns create-topic --name "$BUCKET-mirror" \
  --attributes "push-endpoint=http://127.0.0.1:$MIRROR_PORT" --query TopicArn --output text)" ||
  fail "sns create-topic (mirror)"
cat > notification.json <<EOF
{"TopicConfigurations": [{"Id": "arc-v3-latest", "TopicArn": "$TOPIC_ARN",
  "Events": ["s3:ObjectCreated:*"],
  "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "run/latest"}]}}},
 {"Id": "arc-v3-latest-mirror", "TopicArn": "$MIRROR_TOPIC_ARN",
  "Events": ["s3:ObjectCreated:*"],
  "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "run/latest"}]}}}]}
EOF
aws_ s3api put-bucket-notification-configuration --bucket "$BUCKET" \
  --notification-configuration file://notification.json ||
  fail "put-bucket-notification-configuration"

# A malformed address is refused before anything is pulled.
"$CLI" follow "$STORE" bad --events 127.0.0.1 > out.txt 2> err.txt &&
  fail "--events 127.0.0.1 was accepted"
grep -q "HOST:PORT" err.txt || fail "--events 127.0.0.1: $(cat err.txt)"

# The follower polls once at its start (nothing is committed: it says it waits), then only
# every $INTERVAL s.
"$CLI" follow "$STORE" F --events "127.0.0.1:$PORT" --interval "$INTERVAL" --until 2 --json \
  > follow.log 2> follow.err &
FOLLOWER=$!
START=$SECONDS
while ! grep -qs "waiting" follow.err && [ $((SECONDS - START)) -lt 30 ]; do
  kill -0 "$FOLLOWER" 2> /dev/null || fail "the follower exited"
  sleep 0.1
done
grep -qs "waiting" follow.err || fail "the follower never polled"
# The mirror, likewise, into a local store M in the region.
"$CLI" mirror "$STORE" M --follow --events "127.0.0.1:$MIRROR_PORT" --interval "$INTERVAL" \
  --until 2 --json > mirror.log 2> mirror.err &
MIRROR=$!
while ! grep -qs "waiting" mirror.err && [ $((SECONDS - START)) -lt 30 ]; do
  kill -0 "$MIRROR" 2> /dev/null || { cat mirror.err; fail "the mirror exited"; }
  sleep 0.1
done
grep -qs "waiting" mirror.err || { cat mirror.err; fail "the mirror never polled"; }
mirrored() { grep -Eq "\"step\":$1[,}]" mirror.log; }  # mirror --json has reported STEP

for step in 0 1 2; do
  prev=()
  [ "$step" -gt 0 ] && prev=(--prev "data/step$((step - 1))/model.safetensors")
  "$CLI" publish "$STORE" --step "$step" --next "data/step$step/model.safetensors" "${prev[@]}" \
    --shard 0/1 -q > publish.out 2>&1 || { cat publish.out; fail "publish of step $step"; }
  # Pulled long before the next poll: only the event can have woken the follower.
  committed=$SECONDS
  while ! holds "$step" && [ $((SECONDS - committed)) -lt 30 ]; do sleep 0.1; done
  holds "$step" || fail "step $step not pulled within 30 s of its commit"
  cmp -s F/model.safetensors "data/step$step/model.safetensors" ||
    fail "step $step: the follower's file differs from the trainer's"
  while ! mirrored "$step" && [ $((SECONDS - committed)) -lt 30 ]; do sleep 0.1; done
  mirrored "$step" || { cat mirror.err; fail "step $step not mirrored within 30 s of its commit"; }
done
wait "$FOLLOWER"; rc=$?
FOLLOWER=
[ "$rc" -eq 0 ] || fail "follow exited $rc"
wait "$MIRROR"; rc=$?
MIRROR=
[ "$rc" -eq 0 ] || { cat mirror.err; fail "mirror exited $rc"; }
"$CLI" pull M R -q || fail "pull of the mirror's copy"
cmp -s R/model.safetensors data/step2/model.safetensors || fail "the mirror's step 2 differs"
elapsed=$((SECONDS - START))
[ "$elapsed" -lt "$INTERVAL" ] ||
  fail "steps 0..2 took $elapsed s: not before the first poll after the start"
echo "PASS: follow --events and mirror --follow --events took steps 0..2 from radosgw's" \
  "notifications in $elapsed s (polling every $INTERVAL s)"
