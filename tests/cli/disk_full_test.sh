#!/bin/bash
# A full disk is io_error (exit 1), naming the file and "No space left on device", and
# leaves nothing behind: diff, apply, publish into a local store and pull each write
# onto a small tmpfs (mounted in a private mount namespace, gone with it). Needs the
# right to mount (root, or unprivileged user namespaces); as root it fails without it.
set -u
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

mkdir full
if ! unshare -m sh -c "mount -t tmpfs -o size=64k tmpfs '$T/full'" 2>/dev/null &&
   ! unshare -rm sh -c "mount -t tmpfs -o size=64k tmpfs '$T/full'" 2>/dev/null; then
  [ "$(id -u)" -ne 0 ] || fail "cannot mount a tmpfs as root"
  echo "SKIP: cannot mount a tmpfs here (not root, no user namespaces)"
  exit 0
fi

# write_u8 FILE: a safetensors file of one U8 tensor "w" of 256 KiB of random bytes.
write_u8() {
  local json='{"w":{"dtype":"U8","shape":[262144],"data_offsets":[0,262144]}}'
  while (( ${#json} % 8 )); do json+=" "; done
  { printf "$(printf '\\x%02x\\x%02x' $((${#json} & 255)) $((${#json} >> 8 & 255)))\x00\x00\x00\x00\x00\x00"
    printf '%s' "$json"
    head -c 262144 /dev/urandom; } > "$1"
}
write_u8 prev.safetensors
write_u8 next.safetensors
"$CLI" diff -q prev.safetensors next.safetensors -o d.a3d || fail "diff"
"$CLI" publish -q store --step 0 --next prev.safetensors || fail "publish step 0"

# on_full_disk NAME SIZE COMMAND...: runs COMMAND with $T/full a tmpfs of SIZE; expects
# exit 1 with io_error and "No space left on device" on stderr, and the tmpfs then
# holding nothing but what NAME's caller allows (KEEP: a find pattern of what may stay).
on_full_disk() {
  local name="$1" size="$2"; shift 2
  unshare -m bash -c '
    mount -t tmpfs -o size="$1" tmpfs "$2/full" || exit 99
    shift 2
    "$@" > "$T/out.txt" 2> "$T/err.txt"
    echo $? > "$T/rc.txt"
    find "$T/full" -type f ! -path "*/.arc_v3/*" | sed "s|^$T/||" > "$T/left.txt"
  ' _ "$size" "$T" "$@" || { [ "$?" -ne 99 ] || fail "$name: mount"; }
  local rc
  rc=$(cat rc.txt)
  [ "$rc" -eq 1 ] || { cat err.txt; fail "$name exited $rc on a full disk, want 1"; }
  grep -q "io_error" err.txt || { cat err.txt; fail "$name: no io_error"; }
  grep -q "No space left on device" err.txt || { cat err.txt; fail "$name: the reason is not given"; }
  [ ! -s left.txt ] || { cat left.txt; fail "$name left files on the full disk"; }
}
export T

on_full_disk diff 64k "$CLI" diff -q prev.safetensors next.safetensors -o full/d.a3d
on_full_disk apply 64k "$CLI" apply -q prev.safetensors d.a3d -o full/out.safetensors
on_full_disk publish 64k "$CLI" publish -q full/store --step 0 --next prev.safetensors
on_full_disk pull 64k "$CLI" pull -q store full/region
on_full_disk "pull --json" 64k "$CLI" pull --json store full/region
grep -q '"error":"io_error"' out.txt || { cat out.txt; fail "pull --json does not name io_error"; }
# Room for the state and the staged object but not the file (DIR's file is 256 KiB): the
# failure comes from writing the output, after the fetch.
on_full_disk "pull, output" 400k "$CLI" pull -q store full/region
echo "PASS"
