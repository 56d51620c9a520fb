#!/usr/bin/env python3
"""Prints the README's results table from an arc_bench JSON file (arc_bench --json).

    bench/results/readme_table.py [bench/results/arc_bench.json]

One row per dataset: the share of values changed, the payload (% of the BF16 bytes) of
arc_v3's default format, of ARCv3 as published and of the smallest other codec, the
entropy bound (b2) and arc_v3 / (b2), and one-thread decode and encode GB/s of arc_v3
against slime_zstd (sparse patches through zstd -1, the fastest sparse peer). arc_bench
prints the same figures as its closing "Headline" table.

Reads arc_bench's row names (arc_v3, arc_v3_published) and those of release 1.0.0, which
the committed bench/results/arc_bench.json has (arc_default_e2 = arc_v3, arc_v3_e2 =
arc_v3_published).
"""
import argparse
import json

ARC = "arc_v3"                     # the library's default: Format::kDefault, effort 2
PUBLISHED = "arc_v3_published"      # Format::kPublished at effort 2
OLD_ARC = "arc_default_e2"         # the same two rows as release 1.0.0 named them
OLD_PUBLISHED = "arc_v3_e2"
PEER = "slime_zstd"


def is_arc_v3(name):
    """arc_v3's own rows (every format and effort), under either naming."""
    return name.startswith(("arc_v3", "arc_v3_published", "arc_default"))


def main(path):
    with open(path) as f:
        run = json.load(f)
    print("| dataset | changed | arc_v3 | ARCv3 as published | smallest other | bound (b2) "
          "| arc_v3 ÷ (b2) | decode GB/s, arc_v3 / slime_zstd | encode GB/s, arc_v3 / slime_zstd |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for d in run["datasets"]:
        codecs = {c["codec"]: c for c in d["codecs"] if c.get("ok")}
        names = {c["codec"] for c in d["codecs"]}
        # Release 1.0.0's names, where its default-format row is there (arc_v3_e2 then
        # meant ARCv3 as published; today's arc_v3 has no _e2 row).
        arc_name, published_name = (OLD_ARC, OLD_PUBLISHED) if OLD_ARC in names else (ARC, PUBLISHED)
        if arc_name not in codecs:
            continue
        arc = codecs[arc_name]
        others = [c for name, c in codecs.items() if not is_arc_v3(name)]
        smallest = min(others, key=lambda c: c["payload_bytes"]) if others else None
        b2 = d["bound_percent"]["b2"]
        row = [d["name"], f"{100 * d['density']:.2f}%", f"**{arc['payload_percent']:.3f}%**"]
        row.append(f"{codecs[published_name]['payload_percent']:.3f}%" if published_name in codecs else "")
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
    parser = argparse.ArgumentParser(
        description="Prints the README's results table (markdown) from an arc_bench --json file.")
    parser.add_argument("json", nargs="?", default="bench/results/arc_bench.json",
                        help="arc_bench --json output (default: %(default)s)")
    main(parser.parse_args().json)
