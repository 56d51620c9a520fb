#!/bin/bash
# Builds and installs the arc_v3 Python package into Debian's python3, then runs its
# pytest suite against the installed copy. Prints pytest's summary line last; exits
# non-zero if the build or any test fails.
#
#   python/run_tests.sh            (from anywhere; PYTHON=... to use another interpreter)
#
# Needs (Debian): pybind11-dev python3-dev python3-pip python3-setuptools python3-wheel
#                 python3-numpy python3-pytest python3-torch, plus the codec's libraries.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"  # never the pyenv python3 that may come first on PATH

missing=""
for module in pip setuptools wheel numpy pytest torch; do
  "$PYTHON" -c "import $module" 2>/dev/null || missing="$missing $module"
done
[ -f /usr/include/pybind11/pybind11.h ] || missing="$missing pybind11-dev"
if [ -n "$missing" ]; then
  echo "python/run_tests.sh: missing:$missing (apt-get install pybind11-dev python3-dev" \
       "python3-pip python3-setuptools python3-wheel python3-numpy python3-pytest" \
       "python3-torch)" >&2
  exit 1
fi

echo "== building and installing arc_v3 with $PYTHON"
if ! "$PYTHON" -m pip install --no-build-isolation --no-index --no-deps \
    --break-system-packages --root-user-action=ignore -q "$HERE" >"$HERE/build.log" 2>&1; then
  cat "$HERE/build.log" >&2
  echo "python/run_tests.sh: build failed (log above, also in python/build.log)" >&2
  exit 1
fi

# Run from tests/ so that `import arc_v3` finds the installed package, not python/arc_v3.
cd "$HERE/tests"
"$PYTHON" -c 'import arc_v3, sys; print("== testing", arc_v3.__file__, arc_v3.__version__,
      arc_v3.ACTIVE_TARGET); sys.exit(arc_v3.__file__.startswith("'"$HERE"'"))'
exec "$PYTHON" -m pytest -p no:cacheprovider -q "$@"
