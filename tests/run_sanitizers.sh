#!/usr/bin/env bash
# The whole Bazel test suite under AddressSanitizer + UndefinedBehaviorSanitizer (GCC,
# the `asan` config of .bazelrc), fuzz-corpus replay included; ends with the line
# "N passed, N failed" (doctest test cases summed over all test binaries) like
# tests/run_tests.sh, which it calls. Extra arguments go to `bazel test`.
#   tests/run_sanitizers.sh
#   tests/run_sanitizers.sh --test_tag_filters=-large   (skips the bit-flip campaign)
set -uo pipefail
cd "$(dirname "$0")/.."
# Sanitizer reports must fail the test, and leaks count as bugs.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
exec tests/run_tests.sh --config=asan --test_env=ASAN_OPTIONS --test_env=UBSAN_OPTIONS "$@"
