#!/usr/bin/env bash
# What crosses a region's link when its hosts read through the region cache of
# docs/regions.md ("A region cache"): tests/regions/region_cache_test.sh's figures (origin
# bytes and requests for 1 host without a cache and 8 hosts through it, full and row-slice
# pulls), for the configuration as documented and for two others that show why it slices
# (slices of 4 MiB; no slice module). Writes bench/results/region_cache.txt (or --out).
#   bench/region_cache.sh [--out FILE] [--port RADOSGW_PORT (default 17390; monitor PORT+1)]
# Uses the S3 server the environment names (tests/s3/radosgw.sh's env.sh), else boots one.
set -euo pipefail
cd "$(dirname "$0")/.."

out=bench/results/region_cache.txt
port=17390
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

third_party/install_deps.sh
bazel build //tools/cli:arc_v3_cli > /dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_region_cache.XXXXXX")
rgw=""
cleanup() {
  [ -z "$rgw" ] || tests/s3/radosgw.sh stop "$rgw" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${ARC_V3_TEST_PUBLIC_S3:-}" ]; then
  rgw="$work/rgw"
  tests/s3/radosgw.sh start "$rgw" "$port" > /dev/null
  # shellcheck source=/dev/null
  source "$rgw/env.sh"
fi
export ARC_V3_REQUIRE_S3=1

# The variants: the docs' text, changed only in the section's nginx block.
cp docs/regions.md "$work/documented.md"
sed 's/^        slice 1m;/        slice 4m;/' docs/regions.md > "$work/slice_4m.md"
sed -e '/^        slice 1m;/d' -e '/proxy_set_header Range \$slice_range;/d' \
    -e 's/\$slice_range;/;/' docs/regions.md > "$work/no_slice.md"
for variant in slice_4m no_slice; do
  ! cmp -s docs/regions.md "$work/$variant.md" ||
    { echo "docs/regions.md's block changed: no $variant variant made of it" >&2; exit 1; }
done
{
  echo "bench/region_cache.sh ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)," \
       "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "Counts of bytes and requests, not timings: the machine's load does not change them."
  echo "documented: docs/regions.md's block as written; slice_4m: its slice 1m made 4m;"
  echo "no_slice: its slice lines removed (a plain proxy_cache). A variant that misses one of"
  echo "the test's bounds says which."
  echo
} > "$work/all.txt"
for variant in documented slice_4m no_slice; do
  status=PASS
  bash tests/regions/region_cache_test.sh bazel-bin/tools/cli/arc_v3_cli "$work/$variant.md" \
    "$work/$variant.txt" > "$work/$variant.log" 2>&1 ||
    status="misses the test's bounds: $(sed -n 's/^FAIL: //p' "$work/$variant.log" | head -1)"
  {
    echo "== $variant: $status"
    cat "$work/$variant.txt" 2> /dev/null || tail -5 "$work/$variant.log"
    echo
  } >> "$work/all.txt"
done
mkdir -p "$(dirname "$out")"
cp "$work/all.txt" "$out"
cat "$out"
