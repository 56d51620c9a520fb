#!/bin/bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan + libFuzzer) into
# $ARC_V3_FUZZ_OUT (default /tmp/arc_v3_fuzz): fuzz_decode, fuzz_roundtrip, fuzz_kernels,
# fuzz_container, fuzz_documents, fuzz_region_state, fuzz_safetensors, fuzz_s3_answers,
# fuzz_store_faults, fuzz_events, and make_seeds (the seed-corpus writer).
#   tests/fuzz/build.sh            build
#   tests/fuzz/build.sh --seeds    build, then write fresh seed corpora to $OUT/seeds/
#   ARC_V3_FUZZ_FAST=1 tests/fuzz/build.sh   throughput build for long campaigns: -O2,
#                                  UBSan without ASan, edge coverage without comparison
#                                  tracing (3-10x the executions per second; an out-of-
#                                  bounds access is caught only if it crashes; start it from
#                                  a corpus the full build grew), into /tmp/arc_v3_fuzz_fast
#                                  unless ARC_V3_FUZZ_OUT is set
# Needs: clang, libclang-rt-14-dev, libhwy-dev, libzstd-dev, liblz4-dev, libxxhash-dev,
# nlohmann-json3-dev, libcurl4-openssl-dev, libpugixml-dev, libssl-dev, libmicrohttpd-dev. Run a target: tests/fuzz/run.sh TARGET [libFuzzer flags].
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${ARC_V3_FUZZ_FAST:-}" ]]; then
  OUT="${ARC_V3_FUZZ_OUT:-/tmp/arc_v3_fuzz_fast}"
  SANITIZE=(-O2 -fsanitize=undefined -fno-sanitize-recover=undefined
            -fno-sanitize-coverage=trace-cmp)
else
  OUT="${ARC_V3_FUZZ_OUT:-/tmp/arc_v3_fuzz}"
  SANITIZE=(-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined)
fi
CXX="${CXX:-clang++}"
mkdir -p "$OUT/obj"

# The Highway target policy of src/common/build_defs.bzl (HWY_POLICY_DEFINES): every attainable
# target is compiled, so the fuzzers compare all of them.
DEFINES=(-DHWY_COMPILE_ALL_ATTAINABLE -DHWY_BROKEN_EMU128=0 -DHWY_DISABLED_TARGETS=HWY_SSSE3
         -DHWY_WANT_AVX3_DL)
FLAGS=(-std=c++17 -g -fno-omit-frame-pointer -I. "${DEFINES[@]}" "${SANITIZE[@]}")
LIBS=(-lhwy -lzstd -llz4 -lxxhash -lcurl -lpugixml -lcrypto -lmicrohttpd -pthread)

# The library: every source of its layer folders.
LIB_SRCS=(src/codec/*.cc src/checkpoint/*.cc src/sync/*.cc)
OBJS=()
pids=()
for src in "${LIB_SRCS[@]}"; do
  obj="$OUT/obj/$(echo "$src" | tr / _).o"
  OBJS+=("$obj")
  # Rebuild when the source or anything under src/ is newer than the object.
  if [[ ! -f "$obj" || -n "$(find src arc_v3.hpp -newer "$obj" -name '*.[ch]*' -print -quit)" ]]; then
    "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" &
    pids+=($!)
    # At most two compilers at once (shared machine).
    if (( ${#pids[@]} >= 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

for target in decode roundtrip kernels container documents region_state safetensors s3_answers store_faults \
    events; do
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "tests/fuzz/fuzz_$target.cc" "${OBJS[@]}" "${LIBS[@]}" \
    -o "$OUT/fuzz_$target"
  echo "built $OUT/fuzz_$target"
done
"$CXX" "${FLAGS[@]}" tests/fuzz/make_seeds.cc "${OBJS[@]}" "${LIBS[@]}" -o "$OUT/make_seeds"

if [[ "${1:-}" == "--seeds" ]]; then
  rm -rf "$OUT/seeds" && mkdir -p "$OUT/seeds"/{decode,roundtrip,kernels,container} "$OUT/tmp"
  "$OUT/make_seeds" "$OUT/seeds" "$OUT/tmp"
  echo "seeds in $OUT/seeds"
fi
