#!/usr/bin/env python3
"""The cross-region benchmark: how far behind the trainer each region runs, per codec.

A trainer publishes a step every --interval seconds to an S3 store (radosgw on this
machine); regions, each a network namespace behind a bandwidth limit (tbf on its link)
and a round-trip latency (a relay that holds bytes for half the RTT each way: this kernel
has no netem), follow the store and rebuild every step they take. Per codec and region it
reports bytes per step, the time from "step trained" (the trainer starts publishing it) to
"region serves it" (the step is verified and in place), and how many steps behind the
trainer the region runs in steady state (that time over the interval).

Codecs:
  arc_v3            `arc_v3 publish` / `arc_v3 follow` (default format), end to end
  arc_v3_published  the same protocol with ARCv3 as published (XOR fields, zstd/lz4 race)
  pulsesync_like    the bench's PULSESync re-implementation: its payload's bytes cross
                    the link for real; its encode and decode times are arc_bench's
                    single-thread speeds for the same data (no follower of ours decodes it)
  full              the whole safetensors file every step

Needs root (network namespaces), Debian's iproute2 and the project's radosgw
(tests/s3/radosgw.sh). Writes OUT.{json,txt,png}:
    bench/cross_region.py [--params 100000000] [--steps 6] [--interval 4] [--out bench_out/cross_region]
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = BENCH = None  # the built binaries (set in main: bazel-bin of the default configuration)
AWS = "/usr/bin/aws"  # Debian's awscli (a pyenv shim may shadow `aws`)
PYTHON = sys.executable
REGIMES = {"low": "0.2%", "mid": "2%", "high": "10%"}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------------------------------
# The relay: holds bytes for half the RTT in each direction (runs as its own process).

async def _pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue(maxsize=64)  # 4 MiB in flight at most: the sender waits, as on a link

    async def pump():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the peer is gone
            pass

    task = asyncio.ensure_future(pump())
    try:
        while True:
            data = await reader.read(1 << 16)
            await queue.put((loop.time() + delay, data or None))
            if not data:
                break
    except ConnectionError:
        await queue.put((0, None))
    await task


def relay_main(listen_host, listen_port, target_port, rtt_ms):
    delay = rtt_ms / 2000.0

    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay),
                             return_exceptions=True)

    async def serve():
        server = await asyncio.start_server(handle, listen_host, listen_port, limit=1 << 20)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


# ---------------------------------------------------------------------------------------
# A follower of plain objects (full checkpoints, PULSESync-like payloads), run inside a
# region's namespace: polls `latest`, downloads the step's object, records when it serves.

def blob_follower_main(endpoint, bucket, prefix, until, out_dir, decode_seconds, log_path, held=-1):
    os.makedirs(out_dir, exist_ok=True)
    sig = ["--aws-sigv4", f"aws:amz:{os.environ.get('AWS_REGION', 'us-east-1')}:s3", "--user",
           f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
           "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    with open(log_path, "w") as log:
        while held < until:
            latest = subprocess.run(["curl", "-sf", *sig, f"{endpoint}/{bucket}/{prefix}/latest"],
                                    capture_output=True, text=True)
            if latest.returncode != 0:
                time.sleep(0.2)
                continue
            doc = json.loads(latest.stdout)
            if doc["step"] <= held:
                time.sleep(0.2)
                continue
            path = os.path.join(out_dir, "model.bin")
            start = time.time()
            got = subprocess.run(["curl", "-sf", *sig, "-o", path + ".tmp", "-w", "%{size_download}",
                                  f"{endpoint}/{bucket}/{prefix}/{doc['key']}"], capture_output=True, text=True)
            if got.returncode != 0:
                time.sleep(0.2)
                continue
            os.replace(path + ".tmp", path)
            time.sleep(decode_seconds)  # the codec's own decode (arc_bench's speed), where it has one
            served = time.time()
            log.write(json.dumps({"step": doc["step"], "trained_at": doc["trained_at"], "served_at": served,
                                  "lag_seconds": served - doc["trained_at"], "fetched_bytes": int(got.stdout),
                                  "steps_behind_before": doc["step"] - max(held, 0) if held >= 0 else 0,
                                  "download_seconds": served - start - decode_seconds}) + "\n")
            log.flush()
            held = doc["step"]


# ---------------------------------------------------------------------------------------

class Region:
    """A network namespace whose downloads cross a `rate` Mbit/s link and `rtt` ms."""

    def __init__(self, index, name, rate_mbit, rtt_ms, rgw_port):
        self.name, self.rate, self.rtt = name, rate_mbit, rtt_ms
        self.ns = f"arcbench{index}"
        self.host_if, self.ns_if = f"arcbh{index}", f"arcbn{index}"
        self.host_ip, self.ns_ip = f"10.213.{index}.1", f"10.213.{index}.2"
        self.relay_port = 19100 + index
        self.rgw_port = rgw_port
        self.relay = None

    def up(self):
        self.down()
        run(["ip", "netns", "add", self.ns])
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
        run(["ip", "link", "set", self.ns_if, "netns", self.ns])
        run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if])
        run(["ip", "link", "set", self.host_if, "up"])
        run(["ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if])
        run(["ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up"])
        run(["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"])
        # Downloads: what leaves the host towards the region. A burst of a few ms at rate.
        burst = max(32, self.rate * 1000 // 8 // 200)  # kbit... in bytes: rate/8 * 5 ms
        run(["tc", "qdisc", "add", "dev", self.host_if, "root", "tbf", "rate", f"{self.rate}mbit",
             "burst", f"{burst}kb", "latency", "500ms"])
        self.relay = subprocess.Popen([PYTHON, os.path.abspath(__file__), "--relay", self.host_ip,
                                       str(self.relay_port), str(self.rgw_port), str(self.rtt)])
        time.sleep(0.3)

    def down(self):
        if self.relay is not None:
            self.relay.terminate()
            self.relay.wait()
            self.relay = None
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.host_if], stderr=subprocess.DEVNULL)

    def endpoint(self):
        return f"http://{self.host_ip}:{self.relay_port}"

    def popen(self, cmd, env, **kw):
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], env=env, **kw)


def s3_put(env, key, path):
    """Uploads a file with curl's SigV4 (awscli's start-up would count as the codec's)."""
    bucket_key = key.removeprefix("s3://")
    run(["curl", "-sf", "-o", "/dev/null", "-T", path, "--aws-sigv4", f"aws:amz:{env['AWS_REGION']}:s3",
         "--user", f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
         "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", f"{env['AWS_ENDPOINT_URL']}/{bucket_key}"])


def s3_rm(env, prefix):
    subprocess.run([AWS, "--endpoint-url", env["AWS_ENDPOINT_URL"], "s3", "rm", "--quiet", "--recursive", prefix],
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def put_json(env, key, doc, work):
    path = os.path.join(work, "doc.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    s3_put(env, key, path)


def bench_codec_speeds(run_dir, work):
    """PULSESync-like payload bytes per step and its 1-thread speeds, from arc_bench."""
    out = os.path.join(work, "pulse.json")
    run([BENCH, "--dir", run_dir, "--codecs", "pulsesync", "--quick", "--no-kernels", "--no-session",
         "--json", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ds = json.load(open(out))["datasets"][0]
    codec = next(c for c in ds["codecs"] if c["codec"] == "pulsesync")
    return codec


def publish_step(codec, store, env, files, step, work, pulse, trained):
    """Publishes `step` as `codec` does; returns {"step", "bytes", "seconds", "phases"}."""
    path = files[step]
    if codec.startswith("arc_v3"):
        cmd = [CLI, "publish", store, "--step", str(step), "--next", path, "--json", "-T", "1",
               "--format", "arc_v3_published" if codec == "arc_v3_published" else "arc_v3"]
        if step > 0:
            cmd += ["--prev", files[step - 1]]
        rep = json.loads(run(cmd, env=env, capture_output=True, text=True).stdout)
        return {"step": step, "bytes": rep["uploaded_bytes"], "seconds": time.time() - trained,
                "phases": rep["seconds"]}
    if codec == "full":
        blob, size = path, os.path.getsize(path)
    else:
        size = int(pulse["payload_bytes"] / max(1, pulse["pairs"])) if step > 0 else os.path.getsize(path)
        blob = os.path.join(work, "blob.bin")
        with open(blob, "wb") as f:
            f.write(os.urandom(size))
        if step > 0:  # its encoder's time at arc_bench's 1-thread speed
            time.sleep(os.path.getsize(path) / (pulse["compress_gbps_1t"] * 1e9))
    key = f"step_{step:06d}.bin"
    bucket_prefix = store.removeprefix("s3://")
    s3_put(env, f"{bucket_prefix}/{key}", blob)
    put_json(env, f"{bucket_prefix}/latest", {"step": step, "key": key, "trained_at": trained}, work)
    return {"step": step, "bytes": size, "seconds": time.time() - trained}


def run_codec(args, codec, run_dir, steps, regions, env, work, pulse, dataset, disks):
    """Every region holds step 0 (as after a while of following); then the trainer
    publishes a step every args.interval seconds. Returns what was published and, per
    region, what it served when."""
    bucket = env["ARC_V3_TEST_BUCKET"]
    prefix = f"xr-{dataset}-{codec}-{uuid.uuid4().hex[:8]}"
    store = f"s3://{bucket}/{prefix}"
    files = [os.path.join(run_dir, f) for f in steps]
    last = len(files) - 1
    publish_step(codec, store, env, files, 0, work, pulse, time.time())
    followers, logs = [], []
    for r in regions:
        renv = dict(env, AWS_ENDPOINT_URL=r.endpoint())
        log = os.path.join(work, f"{prefix}-{r.name}.jsonl")
        out = os.path.join(disks, f"{prefix}-{r.name}")
        if codec.startswith("arc_v3"):
            # The seed comes over loopback: a region's first anchor is not what is measured.
            run([CLI, "pull", store, out, "--step", "0", "-q", "--no-sync"], env=env)
            cmd = [CLI, "follow", store, out, "--interval", "0.2", "--until", str(last), "--json", "--no-sync"]
            followers.append(r.popen(cmd, renv, stdout=open(log, "w"), stderr=open(log + ".err", "w")))
        else:
            decode = 0.0
            if codec == "pulsesync_like":
                decode = os.path.getsize(files[1]) / (pulse["decompress_gbps_1t"] * 1e9)
            cmd = [PYTHON, os.path.abspath(__file__), "--follow-blob", r.endpoint(), bucket, prefix, str(last),
                   out, str(decode), log, "0"]
            followers.append(r.popen(cmd, renv, stderr=open(log + ".err", "w")))
        logs.append(log)
    t0 = time.time() + 1.0
    published = []
    for step in range(1, last + 1):
        wait = t0 + (step - 1) * args.interval - time.time()
        if wait > 0:
            time.sleep(wait)
        published.append(publish_step(codec, store, env, files, step, work, pulse, time.time()))
    deadline = time.time() + args.timeout
    for p in followers:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    results = {}
    for r, log, p in zip(regions, logs, followers):
        lines = [json.loads(line) for line in open(log) if line.strip().startswith("{")]
        results[r.name] = [{"step": d["step"], "lag": d["lag_seconds"], "bytes": d["fetched_bytes"],
                            "phases": d.get("seconds")} for d in lines]
        if p.returncode not in (0, -9) and os.path.getsize(log + ".err"):
            print(f"{r.name}: {open(log + '.err').read().strip()}", file=sys.stderr)
        shutil.rmtree(os.path.join(disks, f"{prefix}-{r.name}"), ignore_errors=True)
    if os.environ.get("ARC_V3_XR_KEEP"):
        for log in logs:
            shutil.copy(log, os.environ["ARC_V3_XR_KEEP"])
    s3_rm(env, store + "/")
    return published, results


def summarize(args, published, results):
    """Bytes per step, and per region the lag and steps behind in steady state: the steps
    from the third published one on (a region first catches up from step 0)."""
    last = max(p["step"] for p in published)
    first_steady = min(3, last)
    rows = {"bytes_per_step": statistics.mean(p["bytes"] for p in published),
            "publish_seconds": statistics.median(p["seconds"] for p in published),
            "regions": {}}
    phases = [p["phases"] for p in published if p.get("phases")]
    if phases:
        rows["publish_phases"] = {k: statistics.median(ph[k] for ph in phases) for k in phases[0]}
    for name, served in results.items():
        steady = [s for s in served if s["step"] >= first_steady]
        lags = [s["lag"] for s in steady]
        fell_behind = not served or served[-1]["step"] < last
        reg = {"served_steps": [s["step"] for s in served], "fell_behind": fell_behind,
               "lag_median": statistics.median(lags) if lags and not fell_behind else None,
               "lag_max": max(lags) if lags else None}
        reg["steps_behind"] = reg["lag_median"] / args.interval if reg["lag_median"] is not None else None
        ph = [s["phases"] for s in steady if s.get("phases")]
        if ph:
            reg["pull_phases"] = {k: statistics.median(p[k] for p in ph) for k in ph[0]}
        rows["regions"][name] = reg
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--densities", default="low,mid,high")
    ap.add_argument("--steps", type=int, default=8, help="steps per run: step 0, which regions hold at the start, and "
                    "the steps published every --interval seconds")
    ap.add_argument("--interval", type=float, default=4.0, help="seconds between trainer steps")
    ap.add_argument("--regions", default="fast:1000:20,slow:100:80,thin:10:150",
                    help="name:Mbit/s:RTT ms, comma-separated")
    ap.add_argument("--codecs", default="arc_v3,arc_v3_published,pulsesync_like,full")
    ap.add_argument("--dir", action="append", default=[], help="also a run of step_*.safetensors (e.g. the corpus)")
    ap.add_argument("--timeout", type=float, default=30,
                    help="seconds the regions get after the last step is published")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_out", "cross_region"))
    ap.add_argument("--relay", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--follow-blob", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        host, port, target, rtt = args.relay
        return relay_main(host, int(port), int(target), float(rtt))
    if args.follow_blob:
        endpoint, bucket, prefix, until, out, decode, log, held = args.follow_blob
        return blob_follower_main(endpoint, bucket, prefix, int(until), out, float(decode), log, int(held))
    if os.geteuid() != 0:
        sys.exit("cross_region.py needs root (network namespaces, tc)")

    run([os.path.join(ROOT, "third_party", "install_deps.sh")])
    run(["bazel", "build", "//tools/cli:arc_v3_cli", "//bench:arc_bench"], cwd=ROOT, stderr=subprocess.DEVNULL)
    global CLI, BENCH
    bin_dir = run(["bazel", "info", "bazel-bin"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    CLI = os.path.join(bin_dir, "tools", "cli", "arc_v3_cli")
    BENCH = os.path.join(bin_dir, "bench", "arc_bench")
    work = tempfile.mkdtemp(prefix="arc_v3_cross_region.")
    # The regions' disks: memory, as separate machines' disks would not slow each other
    # down (on one disk, three regions writing a checkpoint each per step contend).
    disks = tempfile.mkdtemp(prefix="arc_v3_regions.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rgw = os.path.join(work, "rgw")
    rgw_port = 17280
    regions = []
    try:
        run([os.path.join(ROOT, "tests", "s3", "radosgw.sh"), "start", rgw, str(rgw_port)],
            env=dict(os.environ, RADOSGW_ADDR="0.0.0.0"), stdout=subprocess.DEVNULL)
        env = dict(os.environ)
        for line in open(os.path.join(rgw, "env.sh")):
            key, _, value = line.strip().removeprefix("export ").partition("=")
            env[key] = value
        for i, spec in enumerate(args.regions.split(",")):
            name, rate, rtt = spec.split(":")
            regions.append(Region(i, name, int(rate), float(rtt), rgw_port))
            regions[-1].up()
        datasets = []
        densities = [d for d in args.densities.split(",") if d]
        if densities:
            gen = os.path.join(work, "gen")
            print(f"generating {args.params} parameters x {args.steps} steps ({', '.join(densities)})...",
                  file=sys.stderr)
            run([BENCH, "--params", str(args.params), "--deltas", str(args.steps - 1), "--regimes", ",".join(densities),
                 "--save-generated", gen, "--generate-only"], stdout=subprocess.DEVNULL)
            datasets += [(f"gen_{d} ({REGIMES[d]})", os.path.join(gen, f"gen_{d}")) for d in densities]
        datasets += [(os.path.basename(os.path.normpath(d)), d) for d in args.dir]
        report = {"params": args.params, "interval_s": args.interval, "steps": args.steps,
                  "regions": [{"name": r.name, "mbit_s": r.rate, "rtt_ms": r.rtt} for r in regions],
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip(),
                  "datasets": []}
        for name, run_dir in datasets:
            steps = sorted(f for f in os.listdir(run_dir) if f.startswith("step_") and f.endswith(".safetensors"))
            steps = steps[:args.steps]
            pulse = bench_codec_speeds(run_dir, work)
            pulse["pairs"] = len(steps) - 1
            entry = {"dataset": name, "checkpoint_bytes": os.path.getsize(os.path.join(run_dir, steps[-1])),
                     "codecs": {}}
            for codec in args.codecs.split(","):
                print(f"{name}: {codec}...", file=sys.stderr)
                for r in regions:  # fresh links: nothing of the last run still in flight
                    r.up()
                published, results = run_codec(args, codec, run_dir, steps, regions, env, work, pulse,
                                               name.split()[0], disks)
                entry["codecs"][codec] = summarize(args, published, results)
            report["datasets"].append(entry)
        write_report(args, report)
    finally:
        for r in regions:
            r.down()
        subprocess.run([os.path.join(ROOT, "tests", "s3", "radosgw.sh"), "stop", rgw], stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(disks, ignore_errors=True)


def write_report(args, report):
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    lines = [f"# bench/cross_region.py --params {report['params']} --steps {report['steps']} "
             f"--interval {report['interval_s']} (commit {report['commit']}, {time.strftime('%Y-%m-%d')}, "
             f"{os.cpu_count()} cores; trainer, store and regions share this machine)",
             "# regions: " + ", ".join(f"{r['name']} {r['mbit_s']} Mbit/s {r['rtt_ms']:g} ms RTT"
                                       for r in report["regions"]),
             "# every region holds step 0 at the start and writes to memory (tmpfs); lag: from 'step trained' to 'region serves it', median over "
             "steps >= 3; behind: lag / interval; 'behind' a region that had not served the last step "
             f"{args.timeout:g} s after it was published",
             ""]
    names = [r["name"] for r in report["regions"]]
    header = f"{'dataset':<22} {'codec':<17} {'bytes/step':>12} " + " ".join(
        f"{n + ' lag s':>11} {n + ' behind':>12}" for n in names)
    lines.append(header)
    lines.append("-" * len(header))
    for ds in report["datasets"]:
        for codec, row in ds["codecs"].items():
            cells = []
            for n in names:
                reg = row["regions"][n]
                lag = "behind" if reg["lag_median"] is None else f"{reg['lag_median']:.2f}"
                behind = "growing" if reg["steps_behind"] is None else f"{reg['steps_behind']:.2f}"
                cells.append(f"{lag:>11} {behind:>12}")
            lines.append(f"{ds['dataset']:<22} {codec:<17} {row['bytes_per_step']:>12.0f} " + " ".join(cells))
    text = "\n".join(lines) + "\n"
    with open(args.out + ".txt", "w") as f:
        f.write(text)
    print(text)
    chart(args, report)


def chart(args, report):
    """Steps behind per codec and region, one panel per dataset (gnuplot)."""
    if shutil.which("gnuplot") is None:
        return
    names = [r["name"] for r in report["regions"]]
    scratch = tempfile.mkdtemp(prefix="arc_v3_chart.")  # only OUT.png stays beside OUT
    dat = os.path.join(scratch, "chart.dat")
    with open(dat, "w") as f:
        for ds in report["datasets"]:
            for codec, row in ds["codecs"].items():
                vals = [row["regions"][n]["steps_behind"] or 0 for n in names]
                f.write(f"\"{ds['dataset'].split()[0]}\\n{codec}\" " + " ".join(f"{v:.3f}" for v in vals) + "\n")
    plots = ", ".join(f"'{dat}' using {i + 2}:xtic(1) title '{n}'" for i, n in enumerate(names))
    script = f"""set terminal pngcairo size 1400,600
set output '{args.out}.png'
set title 'Steps behind the trainer in steady state (one step every {report["interval_s"]:g} s)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set ylabel 'steps behind'
set xtics rotate by -45 font ',8'
set grid ytics
plot {plots}
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
