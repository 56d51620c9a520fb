#!/usr/bin/env bash
# The drop-in header and the packages as users meet them (stage 5 of .ci/run):
#  - single_include/ is what single_include/amalgamate.py writes from src/ today;
#  - in an empty folder holding only the header and tests/single_header/user.cc, plain
#    g++ and clang++ (-std=c++17 -O2 -I. -Wall -Wextra -Werror) build the program, whose
#    payloads equal the golden files byte for byte on every SIMD target it compiled, and
#    whose round trips of real checkpoints (the corpus) print the same payload bytes on
#    every target, with either compiler, as the Bazel library (//:arc_v3) and as the
#    installed CMake package;
#  - a split build (the implementation in the generated arc_v3.cc, users in other files,
#    the header in a subfolder, no -I) links and runs; the declarations alone include no
#    third-party header; misuse stops at the header's #error; ARC_V3_HWY_FOREACH_TARGET
#    compiles;
#  - the same program cross-built for aarch64 runs under qemu-user (QEMU_CPU=max: SVE2, SVE,
#    NEON, EMU128; cortex-a72: NEON, EMU128) with the same payloads;
#  - every block of the README's "Use it in your project" runs as written (drop in, Bazel,
#    CMake and pkg-config), and CMake's ctest list has every suite of `bazel test //...`.
# Ends with "N passed, N failed, N skipped" (a check that could not run here, e.g. the
# round trips without a corpus, is shown as skipped); exits non-zero on any failure.
#
#   tests/single_header/run.sh
#   ARC_V3_PREFIX=DIR   an install made by the README's CMake block (.ci/run's stage 4 makes
#                       one); without it this script runs that block itself (minutes)
#   ARC_V3_CORPUS=DIR   folders of step_*.safetensors (e.g. real optimizer runs of your own);
#                       by default the built-in generator's three regimes (arc_bench
#                       --save-generated, 1 M parameters, 2 step pairs each)
#   ARC_V3_KEEP_WORK=1  keep the work folder (every check's log is in its logs/)
#   tests/single_header/run.sh --cmake-install DIR PREFIX
#                       only the README's CMake build-and-install block, run in DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
ARC_V3=$PWD
HERE=$ARC_V3/tests/single_header
LIBS=(-lhwy -lzstd -llz4 -lxxhash -pthread)
FLAGS=(-std=c++17 -O2 -Wall -Wextra -Werror)

# The fenced blocks of the README's "## Use it in your project", in order: app.cc, drop in,
# Bazel, CMake build and install, CMake / pkg-config consumer.
readme_block() {  # N (1-based) -> the block's text
  python3 - "$ARC_V3/README.md" "$1" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Use it in your project\n", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, flags=re.M | re.S)
kinds = [kind for kind, _ in blocks]
if kinds != ["cpp", "sh", "sh", "sh", "sh"]:
    sys.exit("README: expected blocks cpp, sh x 4 in 'Use it in your project', found %s" % kinds)
sys.stdout.write(blocks[int(sys.argv[2]) - 1][1])
PY
}

# Runs README block N in DIR (created) with ARC_V3 and PREFIX set.
run_readme_block() {  # N DIR PREFIX
  local block
  block=$(readme_block "$1") || return 1
  mkdir -p "$2" && (cd "$2" && ARC_V3="$ARC_V3" PREFIX="$3" bash -e -o pipefail -c "$block")
}

if [[ "${1:-}" == --cmake-install ]]; then
  run_readme_block 4 "$2" "$3"
  exit
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/arc_v3_single.XXXXXX")
[[ -n "${ARC_V3_KEEP_WORK:-}" ]] && echo "work folder: $WORK" || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/logs"
passed=0
failed=0
skipped=0

# check NAME COMMAND...: runs COMMAND in a subshell, its output in $WORK/logs/NAME.log, and
# counts it.
count() {  # NAME STATUS SECONDS
  if [[ $2 -eq 0 ]]; then
    passed=$((passed + 1))
    echo "ok      $1 ($3 s)"
  else
    failed=$((failed + 1))
    echo "FAILED  $1 ($3 s):"
    tail -n 25 "$WORK/logs/$1.log" | sed 's/^/    /'
  fi
}
check() {
  local name=$1 begin=$SECONDS
  shift
  ("$@") >"$WORK/logs/$name.log" 2>&1
  count "$name" $? $((SECONDS - begin))
}
# Two compilations at a time (CI has 2 cores): start NAME COMMAND..., later finish NAME.
declare -A job_pid job_begin
start() {
  local name=$1
  shift
  ("$@") >"$WORK/logs/$name.log" 2>&1 &
  job_pid[$name]=$!
  job_begin[$name]=$SECONDS
}
finish() {
  wait "${job_pid[$1]}"
  count "$1" $? $((SECONDS - job_begin[$1]))
}
# A folder holding exactly the given files.
fresh_folder() {  # DIR FILE...
  local dir=$1
  shift
  mkdir -p "$dir" && cp "$@" "$dir/" && [[ $(ls "$dir" | wc -l) -eq $# ]]
}
# `COMMAND... golden tests/golden`: every check passed, on the targets expected.
golden() {  # TARGETS_REGEX COMMAND...
  local want=$1 out
  shift
  out=$("$@" golden "$ARC_V3/tests/golden")
  local status=$?
  echo "$out"
  [[ $status -eq 0 ]] && grep -Eq "^targets: ($want)\$" <<<"$out" &&
    grep -q "^[0-9]* passed, 0 failed$" <<<"$out"
}
# OUT COMMAND...: the command's payload lines (roundtrip) equal those of rt.txt.
same_payloads() {
  "${@:2}" >"$1" && diff "$WORK/rt.txt" "$1" && echo "$(wc -l <"$1") steps, the same payloads"
}

# Toolchains: clang++ and the aarch64 cross toolchain with qemu-user (as tests/run_neon.sh).
need=()
command -v clang++ >/dev/null || need+=(clang)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
for pkg in libhwy-dev libzstd-dev liblz4-dev libxxhash-dev; do
  dpkg -s "$pkg:arm64" >/dev/null 2>&1 || need+=("$pkg:arm64")
done
if (( ${#need[@]} > 0 )); then
  echo "installing: ${need[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}"
fi

corpus=${ARC_V3_CORPUS:-}
if [[ -z "$corpus" ]]; then
  corpus=$WORK/generated_runs
  bazel build //bench:arc_bench >/dev/null 2>&1 &&
    bazel-bin/bench/arc_bench --params 1000000 --deltas 2 --save-generated "$corpus" \
      --generate-only >/dev/null 2>&1 || echo "could not generate runs into $corpus"
fi
runs=()
if [[ -d "$corpus" ]]; then
  for run in "$corpus"/*/; do
    compgen -G "$run/step_*.safetensors" >/dev/null && runs+=("${run%/}")
  done
fi
echo "corpus: ${#runs[@]} runs in $corpus"
# Under qemu: the sparsest run (modelled chunks) and the densest (rANS chunks).
arm_runs=()
for run in "${runs[@]}"; do
  case "$(basename "$run")" in
    real_ocr_lr3e-7 | real_gpt2_lr5e-6 | gen_low | gen_high) arm_runs+=("$run") ;;
  esac
done

header=$ARC_V3/single_include/arc_v3.hpp
# Regenerated from src/ (into the work folder), the committed files are unchanged.
regenerated() {
  python3 single_include/amalgamate.py --out "$WORK/generated" &&
    git diff --no-index --exit-code single_include/arc_v3.hpp "$WORK/generated/arc_v3.hpp" &&
    git diff --no-index --exit-code single_include/arc_v3.cc "$WORK/generated/arc_v3.cc"
}
check generated regenerated

# The issue's commands, in folders holding only the header and the program.
x86_build() {  # COMPILER DIR
  fresh_folder "$2" "$header" "$HERE/user.cc" && cd "$2" &&
    "$1" "${FLAGS[@]}" -I. user.cc "${LIBS[@]}" -o user
}
start build-g++ x86_build g++ "$WORK/g++"
start build-clang++ x86_build clang++ "$WORK/clang++"
finish build-g++
finish build-clang++
x86_targets="AVX3_DL AVX3 AVX2 SSE4 EMU128|AVX3 AVX2 SSE4 EMU128|AVX2 SSE4 EMU128|SSE4 EMU128"
check golden-g++ golden "$x86_targets" "$WORK/g++/user"
check golden-clang++ golden "$x86_targets" "$WORK/clang++/user"

# The split build: the implementation in the generated arc_v3.cc, the users beside it.
split_build() {
  local dir=$WORK/split
  mkdir -p "$dir/third_party/arc_v3" "$dir/src" &&
    cp "$header" "$ARC_V3/single_include/arc_v3.cc" "$dir/third_party/arc_v3/" &&
    cp "$HERE"/split/*.cc "$HERE"/split/*.h "$dir/src/" && cd "$dir" &&
    g++ "${FLAGS[@]}" -c third_party/arc_v3/arc_v3.cc -o arc_v3.o &&
    for f in sender receiver main; do g++ "${FLAGS[@]}" -c "src/$f.cc" -o "$f.o" || return 1; done &&
    g++ arc_v3.o sender.o receiver.o main.o "${LIBS[@]}" -o split && ./split
}
arm_build() {
  fresh_folder "$WORK/arm" "$header" "$HERE/user.cc" && cd "$WORK/arm" &&
    aarch64-linux-gnu-g++ "${FLAGS[@]}" -I. user.cc "${LIBS[@]}" \
      -Wl,-rpath,/usr/lib/aarch64-linux-gnu -o user
}
start split-build split_build
start build-aarch64 arm_build
finish split-build
finish build-aarch64
# qemu runs the arm64 libc from / (tests/run_neon.sh says why not the cross sysroot).
arm() { QEMU_CPU=$1 qemu-aarch64 -L / "$WORK/arm/user" "${@:2}"; }
check golden-aarch64-max golden "SVE2 SVE NEON EMU128" arm max
check golden-aarch64-cortex-a72 golden "NEON EMU128" arm cortex-a72

# The declarations alone: no third-party header, and C++11 is enough.
decls_only() {
  fresh_folder "$WORK/decls" "$header" && cd "$WORK/decls" &&
    printf '#include "arc_v3.hpp"\nconst char* Name() { return arc_v3::ErrorName(arc_v3::ErrorCode::kOk); }\n' >decls.cc &&
    for cxx in g++ clang++; do
      "$cxx" -std=c++17 -M decls.cc >deps.txt || return 1
      if grep -Eo '[^ ]*(hwy|zstd|lz4|xxh)[^ ]*' deps.txt; then return 1; fi
      "$cxx" -std=c++11 -Wall -Wextra -Werror -c decls.cc -o decls.o || return 1
    done
}
check declarations-only decls_only

# Misuse stops at the header's own #error (before the implementation would compile).
misuse() {  # NAME EXPECTED_MESSAGE PREAMBLE COMPILER_FLAGS...
  local name=$1 message=$2 preamble=$3
  shift 3
  mkdir -p "$WORK/misuse" && cp "$header" "$WORK/misuse/" && cd "$WORK/misuse" &&
    printf '%b#define ARC_V3_IMPLEMENTATION\n#include "arc_v3.hpp"\n' "$preamble" >"$name.cc" &&
    ! g++ "$@" -c "$name.cc" -o "$name.o" 2>"$name.err" && cat "$name.err" &&
    grep -q "#error \"arc_v3.hpp: .*$message" "$name.err" &&
    [[ $(grep -c ": error:" "$name.err") -eq 1 ]]  # the implementation was skipped
}
check misuse-c++14 misuse cxx14 "needs C++17" "" -std=c++14
check misuse-no-exceptions misuse noexcept "needs exceptions" "" -std=c++17 -fno-exceptions
check misuse-highway-first misuse hwyfirst "before any Highway" '#include <hwy/highway.h>\n' -std=c++17
# Highway's own target loop instead of the unrolled one: needs -I to the header's folder.
check foreach-target g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -DARC_V3_HWY_FOREACH_TARGET \
  -I"$WORK/g++" "$WORK/g++/user.cc"

# skip NAME WHY: a check that cannot run here, shown and counted as skipped.
skip() {
  skipped=$((skipped + 1))
  echo "skipped $1 ($2)"
}
# Real checkpoints: every target and both compilers give the same payloads.
if (( ${#runs[@]} == 0 )); then
  for name in roundtrip-g++ roundtrip-clang++ roundtrip-aarch64-max; do
    skip "$name" "no step_*.safetensors runs in $corpus"
  done
elif (( ${#arm_runs[@]} == 0 )); then
  skip roundtrip-aarch64-max "neither real_ocr_lr3e-7 nor real_gpt2_lr5e-6 in $corpus"
fi
if (( ${#runs[@]} > 0 )); then
  check roundtrip-g++ bash -c '"$1" roundtrip "${@:3}" >"$2"' _ "$WORK/g++/user" "$WORK/rt.txt" "${runs[@]}"
  check roundtrip-clang++ same_payloads "$WORK/rt-clang.txt" "$WORK/clang++/user" roundtrip "${runs[@]}"
  if (( ${#arm_runs[@]} > 0 )); then
    arm_roundtrip() {
      arm max roundtrip "${arm_runs[@]}" >"$WORK/rt-arm.txt" || return 1
      local pattern
      pattern=$(printf '^%s |' "${arm_runs[@]##*/}")
      grep -E "${pattern%|}" "$WORK/rt.txt" | diff - "$WORK/rt-arm.txt"
    }
    check roundtrip-aarch64-max arm_roundtrip
  fi
fi

# The Bazel library (//:arc_v3): the same program linked against it.
bazel_linked() {
  bazel build //tests/single_header:user_linked &&
    golden "AVX3_DL|AVX3|AVX2|SSE4" bazel-bin/tests/single_header/user_linked &&
    if (( ${#runs[@]} > 0 )); then
      same_payloads "$WORK/rt-bazel.txt" bazel-bin/tests/single_header/user_linked roundtrip "${runs[@]}"
    fi
}
check bazel-library bazel_linked

# Every suite of `bazel test //...` is a ctest of the CMake build.
same_suites() {
  cmake -S "$ARC_V3" -B "$WORK/suites" >/dev/null || return 1
  bazel query 'tests(//...) except attr(tags, "manual", //...)' 2>/dev/null |
    sed 's/.*://' | sort >"$WORK/bazel-suites.txt"
  (cd "$WORK/suites" && ctest -N) | sed -nE 's/^ *Test +#[0-9]+: ([^ ]+)$/\1/p' | sort >"$WORK/cmake-suites.txt"
  echo "bazel: $(wc -l <"$WORK/bazel-suites.txt") suites, ctest: $(wc -l <"$WORK/cmake-suites.txt")"
  [[ -s "$WORK/bazel-suites.txt" ]] && diff "$WORK/bazel-suites.txt" "$WORK/cmake-suites.txt"
}
check ctest-has-every-bazel-suite same_suites

# The README's blocks, as written: app.cc, then each way to build it.
app=$WORK/app.cc
readme_block 1 >"$app"
# The app prints "ok: N bytes, restored (TARGET)"; COUNT such lines are due.
readme_way() {  # N COUNT DIR [PREFIX]
  local out=$WORK/logs/readme-$1.out
  fresh_folder "$3" "$app" && run_readme_block "$1" "$3" "${4:-}" >"$out" 2>&1
  local status=$?
  cat "$out"
  [[ $status -eq 0 && $(grep -c "^ok: [0-9]* bytes, restored (" "$out") -eq $2 ]]
}
check readme-drop-in readme_way 2 1 "$WORK/readme-drop-in"

# Bazel: a workspace of its own, at a fixed place so that later runs reuse its output
# base; offline, Bazel 4 needs the stand-ins (third_party/stand_in/) and no downloads.
readme_bazel() {
  local dir=${TMPDIR:-/tmp}/arc_v3_bazel_consumer status
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  {
    echo "build --experimental_repository_disable_download --nosandbox_debug"
    for repo in rules_cc rules_java remote_coverage_tools; do
      echo "build --override_repository=$repo=$ARC_V3/third_party/stand_in/$repo"
    done
  } >"$dir/.bazelrc"
  readme_way 3 1 "$dir"
  status=$?
  (cd "$dir" && bazel shutdown) >/dev/null 2>&1
  return $status
}
check readme-bazel readme_bazel

# CMake and pkg-config: the build-and-install block (unless stage 4 ran it), then the
# consumer block; then the CI program against the same package.
prefix=${ARC_V3_PREFIX:-}
if [[ -z "$prefix" ]]; then
  prefix=$WORK/prefix
  check readme-cmake-install run_readme_block 4 "$WORK/cmake" "$prefix"
fi
installed() {
  local f
  for f in include/arc_v3.hpp lib/libarc_v3.a bin/arc_v3 lib/cmake/arc_v3/arc_v3Config.cmake \
           lib/cmake/arc_v3/arc_v3ConfigVersion.cmake lib/cmake/arc_v3/arc_v3Targets.cmake \
           lib/pkgconfig/arc_v3.pc; do
    [[ -e "$prefix/$f" ]] || { echo "missing $prefix/$f"; return 1; }
  done
  "$prefix/bin/arc_v3" --help >/dev/null
}
check cmake-installed-files installed
check readme-cmake-pkg-config readme_way 5 2 "$WORK/readme-cmake" "$prefix"
cmake_linked() {
  cmake -S "$HERE/consumer" -B "$WORK/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$WORK/consumer" &&
    golden "AVX3_DL|AVX3|AVX2|SSE4" "$WORK/consumer/user" &&
    if (( ${#runs[@]} > 0 )); then
      same_payloads "$WORK/rt-cmake.txt" "$WORK/consumer/user" roundtrip "${runs[@]}"
    fi
}
check cmake-package-consumer cmake_linked

size=$(wc -c <"$header")
lines=$(wc -l <"$header")
echo "single_include/arc_v3.hpp: $size bytes, $lines lines"
echo "${passed} passed, ${failed} failed, ${skipped} skipped (drop-in header and packages)"
[[ $failed -eq 0 ]]
