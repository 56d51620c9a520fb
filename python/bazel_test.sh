#!/bin/bash
# Runs the pytest suite against the Bazel-built extension (//python:python_test).
set -euo pipefail
ROOT="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-arc_v3}/python"
export PYTHONPATH="$ROOT" PYTHONDONTWRITEBYTECODE=1
cd "${TEST_TMPDIR:-/tmp}"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q "$ROOT/tests"
