#!/bin/bash
# Builds the codec and its test suites for aarch64 with Debian's cross toolchain and runs
# them under qemu-user, once per Arm CPU model, so that every Arm SIMD target Highway
# compiles (SVE2, SVE, NEON, EMU128) is checked against the references and the committed
# x86 payloads (tests/golden/ENCODE.txt: the encoder must reproduce them byte for byte).
#   tests/run_neon.sh                 install what is missing, build, run
#   ARC_V3_NEON_BUILD=/dir tests/run_neon.sh   build directory (default /tmp/arc_v3_neon)
#   ARC_V3_NEON_CPUS="max cortex-a72"          qemu CPU models (max = SVE2, a72 = NEON only)
#   ARC_V3_NEON_FULL=1 tests/run_neon.sh       also bitflip_test (slow under emulation)
# NEON and EMU128 are also exercised under the SVE2 model, whose per-target tests
# enumerate every target the CPU supports.
# kernels_test asserts that it ran on every Arm target the CPU model offers (max: SVE2,
# SVE, NEON, EMU128; cortex-a72: NEON, EMU128), named to it in ARC_V3_EXPECT_TARGETS.
# Prints each suite's doctest summary and the targets it exercised, then the line
# "N passed, N failed, N skipped" (doctest test cases; a suite that fails with no failed
# test case - a crash at exit, a timeout - counts one failure; a build failure or anything
# that stops this script before its suites ran prints "0 passed, 1 failed, 0 skipped");
# exits non-zero on any failure.
set -euo pipefail
counted=""
trap '[[ -n "$counted" ]] || echo "0 passed, 1 failed, 0 skipped (aarch64: stopped before its suites ran)"' EXIT
cd "$(dirname "$0")/.."
BUILD="${ARC_V3_NEON_BUILD:-/tmp/arc_v3_neon}"
CPUS="${ARC_V3_NEON_CPUS:-max cortex-a72}"
CXX=aarch64-linux-gnu-g++

# Toolchain and arm64 libraries (idempotent; Debian's cross compiler, qemu-user and the
# arm64 -dev packages of the codec's libraries).
need=()
command -v "$CXX" >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
for pkg in libhwy-dev libzstd-dev liblz4-dev libxxhash-dev; do
  dpkg -s "$pkg:arm64" >/dev/null 2>&1 || need+=("$pkg:arm64")
done
dpkg -s doctest-dev >/dev/null 2>&1 || need+=(doctest-dev)
if (( ${#need[@]} > 0 )); then
  echo "installing: ${need[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}"
fi

# Same Highway policy as src/common/build_defs.bzl (HWY_POLICY_DEFINES).
FLAGS=(-std=c++17 -O2 -I. -Wall -Wextra -DHWY_COMPILE_ALL_ATTAINABLE -DHWY_BROKEN_EMU128=0
       -DHWY_DISABLED_TARGETS=HWY_SSSE3 -DHWY_WANT_AVX3_DL)
LIBS=(-lhwy -lzstd -llz4 -lxxhash -pthread -Wl,-rpath,/usr/lib/aarch64-linux-gnu)
LIB_SRCS=(src/codec/checksum.cc src/codec/status.cc src/codec/entropy.cc src/codec/encoder.cc src/codec/decoder.cc
          src/codec/kernels.cc src/codec/ref_kernels.cc src/codec/model_coder.cc src/codec/rans_coder.cc src/codec/session.cc
          src/checkpoint/safetensors.cc
          bench/generator.cc bench/dataset.cc tests/doctest_main.cc)
# kernels_test: every kernel on every Arm target vs its reference; encode_golden_test:
# the Arm encoder reproduces the x86 payloads byte for byte on every Arm target; the
# others run the codec, sessions and error paths (multi-threaded too) on Arm.
# The programs run against the arm64 multiarch libc (-L /, installed with the arm64
# libraries above): with the cross toolchain's sysroot (/usr/aarch64-linux-gnu) instead,
# Debian 12's qemu-aarch64 hangs in the first pthread_create.
TESTS=(kernels_test encode_golden_test codec_test corruption_test golden_test
       model_coder_test rans_coder_test session_test tensors_test)
[[ -n "${ARC_V3_NEON_FULL:-}" ]] && TESTS+=(bitflip_test)
mkdir -p "$BUILD/obj"

# Objects are rebuilt when their source or any header is newer (simple make).
compile() {  # src obj
  if [[ ! -f "$2" || "$1" -nt "$2" || -n "$(find src tests bench arc_v3.hpp -name '*.h' -newer "$2" -print -quit)" ]]; then
    "$CXX" "${FLAGS[@]}" -c "$1" -o "$2"
  fi
}
OBJS=()
pids=()
for src in "${LIB_SRCS[@]}" "${TESTS[@]/#/tests/codec/}"; do
  [[ "$src" == *.cc ]] || src="$src.cc"
  obj="$BUILD/obj/$(echo "$src" | tr / _).o"
  [[ "$src" == tests/codec/*_test.cc ]] || OBJS+=("$obj")
  compile "$src" "$obj" &
  pids+=($!)
  if (( ${#pids[@]} >= 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
for t in "${TESTS[@]}"; do
  "$CXX" "$BUILD/obj/tests_codec_$t.cc.o" "${OBJS[@]}" "${LIBS[@]}" -o "$BUILD/$t"
done
echo "built ${TESTS[*]} for aarch64 in $BUILD"

# "skip" for a suite a CPU model does not run (ARC_V3_NEON_FULL=1 runs it). The two longest suites
# (model_coder_test, corruption_test: ~4.5 and ~1.5 minutes each under emulation) run on
# the `max` model only: their SIMD paths are kernels, which kernels_test checks against
# their references on every target of both models, and encode_golden_test checks the
# payloads byte for byte on both; ARC_V3_NEON_FULL=1 runs them on every model.
args_for() {
  case "$1:$2" in
    model_coder_test:cortex-a72 | corruption_test:cortex-a72) echo skip ;;
  esac
}
# The parts a suite runs in, one line of doctest filters each, so that its longest test
# cases run beside the rest (every test case is in exactly one part).
parts_for() {
  case "$1" in
    model_coder_test)
      echo "--test-case=Sessions: a change the bisection*"
      echo "--test-case=Column signs*"
      echo "--test-case-exclude=Sessions: a change the bisection*,Column signs*" ;;
    *) echo "" ;;
  esac
}
# The Highway targets kernels_test must run on under a CPU model (every Arm target that
# model supports and Highway 1.0.3 compiles here); other models: what the CPU reports.
expected_targets() {
  case "$1" in
    max) echo "SVE2 SVE NEON EMU128" ;;
    cortex-a72) echo "NEON EMU128" ;;
  esac
}

# The suites (and their parts) run ARC_V3_NEON_JOBS at a time (default: one per core;
# a qemu-user process runs mostly on one core), longest first, and are reported in order
# once all have ended.
run_part() {  # cpu test filter log: writes log.status ("ok N" or "FAILED N", N seconds)
  local start=$SECONDS status=ok
  ARC_V3_EXPECT_TARGETS="$(expected_targets "$1")" QEMU_CPU="$1" \
    timeout "${ARC_V3_NEON_TIMEOUT:-600}" qemu-aarch64 -L / "$BUILD/$2" ${3:+"$3"} >"$4" 2>&1 || status=FAILED
  echo "$status $((SECONDS - start))" >"$4.status"
}
# Lines "cpu test part filter" of every part to run, in report order.
planned_parts() {
  local cpu t k filter
  for cpu in $CPUS; do
    for t in "${TESTS[@]}"; do
      [[ -z "${ARC_V3_NEON_FULL:-}" && "$(args_for "$t" "$cpu")" == skip ]] && continue
      k=0
      while IFS= read -r filter; do
        echo "$cpu $t $k $filter"
        k=$((k + 1))
      done < <(parts_for "$t")
    done
  done
}
LONGEST_FIRST=(model_coder_test corruption_test kernels_test rans_coder_test session_test)
jobs_max="${ARC_V3_NEON_JOBS:-$(nproc)}"
running=()
while read -r cpu t k filter; do
  rm -f "$BUILD/$t.$cpu.$k.log.status"
  run_part "$cpu" "$t" "$filter" "$BUILD/$t.$cpu.$k.log" &
  running+=($!)
  if (( ${#running[@]} >= jobs_max )); then
    wait -n || true
    alive=()
    for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    running=("${alive[@]}")
  fi
done < <(planned_parts | awk -v longest="${LONGEST_FIRST[*]}" \
           'BEGIN { n = split(longest, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
            { print (($2 in rank) ? rank[$2] : n + 1) "\t" NR "\t" $0 }' | sort -n -k1,1 -k2,2 | cut -f3-)
wait

failed=0
n_passed=0
n_failed=0
n_skipped=0
for cpu in $CPUS; do
  for t in "${TESTS[@]}"; do
    if [[ -z "${ARC_V3_NEON_FULL:-}" && "$(args_for "$t" "$cpu")" == skip ]]; then
      echo "neon[$cpu] $t: skipped (ARC_V3_NEON_FULL=1 runs it)"
      n_skipped=$((n_skipped + 1))
      continue
    fi
    k=0
    while IFS= read -r filter; do
      log="$BUILD/$t.$cpu.$k.log"
      k=$((k + 1))
      read -r status seconds <"$log.status" || { status=FAILED; seconds=0; }
      if [[ $status != ok ]]; then
        failed=1
        tail -40 "$log"
      fi
      summary="$(grep -E '^\[doctest\] (test cases|assertions):' "$log" | tr -s ' ' | paste -sd' ' || true)"
      targets="$(grep -E '^\[hwy\] targets exercised' "$log" || true)"
      echo "neon[$cpu] $t: $status ($seconds s${filter:+, $filter}) | $summary ${targets:+| $targets}"
      cases="$(grep -E '^\[doctest\] test cases:' "$log" | tail -n 1 | tr -s ' ' || true)"
      p="$(sed -nE 's/.*[|] ([0-9]+) passed.*/\1/p' <<<"$cases")"
      f="$(sed -nE 's/.*[|] ([0-9]+) failed.*/\1/p' <<<"$cases")"
      s="$(sed -nE 's/.*[|] ([0-9]+) skipped.*/\1/p' <<<"$cases")"
      p=${p:-0} f=${f:-0} s=${s:-0}
      [[ -z "$filter" ]] || s=0  # doctest counts the test cases a filter left out as skipped
      if [[ $status == FAILED && $f -eq 0 ]]; then
        f=1  # failed outside its test cases (crash at exit, timeout, no summary)
      elif [[ $status == ok && $((p + f)) -eq 0 ]]; then
        f=1  # ran no test case
        failed=1
      fi
      n_passed=$((n_passed + p)) n_failed=$((n_failed + f)) n_skipped=$((n_skipped + s))
    done < <(parts_for "$t")
  done
done
counted=1
echo "${n_passed} passed, ${n_failed} failed, ${n_skipped} skipped (aarch64)"
exit "$failed"
