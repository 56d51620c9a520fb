#!/bin/bash
# arc_bench end to end on a tiny generated model (a few seconds): its rows use the README's
# names (arc_v3, arc_v3_published; none of release 1.0.0's), its output ends with the
# headline table and that table's figures are readme_table.py's from the JSON it wrote,
# and --json/--csv/--chart leave exactly the files asked for (gnuplot's data and script
# go elsewhere and are removed).
# Usage: arc_bench_test.sh ARC_BENCH README_TABLE_PY
set -u
BENCH="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
TABLE="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
PYTHON="$(command -v python3 || true)"
[ -n "$PYTHON" ] || fail "python3 not found (it reads the JSON)"

mkdir tmp
# out/ does not exist yet: arc_bench creates it. Its temporary files go to tmp/.
TMPDIR="$T/tmp" "$BENCH" --generated --quick --params 20000 --deltas 2 --no-kernels \
  --json out/run.json --csv out/run.csv --chart out/run.png > log.txt 2> err.txt
rc=$?
[ "$rc" -eq 0 ] || { tail -30 log.txt; cat err.txt; fail "arc_bench exited $rc"; }

# Exactly the requested files; nothing left in the temporary folder.
if command -v gnuplot > /dev/null 2>&1; then
  want="run.csv run.json run.png"
else
  echo "SKIP: chart (gnuplot not found; Debian: apt-get install gnuplot-nox)"
  want="run.csv run.json"
fi
got="$(cd out && ls -A | sort | tr '\n' ' ' | sed 's/ $//')"
[ "$got" = "$want" ] || fail "out/ holds '$got', want '$want'"
[ -z "$(ls -A tmp)" ] || fail "arc_bench left temporary files: $(ls -A tmp)"
[ ! -e out/run.png ] || [ -s out/run.png ] || fail "out/run.png is empty"

# Rows, headline and the README table's figures.
"$PYTHON" "$TABLE" out/run.json > readme_table.md || fail "readme_table.py failed"
"$PYTHON" - out/run.json log.txt readme_table.md <<'EOF' || fail "see above"
import json, re, sys

run = json.load(open(sys.argv[1]))
log = open(sys.argv[2]).read().splitlines()
table = [l for l in open(sys.argv[3]).read().splitlines() if l.startswith("| gen_")]
errors = []
datasets = [d["name"] for d in run["datasets"]]
if datasets != ["gen_low", "gen_mid", "gen_high"]:
    errors.append(f"datasets {datasets}")
want = {"arc_v3", "arc_v3_e0", "arc_v3_e1", "arc_v3_e3",
        "arc_v3_published", "arc_v3_published_e0", "arc_v3_published_e1", "arc_v3_published_e3",
        "slime_zstd", "zstd19_xor", "pulsesync"}
for d in run["datasets"]:
    names = [c["codec"] for c in d["codecs"]]
    if not want <= set(names):
        errors.append(f"{d['name']}: missing rows {sorted(want - set(names))}")
    old = [n for n in names if n.startswith("arc_default") or n == "arc_v3_e2"]
    if old:
        errors.append(f"{d['name']}: rows of release 1.0.0's names {old}")
    if len(names) != len(set(names)):
        errors.append(f"{d['name']}: duplicate rows")
    failed = [c["codec"] for c in d["codecs"] if not c["ok"]]
    if failed:
        errors.append(f"{d['name']}: failed {failed}")

# The headline is the last section: its title, header, rule, one row per dataset, then
# only its indented notes.
starts = [i for i, l in enumerate(log) if l.startswith("== ")]
if not starts or not log[starts[-1]].startswith("== Headline"):
    errors.append("the last section of the output is not the headline: "
                  + (log[starts[-1]] if starts else "no section"))
else:
    rest = [l for l in log[starts[-1] + 1:] if l.strip()]
    header = rest[0].split()
    for word in ("arc_v3", "arc_v3_published", "smallest", "(b2)", "slime_zstd"):
        if word not in header:
            errors.append(f"headline header lacks {word}: {rest[0]}")
    rows = rest[2:2 + len(datasets)]
    if [r.split()[0] for r in rows] != datasets:
        errors.append(f"headline rows {rows}")
    if any(not l.startswith("   ") for l in rest[2 + len(datasets):]):
        errors.append(f"output after the headline rows: {rest[2 + len(datasets):]}")
    # The same figures as readme_table.py's row (its bold and "" cells aside).
    number = re.compile(r"[0-9]+\.[0-9]+%?|\([a-z0-9_]+\)")
    for row, md in zip(rows, table):
        if number.findall(row) != number.findall(md.replace("**", "")):
            errors.append(f"headline row '{row}' != readme_table.py's '{md}'")
    if len(table) != len(datasets):
        errors.append(f"readme_table.py printed {table}")
if errors:
    print("\n".join(errors))
    sys.exit(1)
EOF

# The old names are refused with their new name.
"$BENCH" --codecs arc_default_e2 > /dev/null 2> err.txt
rc=$?
[ "$rc" -eq 2 ] || fail "--codecs arc_default_e2 exited $rc, want 2"
grep -q "now arc_v3" err.txt || fail "no hint at the new name: $(cat err.txt)"
"$BENCH" --help | grep -q "arc_v3_published" || fail "--help does not name arc_v3_published"
echo PASS
