#!/bin/bash
# from_spec_test: makes every payload case (make_cases, with the library) and store case
# (make_stores.sh, with the CLI), then checks the independent implementation against them
# (check.py, impl/: Python written from the specifications alone). README.md has the
# case directory's format.
#
#   run_test.sh MAKE_CASES ARC_V3_CLI MAKE_STORES_SH    (from the workspace root)
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 MAKE_CASES ARC_V3_CLI MAKE_STORES_SH" >&2; exit 2; }
CHECK=tests/from_spec/check.py
if [ ! -f "$CHECK" ]; then
  echo "FAIL: $CHECK does not exist yet: it runs impl/ (the decoder written from the" \
       "specifications) over the cases; see tests/from_spec/README.md" >&2
  exit 1
fi
CASES="$(mktemp -d "${TEST_TMPDIR:-/tmp}/from_spec_cases.XXXXXX")"
echo "from_spec_test: cases in $CASES" >&2
"$1" "$CASES"
bash "$3" "$2" "$CASES"
/usr/bin/python3 "$CHECK" "$CASES"
