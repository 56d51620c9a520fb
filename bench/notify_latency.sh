#!/usr/bin/env bash
# How soon a region starts pulling a committed step: `arc_v3 follow` told by radosgw's
# bucket notifications (--events, a topic pushing to it and a notification of the run's
# `latest`) against the default poll every 2 s, on one machine (loopback).
#
# Per step, commit to pull start: from the write of `latest` that commits the step (its
# time as radosgw records it: the eventTime of a second notification, to this script's own
# endpoint, in both modes) to the start of the follower's pull of it (the moment its --json
# line is read, less the pull's own total seconds). Steps are published one at a time, each
# after a random pause of 0.1-2.1 s (seeded), so commits fall anywhere between polls.
# One shard of 4 BF16 tensors of 512x512 per step, ~1% of values changed.
#   bench/notify_latency.sh [--steps N] [--interval S] [--out PREFIX]
# Writes PREFIX.{txt,json} (default bench_out/notify_latency).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=20
interval=2
out=bench_out/notify_latency
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //tools/cli:arc_v3_cli >/dev/null
A="$PWD/bazel-bin/tools/cli/arc_v3_cli"
PY=/usr/bin/python3  # Debian's, with numpy
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_notify.XXXXXX")
rgw="$work/rgw"
cleanup() { tests/s3/radosgw.sh stop "$rgw" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$(dirname "$out")"

port=""
for p in $(seq 18480 2 18980); do
  if ! ss -Htln "sport = :$p or sport = :$((p + 1))" | grep -q .; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port for radosgw" >&2; exit 1; }
tests/s3/radosgw.sh start "$rgw" "$port" >/dev/null
# shellcheck source=/dev/null
source "$rgw/env.sh"

"$PY" - "$A" "$work" "$steps" "$interval" "$out" <<'PY'
import datetime, http.server, json, os, random, socket, statistics, subprocess, sys, threading, time
import numpy as np

cli, work, out = sys.argv[1], sys.argv[2], sys.argv[5]
steps, interval = int(sys.argv[3]), float(sys.argv[4])
aws = ["/usr/bin/aws", "--endpoint-url", os.environ["AWS_ENDPOINT_URL"]]
bucket = os.environ["ARC_V3_TEST_S3"][len("s3://"):]

def write_st(path, tensors):
    header, off = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(a.tobytes() for a in tensors.values()))

rng = np.random.default_rng(56)
tensors = {f"w{i}": ((rng.standard_normal((512, 512), dtype=np.float32) * 0.02).view(np.uint32)
                     >> 16).astype(np.uint16) for i in range(4)}
for step in range(steps + 1):
    for a in tensors.values():
        flat = a.reshape(-1)
        flat[rng.choice(flat.size, flat.size // 100, replace=False)] ^= 1
    os.makedirs(f"{work}/data/{step}")
    write_st(f"{work}/data/{step}/model.safetensors", tensors)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def publish(store, step):
    prev = ["--prev", f"{work}/data/{step - 1}/model.safetensors"] if step else []
    subprocess.run([cli, "publish", store, "--step", str(step), "--next",
                    f"{work}/data/{step}/model.safetensors", *prev, "--shard", "0/1", "-q"],
                   check=True)

def notify(topic, endpoint, key):
    """A topic pushing to ENDPOINT and a notification of objects created under KEY."""
    arn = subprocess.run(aws + ["sns", "create-topic", "--name", topic, "--attributes",
                                f"push-endpoint={endpoint}", "--query", "TopicArn",
                                "--output", "text"],
                         check=True, capture_output=True, text=True).stdout.strip()
    rule = {"Name": "prefix", "Value": key}
    config = {"TopicConfigurations": [{"Id": topic, "TopicArn": arn,
                                       "Events": ["s3:ObjectCreated:*"],
                                       "Filter": {"Key": {"FilterRules": [rule]}}}]}
    subprocess.run(aws + ["s3api", "put-bucket-notification-configuration", "--bucket", bucket,
                          "--notification-configuration", json.dumps(config)], check=True)

# The commit clock: radosgw's eventTime of each write of a `latest`, by key, in order.
written = {}
clock = threading.Condition()

class Clock(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        for r in body["Records"]:
            t = datetime.datetime.strptime(r["eventTime"], "%Y-%m-%dT%H:%M:%S.%fZ")
            with clock:
                written.setdefault(r["s3"]["object"]["key"], []).append(
                    t.replace(tzinfo=datetime.timezone.utc).timestamp())
                clock.notify_all()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

clock_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Clock)
threading.Thread(target=clock_server.serve_forever, daemon=True).start()

def commit_time(mode, step):
    with clock:
        key = f"{mode}/latest"
        assert clock.wait_for(lambda: len(written.get(key, [])) > step, 60), \
            f"no event for step {step}"
        return written[key][step]

def run(mode):
    store = f"s3://{bucket}/{mode}"
    args = [cli, "follow", store, f"{work}/region-{mode}", "--json", "--no-sync",
            "--until", str(steps)]
    notify(f"clock-{mode}", f"http://127.0.0.1:{clock_server.server_address[1]}", f"{mode}/latest")
    if mode == "events":
        listen = free_port()
        notify("follower", f"http://127.0.0.1:{listen}", f"{mode}/latest")
        args += ["--events", f"127.0.0.1:{listen}", "--interval", "60"]
    else:
        args += ["--interval", str(interval)]
    publish(store, 0)  # step 0 is there before the follower starts
    follower = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pulled = {}
    arrived = threading.Condition()

    def read():
        for line in follower.stdout:
            now = time.time()
            report = json.loads(line)
            with arrived:
                pulled[report["step"]] = now - report["seconds"]["total"]
                arrived.notify_all()
    reader = threading.Thread(target=read)
    reader.start()
    pause = random.Random(56)
    latencies = []
    with arrived:
        assert arrived.wait_for(lambda: 0 in pulled, 60), "step 0 not pulled"
    for step in range(1, steps + 1):
        time.sleep(pause.uniform(0.1, 2.1))
        publish(store, step)
        with arrived:
            assert arrived.wait_for(lambda: step in pulled, 120), f"step {step} not pulled"
        latencies.append(pulled[step] - commit_time(mode, step))
    follower.wait(60)
    reader.join()
    same = open(f"{work}/region-{mode}/model.safetensors", "rb").read() == \
        open(f"{work}/data/{steps}/model.safetensors", "rb").read()
    assert same, "the region's file differs from the trainer's"
    return latencies

results = {mode: run(mode) for mode in ("events", "poll")}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
load = os.getloadavg()[0]
q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]
lines = [f"# bench/notify_latency.sh --steps {steps} --interval {interval:g} --out {out}",
         f"# commit {commit}, {os.cpu_count()} cores, load average {load:.2f} at the end; "
         "radosgw 16.2 on loopback, one shard of 4 BF16 512x512 tensors per step",
         "# commit to pull start: radosgw's eventTime of the step's `latest` write -> the "
         "follower's pull of that step began",
         "",
         f"{'follow':<38} {'steps':>5} {'median ms':>10} {'p90 ms':>8} {'min ms':>8} {'max ms':>8}"]
names = {"events": "--events (radosgw push), --interval 60",
         "poll": f"--interval {interval:g} (the default poll)"}
for mode, xs in results.items():
    ms = [x * 1000 for x in xs]
    lines.append(f"{names[mode]:<38} {len(ms):>5} {statistics.median(ms):>10.1f} "
                 f"{q(ms, 0.9):>8.1f} "
                 f"{min(ms):>8.1f} {max(ms):>8.1f}")
text = "\n".join(lines) + "\n"
print(text, end="")
open(out + ".txt", "w").write(text)
json.dump({"commit": commit, "steps": steps, "interval": interval, "load": load,
           "seconds": results}, open(out + ".json", "w"), indent=1)
PY
