#!/usr/bin/env python3
"""Prints the README's results table from an arc_bench JSON file (arc_bench --json).

    bench/results/readme_table.py bench/results/arc_bench.json

One row per dataset: the share of values changed, the payload (% of the BF16 bytes) of
arc_v3's default format, of ARCv3 as published and of the smallest other codec, the
entropy bound (b2) and arc_v3 / (b2), and one-thread decode and encode GB/s of arc_v3
against slime_zstd (sparse patches through zstd -1, the fastest sparse peer).
"""
import json
import sys

ARC = "arc_default_e2"       # the library's default: Format::kDefault, effort 2
PUBLISHED = "arc_v3_e2"      # Format::kArcV3 at effort 2
PEER = "slime_zstd"


def main(path):
    with open(path) as f:
        run = json.load(f)
    print("| dataset | changed | arc_v3 | ARCv3 as published | smallest other | bound (b2) "
          "| arc_v3 ÷ (b2) | decode GB/s, arc_v3 / slime_zstd | encode GB/s, arc_v3 / slime_zstd |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for d in run["datasets"]:
        codecs = {c["codec"]: c for c in d["codecs"] if c.get("ok")}
        if ARC not in codecs:
            continue
        arc = codecs[ARC]
        others = [c for name, c in codecs.items() if not name.startswith("arc_")]
        smallest = min(others, key=lambda c: c["payload_bytes"]) if others else None
        b2 = d["bound_percent"]["b2"]
        row = [d["name"], f"{100 * d['density']:.2f}%", f"**{arc['payload_percent']:.3f}%**"]
        row.append(f"{codecs[PUBLISHED]['payload_percent']:.3f}%" if PUBLISHED in codecs else "")
        if smallest is not None:
            row.append(f"{smallest['payload_percent']:.3f}% ({smallest['codec']})")
        else:
            row.append("")
        row += [f"{b2:.3f}%", f"{arc['payload_percent'] / b2:.2f}"]
        if PEER in codecs:
            peer = codecs[PEER]
            row.append(f"{arc['decompress_gbps_1t']:.2f} / {peer['decompress_gbps_1t']:.2f}")
            row.append(f"{arc['compress_gbps_1t']:.2f} / {peer['compress_gbps_1t']:.2f}")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/arc_bench.json")
