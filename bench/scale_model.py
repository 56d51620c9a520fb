#!/usr/bin/env python3
"""What sync protocol 2 costs at frontier scale, from what bench/sync_scale.sh measured.

Reads bench/results/sync_scale.json (N = 8..1024 shards of 4 tensors: requests, bytes,
metadata, prefix shares, commit times, counted in radosgw's access log),
bench/results/sync_scale_t64.json (64 shards of 64 tensors with the same elements: what a
tensor adds to a step's documents and container heads) and bench/results/arc_bench.json
(per-core encode and decode rates) and bench/results/regions_bench.json (what crosses a
region's link per step behind the region cache, against one host's bytes). Writes
OUT.{txt,json,png} (default bench/results/scale_model):

1. the measured table, per N;
2. the same counts extrapolated to 1,024 ranks x 10,000 tensors per rank and 4 regions x 64
   hosts, next to what protocol 1 costs there (its commit read every record on every
   attempt: N^2 + 6N requests; every host read one manifest of every record);
3. a model of the time from "trained" to "served" for a 1 TB checkpoint at 0.2% and 2%
   changed over 10 and 100 Gbit/s region links, every assumption printed beside it, next to
   NeMo-RL's published 247 GB in 20.2 s through S3 at 3% changed.

   bench/scale_model.py [--out OUT]
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def phases(doc):
    """{n: {phase: row}} of a sync_scale result."""
    out = {}
    for row in doc["results"]:
        out.setdefault(row["shards"], {})[row["phase"]] = row
    return out


def fit(xs, ys):
    """Least squares y = a x + b."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


def human(n):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(RESULTS, "scale_model"))
    args = ap.parse_args()
    scale, t64, bench = load("sync_scale.json"), load("sync_scale_t64.json"), load("arc_bench.json")
    region_bench = load("regions_bench.json")
    m, m64 = phases(scale), phases(t64)
    ns = sorted(m)
    lines = [f"# bench/scale_model.py: from sync_scale.json (commit {scale['commit']}), sync_scale_t64.json "
             f"(commit {t64['commit']}), arc_bench.json (arc_v3 {bench['arc_v3_version']}), "
             f"regions_bench.json (commit {region_bench['commit']})", ""]

    # 1. Measured.
    lines.append("1. Measured per step (radosgw on loopback; 4 BF16 tensors of 64x256 per shard, ~2% changed;")
    lines.append("   pulls onto a host holding the step before):")
    lines.append(f"{'N':>6} {'publish req':>11} {'/shard':>7} {'commit s':>8} {'top prefix':>10} "
                 f"{'full pull':>18} {'1/64 tensors':>18} {'1/8 rows':>18} {'metadata/host':>13}")
    measured = []
    for n in ns:
        p, full, part, rows = m[n]["publish step 1"], m[n]["pull full"], m[n]["pull tensors"], m[n]["pull rows"]
        row = {"shards": n, "publish_requests": p["wire"]["requests"],
               "commit_seconds": p["publish"]["commit_seconds"], "top_prefix_share": p["wire"]["top_prefix_share"],
               "full": [full["wire"]["requests"], full["report"]["fetched_bytes"]],
               "tensors": [part["wire"]["requests"], part["report"]["fetched_bytes"]],
               "rows": [rows["wire"]["requests"], rows["report"]["fetched_bytes"]],
               "metadata_full": full["wire"]["meta_bytes"]}
        measured.append(row)
        lines.append(f"{n:>6} {row['publish_requests']:>11} {row['publish_requests'] / n:>7.1f} "
                     f"{row['commit_seconds']:>8.2f} {row['top_prefix_share']:>10.1%} "
                     f"{row['full'][0]:>7} {human(row['full'][1]):>10} {row['tensors'][0]:>7} "
                     f"{human(row['tensors'][1]):>10} {row['rows'][0]:>7} {human(row['rows'][1]):>10} "
                     f"{human(row['metadata_full']):>13}")

    # 2. Extrapolated: requests are linear in N (fit over N >= 256); documents and heads grow
    # per tensor by what 64 tensors per shard added over 4 with the same elements.
    big = [n for n in ns if n >= 256] or ns
    pub_a, pub_b = fit(big, [m[n]["publish step 1"]["wire"]["requests"] for n in big])
    meta_a, meta_b = fit(big, [m[n]["pull full"]["wire"]["meta_bytes"] for n in big])  # bytes per shard
    n64 = 64
    per_tensor_meta = (m64[n64]["pull full"]["wire"]["meta_bytes"] - m[n64]["pull full"]["wire"]["meta_bytes"]) / n64 / 60
    per_tensor_all = (m64[n64]["pull full"]["report"]["fetched_bytes"] -
                      m[n64]["pull full"]["report"]["fetched_bytes"]) / n64 / 60
    name_extra = 26  # bytes: real names ("model.layers.12.self_attn.q_proj.weight") over the bench's
    N, T, regions, hosts = 1024, 10_000, 4, 64
    G = math.ceil(N / 32)
    # A shard's documents per step: its record names its tensors by one checksum and a
    # layout, so a tensor adds only what was measured (names are in layouts and heads).
    record = meta_a + (T - 4) * per_tensor_meta
    head_extra = (per_tensor_all - per_tensor_meta + name_extra) * (T - 4)  # its container head
    ext = {
        "ranks": N, "tensors_per_rank": T, "hosts": regions * hosts,
        "publish_requests": pub_a * N + pub_b,
        "full_pull_requests": 2 * N + G + 3,
        "tensors_pull_requests": 3 + 1 + 3 * (N // 64),
        "full_pull_metadata_bytes": meta_b + N * record,
        "full_pull_head_bytes": N * head_extra,
        "tensors_pull_metadata_bytes": 2000 + (N // 64) * record,
        "first_pull_layout_bytes": N * T * (40 + 4),
        "v1_publish_requests": N * N + 6 * N,
        "v1_manifest_bytes": 440 * N + 91 * N * T,
    }
    ext["gets_per_step_all_hosts"] = ext["hosts"] * ext["full_pull_requests"]
    ext["top_prefix_share"] = m[max(ns)]["pull full"]["wire"]["top_prefix_share"]
    lines += ["", f"2. Extrapolated to {N:,} ranks x {T:,} tensors per rank, {regions} regions x {hosts} hosts "
              f"(requests linear in N, fitted over N = {', '.join(map(str, big))}; a tensor adds "
              f"{per_tensor_meta:.0f} B to its shard's documents and "
              f"{per_tensor_all - per_tensor_meta:.0f} B to its container head (+{name_extra} B for real names), "
              f"measured at 64 shards):",
              f"{'per step':<46} {'protocol 2':>16} {'protocol 1':>22}",
              f"{'publish and commit: requests':<46} {ext['publish_requests']:>16,.0f} {ext['v1_publish_requests']:>22,}",
              f"{'  largest share of one key prefix':<46} {m[max(ns)]['publish step 1']['wire']['top_prefix_share']:>16.1%} "
              f"{'100% (steps/N/)':>22}",
              f"{'full pull: requests per host':<46} {ext['full_pull_requests']:>16,} {N + 2:>22,}",
              f"{'  documents per host':<46} {human(ext['full_pull_metadata_bytes']):>16} "
              f"{human(ext['v1_manifest_bytes']) + ' (> 64 MiB cap)':>22}",
              f"{'  container heads per host':<46} {human(ext['full_pull_head_bytes']):>16} {'same':>22}",
              f"{'1/64-tensor pull: requests per host':<46} {ext['tensors_pull_requests']:>16,} {N + 2:>22,}",
              f"{'  documents per host (layouts cached)':<46} {human(ext['tensors_pull_metadata_bytes']):>16} "
              f"{human(ext['v1_manifest_bytes']):>22}",
              f"{'  layouts, once per layout':<46} {human(ext['first_pull_layout_bytes']):>16} {'-':>22}",
              f"{'GETs per step, all {0} hosts full'.format(regions * hosts):<46} "
              f"{ext['gets_per_step_all_hosts']:>16,} {regions * hosts * (N + 2):>22,}",
              f"{'  of them on the busiest key prefix':<46} {ext['top_prefix_share']:>16.1%} {'100%':>22}"]

    # 3. Trained -> served for a 1 TB checkpoint. What crosses a region's link per step: the
    # most that one region of the most hosts measured sent through the region cache, per
    # one host's own bytes.
    cached = [c for c in region_bench["cases"] if c["mode"] == "cache"]
    most = max(c["hosts"] for c in cached)
    crossings = max(max(c["ratio"].values()) for c in cached if c["hosts"] == most)
    rates = {d["name"]: next(c for c in d["codecs"] if c["codec"] == "arc_v3") for d in bench["datasets"]}
    A = {"checkpoint_bytes": 1e12, "ranks": N, "trainer_cores_per_rank": 8, "host_cores": 64,
         "rank_upload_gbit": 12.5, "s3_rtt_s": 0.020, "commit_round_trips": 22, "host_connections": 64,
         "host_nic_gbit": 100, "host_memory_gbps": 150, "regional_cache": True,
         "link_crossings": round(crossings, 3)}
    lines += ["", "3. Trained -> served, 1 TB BF16 checkpoint, modelled (stages in sequence, no overlap):",
              "   assumptions: " + ", ".join(f"{k}={v}" for k, v in A.items()),
              "   encode/decode per core and payload from arc_bench (gen_low at 0.2%, gen_mid at 2% changed);",
              f"   the delta crosses each region's link {crossings:.2f} times (bench/regions_bench.py: {most} hosts",
              "   behind the region cache of docs/regions.md), then every host fetches it in the region;",
              "   documents and heads as in 2.",
              f"{'changed':>8} {'link':>9} {'delta':>9} {'encode':>7} {'upload':>7} {'commit':>7} "
              f"{'link':>7} {'fetch':>7} {'decode':>7} {'total s':>8}"]
    projections = []
    meta_bytes = ext["full_pull_metadata_bytes"] + ext["full_pull_head_bytes"]
    for label, name in (("0.2%", "gen_low"), ("2%", "gen_mid")):
        r = rates[name]
        delta = A["checkpoint_bytes"] * r["payload_percent"] / 100 + meta_bytes
        encode = A["checkpoint_bytes"] / N / (r["compress_gbps_1t"] * 1e9 * A["trainer_cores_per_rank"])
        upload = delta / N / (A["rank_upload_gbit"] / 8 * 1e9) + 2 * A["s3_rtt_s"]
        commit = A["commit_round_trips"] * A["s3_rtt_s"] + measured[-1]["commit_seconds"]
        fetch = (ext["full_pull_requests"] / A["host_connections"] * A["s3_rtt_s"] +
                 delta / (A["host_nic_gbit"] / 8 * 1e9))
        decode = A["checkpoint_bytes"] / min(r["decompress_gbps_1t"] * 1e9 * A["host_cores"],
                                             A["host_memory_gbps"] * 1e9)
        for link in (10, 100):
            over = crossings * delta / (link / 8 * 1e9)
            total = encode + upload + commit + over + fetch + decode
            projections.append({"changed": label, "link_gbit": link, "delta_bytes": delta, "encode_s": encode,
                                "upload_s": upload, "commit_s": commit, "link_s": over, "fetch_s": fetch,
                                "decode_s": decode, "total_s": total})
            lines.append(f"{label:>8} {link:>5} Gb/s {human(delta):>9} {encode:>7.2f} {upload:>7.2f} {commit:>7.2f} "
                         f"{over:>7.2f} {fetch:>7.2f} {decode:>7.2f} {total:>8.1f}")
    r = rates["gen_mid"]
    nemo = 247e9 / min(r["decompress_gbps_1t"] * 1e9 * A["host_cores"], A["host_memory_gbps"] * 1e9)
    nemo_delta = 247e9 * r["payload_percent"] / 100
    lines += ["", f"   NeMo-RL (published): 247 GB in 20.2 s through S3 at 3% changed. This model for 247 GB at 2%: "
              f"{human(nemo_delta)} crosses the link ({nemo_delta / (100 / 8 * 1e9):.2f} s at 100 Gb/s), "
              f"decode {nemo:.2f} s on 64 cores."]
    text = "\n".join(lines) + "\n"
    with open(args.out + ".txt", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump({"measured": measured, "extrapolated": ext, "assumptions": A, "projections": projections}, f, indent=1)
    chart(args.out, measured)
    print(text, end="")


def chart(out, measured):
    """Requests to publish a step against N: measured, and protocol 1's N^2 + 6N (gnuplot)."""
    if shutil.which("gnuplot") is None:
        return
    scratch = tempfile.mkdtemp(prefix="arc_v3_chart.")
    dat = os.path.join(scratch, "chart.dat")
    with open(dat, "w") as f:
        for row in measured:
            n = row["shards"]
            f.write(f"{n} {row['publish_requests']} {n * n + 6 * n} {row['full'][0]} {row['tensors'][0]}\n")
    script = f"""set terminal pngcairo size 900,600
set output '{out}.png'
set title 'Sync protocol 2: requests per step against trainer shards N (radosgw access log)'
set logscale xy
set xlabel 'trainer shards N'
set ylabel 'requests per step'
set key top left
set grid
plot '{dat}' using 1:2 with linespoints title 'publish and commit (protocol 2)', \\
     '{dat}' using 1:3 with lines dashtype 2 title 'publish and commit, protocol 1 (N^2 + 6N)', \\
     '{dat}' using 1:4 with linespoints title 'a host: full pull', \\
     '{dat}' using 1:5 with linespoints title 'a host: pull of 1/64 of the tensors'
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
