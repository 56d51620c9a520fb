#!/usr/bin/env bash
# Installs what is missing, boots a real S3 server (radosgw) for the sync tests, builds
# everything and runs every test - the Bazel suites and the Python binding's pytest
# suite - and ends with the line "N passed, N failed"
# (doctest test cases summed over all test binaries, plus pytest's tests).
# Usage: tests/run_tests.sh [extra bazel test flags, e.g. --config=asan]
set -uo pipefail
cd "$(dirname "$0")/.."

third_party/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

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
    echo "0 passed, 1 failed"
    exit 1
  fi
  trap 'tests/s3/radosgw.sh stop "$rgw_dir" >/dev/null 2>&1; rm -rf "$rgw_dir"' EXIT
  # shellcheck source=/dev/null
  source "$rgw_dir/env.sh"
fi
export ARC_V3_REQUIRE_S3=1
s3_env=()
for v in AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION AWS_DEFAULT_REGION \
         ARC_V3_TEST_S3 ARC_V3_TEST_PUBLIC_S3 ARC_V3_TEST_PUBLIC_HTTP ARC_V3_REQUIRE_S3; do
  s3_env+=("--test_env=$v")
done

bazel test //... "${s3_env[@]}" "$@"
status=$?
# 0 = all passed; 3 = some test failed; anything else = the build failed.

testlogs=$(bazel info "$@" bazel-testlogs 2>/dev/null)
passed=0
failed=0
while IFS= read -r log; do
  line=$(grep -E '^\[doctest\] test cases:' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    # Not a doctest binary (e.g. the CLI's shell test): one test, judged by Bazel's result.
    if grep -q 'failures="0" errors="0"' "$(dirname "$log")/test.xml" 2>/dev/null; then
      passed=$((passed + 1))
    else
      echo "failed: $log" >&2
      failed=$((failed + 1))
    fi
    continue
  fi
  p=$(echo "$line" | sed -E 's/.*\| *([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/.*\| *([0-9]+) failed.*/\1/')
  passed=$((passed + p))
  failed=$((failed + f))
done < <(find -L "$testlogs" -name test.log 2>/dev/null | sort)

# Show which Highway targets the per-target tests ran on.
find -L "$testlogs" -name test.log -print0 2>/dev/null | xargs -0 grep -h '^\[hwy\]' | sort -u

if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build failed or a test crashed before printing its summary
fi

# The Python binding, built from the same sources and tested against the installed module.
if [ $# -eq 0 ]; then
  python/run_tests.sh 2>&1 | tee /tmp/arc_v3_pytest.log
  py_status=${PIPESTATUS[0]}
  summary=$(grep -E '^=* ?[0-9]+ (passed|failed)' /tmp/arc_v3_pytest.log | tail -n 1)
  py_passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
  py_failed=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || echo 0)
  passed=$((passed + ${py_passed:-0}))
  failed=$((failed + ${py_failed:-0}))
  if [ "$py_status" -ne 0 ]; then
    [ "${py_failed:-0}" -eq 0 ] && failed=$((failed + 1))
    status=1
  fi
fi
echo "${passed} passed, ${failed} failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
