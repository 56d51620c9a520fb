#!/bin/bash
# End-to-end checks of the arc_v3 command line on tiny checkpoints made here: round trip,
# in-place and partial apply, the documented exit codes, JSON output.
set -u
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
expect_rc() {  # expect_rc CODE COMMAND...
  local want="$1"; shift
  "$@" > out.txt 2> err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat err.txt; fail "'$*' exited $rc, want $want"; }
}

# write_safetensors FILE JSON DATA: a safetensors file with header JSON (padded to 8 bytes)
# and DATA as printf escapes.
write_safetensors() {
  local json="$2"
  while (( ${#json} % 8 )); do json+=" "; done
  local n=${#json}
  { printf "$(printf '\\x%02x\\x%02x' $((n & 255)) $((n >> 8 & 255)))\x00\x00\x00\x00\x00\x00"
    printf '%s' "$json"
    printf "$3"; } > "$1"
}
# write_st FILE DATA: a U8 tensor "w" [8, 2] and an F32 tensor "b" [4]; DATA is 32 bytes.
write_st() {
  write_safetensors "$1" '{"w":{"dtype":"U8","shape":[8,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}' "$2"
}
A='\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40'
B='\x01\x02\x03\x04\x05\x07\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x11\x00\x01\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\xc0'
write_st prev.safetensors "$A"
write_st next.safetensors "$B"

expect_rc 0 "$CLI" diff -q prev.safetensors next.safetensors -o d.a3d
expect_rc 0 "$CLI" apply -q prev.safetensors d.a3d -o out.safetensors
cmp -s out.safetensors next.safetensors || fail "apply did not rebuild NEXT"
cp prev.safetensors inplace.safetensors
expect_rc 0 "$CLI" apply -q -T 1 inplace.safetensors d.a3d --in-place
cmp -s inplace.safetensors next.safetensors || fail "--in-place did not rebuild NEXT"
expect_rc 0 "$CLI" verify prev.safetensors d.a3d

# Partial apply: rows 2:5 of w, i.e. bytes 4..9 of the data.
expect_rc 0 "$CLI" apply -q prev.safetensors d.a3d --tensors w --rows 2:5 -o part.safetensors
tail -c 6 part.safetensors | cmp -s - <(printf '\x05\x07\x07\x08\x09\x0a') || fail "partial apply rows"

# JSON summaries and inspect.
expect_rc 0 "$CLI" diff --json prev.safetensors next.safetensors -o d2.a3d
grep -q '"ok": true' out.txt || fail "diff --json"
cmp -s d.a3d d2.a3d || fail "diff is not deterministic"
expect_rc 0 "$CLI" inspect d.a3d
grep -q '^w  *U8  *\[8,2\]  *delta' out.txt || { cat out.txt; fail "inspect lists w"; }
expect_rc 0 "$CLI" inspect --json d.a3d
grep -q '"changed": 2' out.txt || { cat out.txt; fail "inspect --json counts w's changes"; }
# A BF16 tensor goes through the arc_v3 codec; inspect names the chunk coder it chose.
write_bf16() {  # FILE DATA: a BF16 tensor "h" [4]
  write_safetensors "$1" '{"h":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}' "$2"
}
write_bf16 h0.safetensors '\x80\x3f\x00\x40\x40\x40\x80\x40'
write_bf16 h1.safetensors '\x81\x3f\x00\x40\x40\x40\x80\x40'
expect_rc 0 "$CLI" diff -q h0.safetensors h1.safetensors -o h.a3d
expect_rc 0 "$CLI" inspect h.a3d
grep -q '^h  *BF16  *\[4\]  *delta .* arc_v3:modelled ' out.txt || { cat out.txt; fail "inspect names arc_v3's chunk coder"; }
expect_rc 0 "$CLI" apply -q h0.safetensors h.a3d -o h2.safetensors
cmp -s h2.safetensors h1.safetensors || fail "apply did not rebuild the BF16 checkpoint"
# Small BF16 tensors are grouped (container version 2); --no-group writes version 1.
[ "$(od -An -tu2 -j4 -N2 h.a3d | tr -d ' ')" = 2 ] || fail "a grouped delta is version 2"
expect_rc 0 "$CLI" inspect h.a3d
grep -q '^h  *BF16 .* group 0 ' out.txt || { cat out.txt; fail "inspect names h's group"; }
expect_rc 0 "$CLI" inspect --json h.a3d
grep -q '"tensors": 1,' out.txt || { cat out.txt; fail "inspect --json lists the group"; }
grep -q '"container_version": 2' out.txt || { cat out.txt; fail "inspect --json names the version"; }
expect_rc 0 "$CLI" diff -q --no-group h0.safetensors h1.safetensors -o h1.a3d
[ "$(od -An -tu2 -j4 -N2 h1.a3d | tr -d ' ')" = 1 ] || fail "--no-group writes version 1"
expect_rc 0 "$CLI" apply -q h0.safetensors h1.a3d -o h3.safetensors
cmp -s h3.safetensors h1.safetensors || fail "apply of a version-1 delta"

# The measurement tool moved out of the shipped command (bench/checkpoint_bench).
expect_rc 2 "$CLI" bench prev.safetensors next.safetensors

# Exit codes: 3 wrong base, 4 corrupt delta, 2 usage, 1 I/O.
expect_rc 3 "$CLI" verify next.safetensors d.a3d
grep -q "wrong base: tensor" err.txt || fail "wrong base message"
expect_rc 3 "$CLI" apply next.safetensors d.a3d -o never.safetensors
cp d.a3d bad.a3d
printf '\xff' | dd of=bad.a3d bs=1 seek=45 conv=notrunc status=none
expect_rc 4 "$CLI" apply prev.safetensors bad.a3d -o never.safetensors
head -c 30 d.a3d > short.a3d
expect_rc 4 "$CLI" apply prev.safetensors short.a3d -o never.safetensors
expect_rc 4 "$CLI" inspect short.a3d
[ ! -e never.safetensors ] || fail "a failed apply left an output file"
expect_rc 2 "$CLI" apply prev.safetensors d.a3d
expect_rc 2 "$CLI" diff prev.safetensors next.safetensors
expect_rc 2 "$CLI" apply prev.safetensors d.a3d --rows 5:2 -o x.safetensors
expect_rc 1 "$CLI" apply missing.safetensors d.a3d -o never.safetensors
expect_rc 0 "$CLI" --help
grep -q "Exit codes" out.txt || fail "--help documents the exit codes"

# An output that exists is replaced only with -f/--force (exit 7 otherwise, untouched).
cp d.a3d keep.a3d
expect_rc 7 "$CLI" diff -q prev.safetensors next.safetensors -o d2.a3d
grep -q "d2.a3d already exists" err.txt || { cat err.txt; fail "diff names the output"; }
grep -q "hint: give -f/--force to replace it" err.txt || { cat err.txt; fail "diff gives the flag that replaces it"; }
expect_rc 7 "$CLI" apply -q prev.safetensors d.a3d -o out.safetensors
cp prev.safetensors other.safetensors
expect_rc 7 "$CLI" apply -q next.safetensors d.a3d -o other.safetensors -T 1
cmp -s other.safetensors prev.safetensors || fail "a refused apply changed the existing output"
expect_rc 0 "$CLI" apply -q -f prev.safetensors d.a3d -o other.safetensors
cmp -s other.safetensors next.safetensors || fail "apply -f replaces the output"
expect_rc 0 "$CLI" diff -q --force next.safetensors prev.safetensors -o d2.a3d
cmp -s d2.a3d d.a3d && fail "diff --force did not replace the output"
expect_rc 7 "$CLI" apply -q prev.safetensors d.a3d --tensors w -o part.safetensors
# A missing output folder is named, not a temporary file.
expect_rc 1 "$CLI" apply -q prev.safetensors d.a3d -o nowhere/out.safetensors
grep -q "its folder .*/nowhere does not exist" err.txt || { cat err.txt; fail "missing folder message"; }
grep -q "arc_v3-tmp" err.txt && fail "the message names a temporary file"
# Reports: verify counts the files it checked; a partial apply gives no share of the delta.
expect_rc 0 "$CLI" verify prev.safetensors d.a3d
grep -q "^verify: 1 file(s), 2 tensors" out.txt || { cat out.txt; fail "verify counts its file"; }
expect_rc 0 "$CLI" apply prev.safetensors d.a3d --tensors w --rows 2:5 -o part2.safetensors
grep -q "^apply (partial): 1 tensors, .* written, read from a delta of" out.txt || { cat out.txt; fail "partial report"; }
grep -q "%" out.txt && { cat out.txt; fail "a partial apply reports a share"; }
# Typos: the nearest subcommand or option is suggested.
expect_rc 2 "$CLI" dif prev.safetensors next.safetensors
grep -q "'dif' is not a command. Did you mean 'diff'?" err.txt || { cat err.txt; fail "subcommand typo"; }
expect_rc 2 "$CLI" diff prev.safetensors next.safetensors --ouput x.a3d
grep -q "unknown option '--ouput'. Did you mean '--output'?" err.txt || { cat err.txt; fail "option typo"; }
expect_rc 2 "$CLI" apply prev.safetensors d.a3d --inplace
grep -q "Did you mean '--in-place'?" err.txt || { cat err.txt; fail "option typo (apply)"; }
echo "cli_test: all checks passed"
