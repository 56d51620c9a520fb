#!/usr/bin/env bash
# Installs what is missing, boots a real S3 server (radosgw) for the sync tests, builds
# everything and runs every test - the Bazel suites and the Python binding's pytest
# suite - and ends with the line "N passed, N failed, N skipped": per Bazel target its
# verdict from this invocation's test.xml, detailed by doctest's test cases, plus pytest's
# tests from its junit XML (tests/count_results.py says exactly how each is counted).
# Usage: tests/run_tests.sh [extra bazel test flags, e.g. --config=asan]
set -uo pipefail
cd "$(dirname "$0")/.."

third_party/install_deps.sh || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
# This run's build event file and pytest's junit XML (removed at exit).
results=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_results.XXXXXX")
trap 'rm -rf "$results"' EXIT

# The sync tests run against a real S3 server: radosgw on loopback, booted here (~2 s) and
# stopped at the end, unless the environment already names one (ARC_V3_TEST_S3 and the
# AWS_* variables, as tests/s3/radosgw.sh writes them).
rgw_dir=""
if [ -z "${ARC_V3_TEST_S3:-}" ]; then
  rgw_dir=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_rgw.XXXXXX")
  # Two free ports in a row (gateway, monitor).
  port=""
  for p in $(seq 17480 2 17980); do
    if ! ss -Htln "sport = :$p or sport = :$((p + 1))" | grep -q .; then port=$p; break; fi
  done
  if [ -z "$port" ] || ! tests/s3/radosgw.sh start "$rgw_dir" "$port" >/dev/null; then
    echo "could not boot radosgw for the sync tests" >&2
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
  trap 'tests/s3/radosgw.sh stop "$rgw_dir" >/dev/null 2>&1; rm -rf "$rgw_dir" "$results"' EXIT
  # shellcheck source=/dev/null
  source "$rgw_dir/env.sh"
fi
export ARC_V3_REQUIRE_S3=1
s3_env=()
for v in AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION AWS_DEFAULT_REGION \
         ARC_V3_TEST_S3 ARC_V3_TEST_PUBLIC_S3 ARC_V3_TEST_PUBLIC_HTTP ARC_V3_REQUIRE_S3; do
  s3_env+=("--test_env=$v")
done

# The build event file names exactly the targets this invocation tested and the test.log /
# test.xml of each (bazel-testlogs also holds stale logs of targets that no longer exist
# or did not run this time; they are never read).
bazel test //... "${s3_env[@]}" --build_event_json_file="$results/bep.json" "$@"
bazel_status=$?
# 0 = all passed; 3 = some test failed; anything else = the build failed.
status=$bazel_status

# Show which Highway targets the per-target tests ran on (this invocation's logs only).
python3 - "$results/bep.json" <<'PY' | xargs -r grep -h '^\[hwy\]' | sort -u
import json, sys, urllib.parse
try:
  for line in open(sys.argv[1]):
    e = json.loads(line)
    for o in e.get("testResult", {}).get("testActionOutput", []):
      if o.get("name") == "test.log":
        print(urllib.parse.unquote(urllib.parse.urlparse(o["uri"]).path))
except OSError:
  pass
PY

# The Python binding, built from the same sources and tested against the installed module;
# pytest's own junit XML gives its counts (passed, failed + errors, skipped).
junit=()
if [ $# -eq 0 ]; then
  python/run_tests.sh --junitxml="$results/pytest.xml" -rs 2>&1 | tee "$results/pytest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  junit=(--junit "$results/pytest.xml")
fi

# Per target: Bazel's verdict (test.xml), doctest's counts for the detail; last line
# "N passed, N failed, N skipped" (tests/count_results.py says how each is counted).
echo "== results"
tests/count_results.py --bep "$results/bep.json" --bazel-status "$bazel_status" "${junit[@]}"
counted=$?
[ "$status" -eq 0 ] && [ "$counted" -eq 0 ]
