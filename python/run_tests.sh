#!/bin/bash
# Builds and installs the arc_v3 Python package into Debian's python3, then runs its
# pytest suite against the installed copy. Shows the build's progress (a line per compiled
# source; the whole pip log goes to python/build.log), prints pytest's summary line last;
# exits non-zero if the build or any test fails. Arguments go to pytest, which runs in
# python/tests (e.g. `python/run_tests.sh test_api.py -k wrong_base`).
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

# The build compiles the codec's C++ sources when they changed (about 1.5 minutes on 2
# cores, less with more): pip runs verbose into python/build.log, and setup.py's line per
# compiled source ("arc_v3 build: ...") is shown here with the seconds since the start.
echo "== building and installing arc_v3 with $PYTHON: compiling the C++ codec takes about" \
     "1.5 minutes on 2 cores (full log: python/build.log)"
start=$SECONDS
set +e
"$PYTHON" -m pip install --no-build-isolation --no-index --no-deps --break-system-packages \
    --root-user-action=ignore -v "$HERE" 2>&1 | tee "$HERE/build.log" |
  while IFS= read -r line; do  # the build's progress lines (setup.py), with the time
    case "$line" in
      *"arc_v3 build: "*) printf '   %3d s  %s\n' $((SECONDS - start)) "${line#*arc_v3 build: }" ;;
      *"Successfully installed"*) printf '   %3d s  %s\n' $((SECONDS - start)) "${line#"${line%%[! ]*}"}" ;;
    esac
  done
build_status=${PIPESTATUS[0]}
set -e
if [ "$build_status" -ne 0 ]; then
  cat "$HERE/build.log" >&2
  echo "python/run_tests.sh: build failed (log above, also in python/build.log)" >&2
  exit 1
fi
echo "== built and installed in $((SECONDS - start)) s"

# Run from tests/ so that `import arc_v3` finds the installed package, not python/arc_v3.
cd "$HERE/tests"
"$PYTHON" -c 'import arc_v3, sys; print("== testing", arc_v3.__file__, arc_v3.__version__,
      arc_v3.ACTIVE_TARGET); sys.exit(arc_v3.__file__.startswith("'"$HERE"'"))'
exec "$PYTHON" -m pytest -p no:cacheprovider -q "$@"
