#!/usr/bin/env python3
"""Two regions of H rollout hosts each, fed through a region cache or a regional mirror:
what crosses each region's link per step, and how far behind the trainer each host runs.

A trainer publishes a run of steps (an anchor, then deltas every --interval seconds) to
radosgw on this machine. Each region reaches the trainer's store only through its *link*:
an nginx pass-through whose access log records every request and the bytes it answered.
Behind the link, per mode:
  direct  every host follows the store through the link itself (no cache: H copies)
  cache   every host follows the region cache (docs/regions.md's nginx recipe) in front of
          the link
  mirror  `arc_v3 mirror --follow` copies each step through the link into a local store
          in the region, which every host follows
Per mode and H it reports, per delta step, the bytes and requests that crossed each
region's link (against one host's own bytes: the ratio the issue bounds by 1.15) and each
host's lag (the record's publish time to the step in place), and checks every host holds
the last step bit for bit. bench/scale_model.py reads the ratio from OUT.json.

Uses the S3 server the environment names (tests/s3/radosgw.sh's env.sh), else boots one;
needs Debian's nginx-light. Writes OUT.{txt,json}:
    bench/regions_bench.py [--hosts 1,4,16] [--params 20000000] [--steps 4] [--check] [--out bench_out/regions_bench]
"""

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "bazel-bin", "tools", "cli", "arc_v3_cli")
ARC_BENCH = os.path.join(ROOT, "bazel-bin", "bench", "arc_bench")
NGINX = "/usr/sbin/nginx"
REGIONS = ("east", "west")
MODES = ("direct", "cache", "mirror")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def boot_radosgw(rgw):
    """tests/s3/radosgw.sh on a free port whose next one (the monitor's) is free too."""
    import socket
    for _ in range(5):
        port = free_port()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port + 1)) == 0:
                continue
        if subprocess.run([os.path.join(ROOT, "tests", "s3", "radosgw.sh"), "start", rgw, str(port)],
                          stdout=subprocess.DEVNULL).returncode == 0:
            return
    raise SystemExit("could not boot radosgw")


def step_of(uri):
    """The step a request's key belongs to (the protocol's key layout), or None."""
    key = uri.split("?", 1)[0]
    for part in key.split("/"):
        digits = part.split("-", 1)[0].removesuffix(".json")
        if len(digits) == 12 and digits.isdigit():
            return int(digits)
    return None


def docs_cache_block():
    """The region cache's configuration: the first ```nginx block of docs/regions.md's
    section "## A region cache" (tests/regions/region_cache_test.sh runs the same)."""
    block, section, inside = [], False, False
    with open(os.path.join(ROOT, "docs", "regions.md")) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                section = line.startswith("## A region cache")
            elif section and line == "```nginx" and not block:
                inside = True
            elif inside and line == "```":
                break
            elif inside:
                block.append(line)
    if not block:
        raise SystemExit("no ```nginx block in docs/regions.md's section '## A region cache'")
    return "\n".join(block)


class Region:
    """One region's nginx (its own prefix, logs and cache): the link (a pass-through to the
    origin whose access log records every request and the bytes it answered) and the docs'
    region cache in front of it."""

    def __init__(self, name, home, origin, cache_block):
        self.name, self.home, self.origin, self.cache_block = name, home, origin, cache_block
        self.link_port, self.cache_port = free_port(), free_port()
        self.conf = os.path.join(home, "nginx.conf")

    def log(self):
        return os.path.join(self.home, "link.log")

    def nginx(self, *extra):
        return [NGINX, "-p", self.home, "-e", os.path.join(self.home, "error.log"), "-c", self.conf, *extra]

    def start(self):
        os.makedirs(os.path.join(self.home, "cache"), exist_ok=True)
        cache = self.cache_block
        for old, new in ((" listen 8080;", f" listen 127.0.0.1:{self.cache_port};"),
                         ("/var/cache/nginx/arc_v3 ", os.path.join(self.home, "cache") + " "),
                         ("proxy_pass https://s3.eu-west-1.amazonaws.com;",
                          f"proxy_pass http://127.0.0.1:{self.link_port};"),
                         ("proxy_ssl_server_name on;", "")):
            if old not in cache:
                raise SystemExit(f"the docs' cache configuration changed: no '{old.strip()}' to set")
            cache = cache.replace(old, new)
        user = "user root root;" if os.geteuid() == 0 else ""
        h = self.home
        with open(self.conf, "w") as f:
            f.write(f"""{user}
worker_processes 1;
pid {h}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  client_body_temp_path {h}/body;
  proxy_temp_path {h}/proxy;
  fastcgi_temp_path {h}/fastcgi;
  uwsgi_temp_path {h}/uwsgi;
  scgi_temp_path {h}/scgi;
  access_log off;
  log_format link '$request_method $request_uri $status $bytes_sent';
  server {{
    listen 127.0.0.1:{self.link_port};
    access_log {self.log()} link;
    location / {{ proxy_pass http://{self.origin}; proxy_http_version 1.1; }}
  }}
{cache}
}}
""")
        run(self.nginx())

    def stop(self):
        pid = os.path.join(self.home, "nginx.pid")
        if os.path.exists(pid):
            subprocess.run(self.nginx("-s", "stop"), check=False, stderr=subprocess.DEVNULL)
            for _ in range(100):
                if not os.path.exists(pid):
                    break
                time.sleep(0.05)

    def reset(self):
        """A new link log and an empty cache (between cases)."""
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
        os.makedirs(self.home)
        self.start()

    def crossed(self):
        """Per step (None: latest, layouts): [requests, bytes] that crossed the link."""
        per = {}
        with open(self.log()) as f:
            for line in f:
                _method, uri, _status, sent = line.split()
                s = step_of(uri)
                per.setdefault(s, [0, 0])
                per[s][0] += 1
                per[s][1] += int(sent)
        return per


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--params", type=int, default=20_000_000, help="parameters of each step's checkpoint")
    ap.add_argument("--density", default="mid", help="generator regime: low, mid (2%%), high")
    ap.add_argument("--steps", type=int, default=4, help="delta steps after the anchor step 0")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between trainer steps")
    ap.add_argument("--poll", type=float, default=1.0, help="hosts' and mirrors' poll interval")
    ap.add_argument("--timeout", type=float, default=60, help="seconds hosts get after the last step")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_out", "regions_bench"))
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every host is bit-exact and, behind a cache or a mirror, each region's "
                         "link carries at most 1.15x one host's bytes per step")
    args = ap.parse_args()
    hosts = [int(h) for h in args.hosts.split(",")]
    modes = args.modes.split(",")

    run([os.path.join(ROOT, "third_party", "install_deps.sh")], stdout=subprocess.DEVNULL)
    run(["bazel", "build", "//tools/cli:arc_v3_cli", "//bench:arc_bench"], cwd=ROOT, stderr=subprocess.DEVNULL)
    work = tempfile.mkdtemp(prefix="arc_v3_regions.")
    rgw = os.path.join(work, "rgw")
    regions = []
    try:
        run([ARC_BENCH, "--params", str(args.params), "--deltas", str(args.steps), "--regimes", args.density,
             "--save-generated", os.path.join(work, "gen"), "--generate-only"], stdout=subprocess.DEVNULL)
        gen = os.path.join(work, "gen", f"gen_{args.density}")
        files = sorted(os.path.join(gen, f) for f in os.listdir(gen) if f.endswith(".safetensors"))
        files = files[:args.steps + 1]
        env = dict(os.environ)
        if not env.get("ARC_V3_TEST_PUBLIC_S3"):  # no server named by the environment: boot one
            boot_radosgw(rgw)
            for line in open(os.path.join(rgw, "env.sh")):
                if line.startswith("export "):
                    k, v = line[len("export "):].strip().split("=", 1)
                    env[k] = v.strip("'\"")
        public_s3 = env["ARC_V3_TEST_PUBLIC_S3"]  # s3://BUCKET/...: written with credentials
        public_http = env["ARC_V3_TEST_PUBLIC_HTTP"]  # http://HOST:PORT/BUCKET/...
        origin = public_http.split("/")[2]
        bucket_path = "/" + "/".join(public_http.split("/")[3:]).rstrip("/")
        block = docs_cache_block()
        regions = [Region(r, os.path.join(work, f"nginx-{r}"), origin, block) for r in REGIONS]
        results = []
        for mode in modes:
            for h in hosts:
                for r in regions:
                    r.reset()
                prefix = f"regions-{mode}-{h}-{os.getpid()}"
                results.append(run_case(args, mode, h, files, env, regions, work,
                                        f"{public_s3.rstrip('/')}/{prefix}", f"{bucket_path}/{prefix}"))
                print(json.dumps(summary_line(results[-1])), file=sys.stderr)
        report = {"params": args.params, "density": args.density, "steps": args.steps, "interval": args.interval,
                  "poll": args.poll, "checkpoint_bytes": os.path.getsize(files[0]), "cases": results,
                  "commit": subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=ROOT,
                                           capture_output=True, text=True).stdout.strip()}
        write_report(args, report)
        if args.check:
            bad = [f"{c['mode']} H={c['hosts']}" for c in report["cases"] if not c["bit_exact"] or
                   (c["mode"] != "direct" and max(c["ratio"].values()) > 1.15)]
            if bad:
                raise SystemExit("regions_bench: over 1.15x one host's bytes, or not bit-exact: " + ", ".join(bad))
    finally:
        for r in regions:
            r.stop()
        subprocess.run([os.path.join(ROOT, "tests", "s3", "radosgw.sh"), "stop", rgw], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


def run_case(args, mode, h, files, env, regions, work, store, path):
    """One mode and H: publishes step 0, starts the regions, publishes the deltas every
    args.interval seconds, waits for every host to hold the last step."""
    last = len(files) - 1
    case_dir = os.path.join(work, f"{mode}-{h}")
    os.makedirs(case_dir)
    publish(store, files, 0, env)
    procs = []
    for region in regions:
        r = region.name
        link = f"http://127.0.0.1:{region.link_port}{path}"
        if mode == "direct":
            source = link
        elif mode == "cache":
            source = f"http://127.0.0.1:{region.cache_port}{path}"
        else:
            source = os.path.join(case_dir, f"mirror-{r}")
            log = os.path.join(case_dir, f"mirror-{r}.jsonl")
            procs.append(("mirror", r, log, subprocess.Popen(
                [CLI, "mirror", link, source, "--follow", "--interval", str(args.poll), "--until", str(last),
                 "--json"], stdout=open(log, "w"), stderr=open(log + ".err", "w"))))
        for i in range(h):
            out = os.path.join(case_dir, f"{r}-{i}")
            log = out + ".jsonl"
            procs.append(("host", r, log, subprocess.Popen(
                [CLI, "follow", source, out, "--interval", str(args.poll), "--until", str(last), "--json",
                 "--no-sync", "-T", "1", "--max-failures", "1000"],
                stdout=open(log, "w"), stderr=open(log + ".err", "w"))))
    t0 = time.time() + args.interval
    for step in range(1, last + 1):
        time.sleep(max(0, t0 + (step - 1) * args.interval - time.time()))
        publish(store, files, step, env)
    deadline = time.time() + args.timeout
    for kind, r, log, p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.returncode != 0:
            raise SystemExit(f"{mode} H={h}: a {kind} of {r} exited {p.returncode}: {open(log + '.err').read()}")
    lags, exact = [], True
    for kind, r, log, p in procs:
        if kind != "host":
            continue
        out = log.removesuffix(".jsonl")
        exact = exact and all(filecmp.cmp(files[last], os.path.join(out, f), shallow=False)
                              for f in os.listdir(out) if f.endswith(".safetensors"))
        for line in open(log):
            if line.startswith("{"):
                d = json.loads(line)
                if d.get("step", 0) >= 1:
                    lags.append(d["lag_seconds"])
    crossed = {region.name: region.crossed() for region in regions}
    shutil.rmtree(case_dir, ignore_errors=True)
    deltas = range(1, last + 1)
    per_region = {}
    for r in REGIONS:
        c = crossed[r]
        # Polls of `latest` (and layouts) belong to no step: over the run they are spread
        # over the delta steps in the "all" figures.
        per_region[r] = {"delta_bytes_per_step": statistics.mean(c.get(s, [0, 0])[1] for s in deltas),
                         "delta_requests_per_step": statistics.mean(c.get(s, [0, 0])[0] for s in deltas),
                         "anchor_bytes": c.get(0, [0, 0])[1],
                         "other_requests": c.get(None, [0, 0])[0], "other_bytes": c.get(None, [0, 0])[1],
                         "all_bytes_per_step": sum(v[1] for k, v in c.items() if k != 0) / len(deltas),
                         "all_requests_per_step": sum(v[0] for k, v in c.items() if k != 0) / len(deltas)}
    return {"mode": mode, "hosts": h, "bit_exact": exact, "regions": per_region,
            "lag_median_s": statistics.median(lags) if lags else None, "lag_max_s": max(lags) if lags else None,
            "pulls": len(lags)}


def publish(store, files, step, env):
    cmd = [CLI, "publish", store, "--step", str(step), "--next", files[step], "-q", "-T", "1"]
    if step > 0:
        cmd += ["--prev", files[step - 1]]
    run(cmd, env=env)


def summary_line(c):
    r = c["regions"][REGIONS[0]]
    return {"mode": c["mode"], "hosts": c["hosts"], "bytes_per_step": r["delta_bytes_per_step"],
            "requests_per_step": r["delta_requests_per_step"], "lag_median_s": c["lag_median_s"],
            "bit_exact": c["bit_exact"]}


def write_report(args, report):
    one, one_all = {}, {}  # one host's own bytes per step: direct, H = 1
    for c in report["cases"]:
        if c["mode"] == "direct" and c["hosts"] == 1:
            one = {r: c["regions"][r]["delta_bytes_per_step"] for r in REGIONS}
            one_all = {r: c["regions"][r]["all_bytes_per_step"] for r in REGIONS}
    lines = [f"Two regions of H hosts, {report['params']:,}-parameter BF16 checkpoint "
             f"({report['checkpoint_bytes'] / 1e6:.1f} MB), {report['steps']} delta steps at the "
             f"'{report['density']}' regime every {report['interval']:g} s, hosts and mirrors polling every "
             f"{report['poll']:g} s; radosgw and nginx on loopback (bench/regions_bench.py at {report['commit']}).",
             "Per delta step and region: what crossed the region's link (the nginx pass-through's access log):",
             "the step's own objects and documents, then everything (polls of `latest` spread over the steps),",
             "each against one host's (direct, H = 1); lag: a record's publish time to the step in place, over",
             "every host and step.",
             "",
             f"{'':<12} {'':<6} {'the step':^35} {'everything':^35}",
             f"{'mode':<8} {'H':>3} {'region':<6} {'requests':>9} {'bytes':>12} {'x one host':>11}  "
             f"{'requests':>9} {'bytes':>12} {'x one host':>11} {'anchor MB':>10} {'lag med s':>10} "
             f"{'lag max s':>10} {'bit-exact':>9}"]
    for c in report["cases"]:
        for r in REGIONS:
            g = c["regions"][r]
            ratio = g["delta_bytes_per_step"] / one[r] if one.get(r) else float("nan")
            ratio_all = g["all_bytes_per_step"] / one_all[r] if one_all.get(r) else float("nan")
            c.setdefault("ratio", {})[r] = ratio
            c.setdefault("ratio_all", {})[r] = ratio_all
            lines.append(f"{c['mode']:<8} {c['hosts']:>3} {r:<6} {g['delta_requests_per_step']:>9.1f} "
                         f"{g['delta_bytes_per_step']:>12,.0f} {ratio:>11.2f}  {g['all_requests_per_step']:>9.1f} "
                         f"{g['all_bytes_per_step']:>12,.0f} {ratio_all:>11.2f} {g['anchor_bytes'] / 1e6:>10.1f} "
                         f"{c['lag_median_s']:>10.2f} {c['lag_max_s']:>10.2f} {str(c['bit_exact']):>9}")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    print(text, end="")


if __name__ == "__main__":
    main()
