#!/bin/bash
# The driver's store cases for tests/from_spec (README.md there defines the case directory):
# local stores published with the CLI, and what the CLI's own pull makes of them.
#
#   bash tests/from_spec/make_stores.sh bazel-bin/tools/cli/arc_v3_cli OUT
#
# writes OUT/stores/<name>/{case.json, store/, keys/, expect/pullK/}. Every expected-ok
# pull is the CLI's pull into an empty directory (no earlier state: the anchor route), and
# expect/pullK holds every file it left outside .arc_v3/; an expected error is the error
# name that `pull --json` reports. Deterministic data (fixed seeds); the stores differ from
# run to run only in times and in what follows from them (published_at, run ids).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PATH/TO/arc_v3_cli OUT" >&2; exit 2; }
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$CLI" ] || { echo "make_stores: $CLI is not executable" >&2; exit 1; }
mkdir -p "$2"
OUT="$(cd "$2" && pwd)/stores"
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
  echo "make_stores: $OUT exists: remove it first" >&2
  exit 1
fi
mkdir -p "$OUT"

# A python3 with numpy (the one on PATH may be a shim without it).
PY=
for p in /usr/bin/python3 python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || { echo "make_stores: no python3 with numpy" >&2; exit 1; }

W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
# publish's scratch containers go under $W too.
mkdir -p "$W/tmp" && export TMPDIR="$W/tmp"
export ARC_V3_INCARNATION=0
unset ARC_V3_SIGN_KEY ARC_V3_TRUST ARC_V3_TRUSTED_KEYS

fail() { echo "make_stores: $*" >&2; exit 1; }

# Helpers in python: checkpoints, damage, case.json.
cat > "$W/tool.py" <<'EOF'
import json, os, sys, zlib
import numpy as np

def write_st(path, tensors, metadata=None):
    """A safetensors file of {name: (dtype, array)} in that order."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, a) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for _, a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())

def bf16(rng, shape, scale=0.02):
    x = (rng.standard_normal(shape, dtype=np.float32) * scale).view(np.uint32)
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype("<u2")

def nudge(rng, a, density):
    """Moves `density` of a uint16 array's bit patterns by +-1 (+-2 for a few)."""
    flat = a.reshape(-1)
    k = int(flat.size * density)
    if k == 0:
        return
    idx = rng.choice(flat.size, k, replace=False)
    step = rng.choice(np.array([-2, -1, -1, -1, 1, 1, 1, 2], dtype=np.int32), k)
    flat[idx] = (flat[idx].astype(np.int32) + step).astype(np.uint16)

def shard_tensors(rng, k, kind):
    """Shard k's tensors at step 0."""
    if kind == "tiny":  # the 34-shard run: a few hundred elements per shard
        return {f"layers.{k}.w": ("BF16", bf16(rng, (24, 16))),
                f"layers.{k}.norm": ("BF16", np.full(16, 0x3F80, dtype="<u2"))}
    # "full": the one-shard run's (a dense tensor, every kind of tensor); "small": the
    # others'; "big": small plus two big tensors.
    cols = 128 if kind == "full" else 64
    t = {f"layers.{k}.attn.w": ("BF16", bf16(rng, (96, cols))),
         f"layers.{k}.mlp.w": ("BF16", bf16(rng, (2 * cols, cols))),
         f"layers.{k}.norm": ("BF16", (0x3F80 + rng.integers(-3, 4, cols)).astype("<u2"))}
    if k == 0:
        if kind == "full":
            t["dense.w"] = ("BF16", bf16(rng, (160, 256), 1e-3))  # >= 16384 changes a step: ungrouped
            t["flags"] = ("U8", rng.integers(0, 4, (7, 3)).astype("u1"))
            t["empty"] = ("BF16", np.zeros((0, 4), dtype="<u2"))    # no bytes
            # Every other dtype (F8s as raw bytes): XOR + zstd or stored.
            t["f64"] = ("F64", rng.standard_normal(5).astype("<f8"))
            t["i32"] = ("I32", rng.integers(-1000, 1000, (4, 6)).astype("<i4"))
            t["u32"] = ("U32", rng.integers(0, 2**32, 7, dtype=np.uint64).astype("<u4"))
            t["i16"] = ("I16", rng.integers(-300, 300, 9).astype("<i2"))
            t["u16"] = ("U16", rng.integers(0, 2**16, 9).astype("<u2"))
            t["u64"] = ("U64", rng.integers(0, 2**63, 3, dtype=np.uint64).astype("<u8"))
            t["i8"] = ("I8", rng.integers(-128, 128, 11).astype("i1"))
            t["bool"] = ("BOOL", rng.integers(0, 2, 13).astype("u1"))
            t["f8e4m3"] = ("F8_E4M3", rng.integers(0, 256, (3, 5)).astype("u1"))
            t["f8e5m2"] = ("F8_E5M2", rng.integers(0, 256, 6).astype("u1"))
        t["scale"] = ("F32", rng.standard_normal(16).astype("<f4"))
        t["h16"] = ("F16", rng.standard_normal(33).astype("<f2"))
        t["count"] = ("I64", np.array(0, dtype="<i8"))           # rank 0
    if kind == "big" and k == 0:
        # >= 2^20 BF16 elements: not groupable, rows cut by a partial pull; > 2^21 U8
        # elements (a sparse mask): two row pieces.
        t["embed.w"] = ("BF16", bf16(rng, (1040, 1024)))
        t["big.u8"] = ("U8", (rng.random((4200, 512)) < 0.02).astype("u1"))
    return t

def step_update(rng, t, step, reshape):
    for name, (dtype, a) in list(t.items()):
        if dtype == "BF16" and a.size:
            nudge(rng, a, 0.45 if name == "dense.w" else 0.03 if name != "embed.w" else 0.002)
        elif dtype == "F32":
            a[rng.integers(0, a.size)] = rng.standard_normal()
        elif dtype == "F16":
            a[:3] = rng.standard_normal(3).astype("<f2")
        elif dtype == "I64":
            t[name] = (dtype, np.array(step, dtype="<i8"))
        elif dtype in ("U8", "I8", "I16", "U16", "I32", "U32", "U64", "F64", "F8_E4M3", "F8_E5M2"):
            flat = a.reshape(-1).view("u1")
            flat[rng.integers(0, flat.size, min(5, flat.size))] ^= 1
        elif dtype == "BOOL":
            a[step % a.size] ^= 1
    if reshape and "flags" in t:  # a reshaped and an added tensor: carried whole
        t["flags"] = ("U8", t["flags"][1].reshape(3, 7).copy())
        t["new.bias"] = ("BF16", bf16(rng, (64,)))

def gen(out, steps, shards, kind, index, reshape_at):
    rng = np.random.default_rng(zlib.crc32(("%s-%d-%d" % (kind, shards, steps)).encode()))
    names = ["model.safetensors"] if shards == 1 else \
        ["model-%05d-of-%05d.safetensors" % (k + 1, shards) for k in range(shards)]
    state = [shard_tensors(rng, k, kind) for k in range(shards)]
    for step in range(steps):
        if step > 0:
            for k, t in enumerate(state):
                step_update(rng, t, step, step == reshape_at)
        d = os.path.join(out, "step%d" % step)
        os.makedirs(d, exist_ok=True)
        for k, t in enumerate(state):
            write_st(os.path.join(d, names[k]), t, {"format": "pt"} if k == 0 else None)
        if index:
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": sum(a.nbytes for t in state for _, a in t.values()),
                                        "step": step},
                           "weight_map": {n: names[k] for k, t in enumerate(state) for n in t}}, f, indent=2)
    print(" ".join(names))

def case(path, name, note, pulls_file):
    pulls = [json.loads(l) for l in open(pulls_file) if l.strip()]
    with open(path, "w") as f:
        json.dump({"name": name, "note": note, "store": "store", "pulls": pulls}, f, indent=1)
        f.write("\n")

def pull_entry(report, step, trust, tensors, rows, files, note, case_dir):
    """One pull of case.json from the CLI's `pull --json` report (its message with paths
    relative to the case directory)."""
    try:
        r = json.load(open(report))
    except ValueError:
        sys.exit("not a JSON report: " + open(report).read())
    ok = r.get("ok") is True
    expect = "ok" if ok else r.get("error")
    if not expect:
        sys.exit("a failed pull without an error name: " + json.dumps(r))
    if rows:
        a, _, b = rows.partition(":")
        rows = [int(a or 0), int(b) if b else None]
    print(json.dumps({"step": int(step) if step else None, "trust": trust.split() if trust else [],
                      "tensors": tensors or None, "rows": rows or None, "expect": expect,
                      "files": files if ok else None, "note": note,
                      **({} if ok else {"message": r.get("message", "").replace(case_dir + "/", "")})}))
    print(expect, file=sys.stderr)

def replace(path, old, new):
    """Replaces the first `old` in a text file (it must be there)."""
    s = open(path).read()
    if old not in s:
        sys.exit("%s: no %r" % (path, old))
    open(path, "w").write(s.replace(old, new, 1))

def bump(path, field):
    """Changes the first digit of a field's value, keeping the document's size."""
    s = open(path).read()
    key = '"%s": ' % field
    i = s.find(key)
    if i < 0:
        sys.exit("%s: no %s" % (path, key))
    i += len(key)
    if s[i] == '"':
        i += 1
    c = s[i]
    digits = "0123456789abcdef"
    if c not in digits:
        sys.exit("%s: %s is not a number or hex" % (path, field))
    new = digits[(digits.index(c) + 1) % (10 if field not in ("base_root_xxh3",) else 16)]
    if new == "0" and field != "base_root_xxh3":
        new = "2"
    open(path, "w").write(s[:i] + new + s[i + 1:])

def flip(path, at):
    """Flips bit 2 of byte `at` (negative: from the end)."""
    with open(path, "r+b") as f:
        b = bytearray(f.read())
        b[int(at)] ^= 4
        f.seek(0)
        f.write(b)

def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(int(size))

def unsign(path):
    """A signed root made a valid unsigned one, as an attacker with the bucket would."""
    import base64
    e = json.load(open(path))
    root = json.loads(base64.b64decode(e["payload"]))
    root.pop("base_root_sha256", None)
    root["groups"] = [[g[0], g[1], g[3], g[4]] for g in root["groups"]]
    open(path, "w").write(json.dumps(root) + "\n")

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "gen":  # OUT STEPS SHARDS KIND INDEX(0/1) RESHAPE_AT
    gen(args[0], int(args[1]), int(args[2]), args[3], args[4] == "1", int(args[5]))
elif cmd == "case":  # CASE_JSON NAME NOTE PULLS_JSONL
    case(*args)
elif cmd == "pull_entry":  # REPORT STEP TRUST TENSORS ROWS FILES NOTE CASE_DIR
    pull_entry(*args)
elif cmd == "replace":
    replace(*args)
elif cmd == "bump":
    bump(*args)
elif cmd == "flip":
    flip(*args)
elif cmd == "truncate":
    truncate(*args)
elif cmd == "unsign":
    unsign(*args)
else:
    sys.exit("unknown command " + cmd)
EOF
tool() { "$PY" "$W/tool.py" "$@"; }

# gen_run DIR STEPS SHARDS KIND INDEX RESHAPE_AT: the checkpoints of a run (DIR/stepN/);
# sets FILES to the shard file names.
gen_run() {
  FILES=($(tool gen "$@")) || fail "generating $1"
}

# publish_run STORE DATA STEPS ANCHOR_EVERY [ARGS...]: publishes steps 0..STEPS-1 of every
# shard in order. ARGS go to every publish; PER_STEP_ARGS[step] (a string) to that
# step's.
declare -A PER_STEP_ARGS=()
publish_run() {
  local store="$1" data="$2" steps="$3" every="$4" s k
  shift 4
  for ((s = 0; s < steps; s++)); do
    for k in "${!FILES[@]}"; do
      local prev=()
      [ "$s" -gt 0 ] && prev=(--prev "$data/step$((s - 1))/${FILES[$k]}")
      # shellcheck disable=SC2086
      "$CLI" publish "$store" --step "$s" --next "$data/step$s/${FILES[$k]}" "${prev[@]}" \
        --shard "$k/${#FILES[@]}" --anchor-every "$every" -q "$@" ${PER_STEP_ARGS[$s]:-} \
        > "$W/publish.out" 2>&1 || { cat "$W/publish.out" >&2; fail "publish $store step $s shard $k"; }
    done
  done
  PER_STEP_ARGS=()
}

# Cases: begin_case NAME NOTE STORE copies STORE into the case; pull ... adds pulls;
# end_case writes case.json.
CASE= CASE_NAME= CASE_NOTE= NPULL=0
begin_case() {
  CASE_NAME="$1" CASE_NOTE="$2" CASE="$OUT/$1" NPULL=0
  [ ! -e "$CASE" ] || fail "duplicate case $1"
  mkdir -p "$CASE"
  cp -a "$3" "$CASE/store"
  : > "$W/pulls.jsonl"
}
# add_key FILE: copies a public key into the case's keys/ (its trust path).
add_key() {
  mkdir -p "$CASE/keys"
  cp "$1" "$CASE/keys/"
}
# pull NOTE [--step N] [--trust keys/K.pub]... [--tensors RE] [--rows A:B] [--want DIR]:
# the CLI's pull of the case's store into an empty directory, recorded with its result.
# --want: the pull must succeed and give DIR's files (the checkpoint published).
pull() {
  local note="$1" step= trust= tensors= rows= want= args=()
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --step) step="$2"; args+=(--step "$2") ;;
      --trust) trust="${trust:+$trust }$2"; args+=(--trusted-keys "$CASE/$2") ;;
      --tensors) tensors="$2"; args+=(--tensors "$2") ;;
      --rows) rows="$2"; args+=(--rows "$2") ;;
      --want) want="$2" ;;
      *) fail "pull: unknown option $1" ;;
    esac
    shift 2
  done
  local dir="$W/pull" files="expect/pull$NPULL"
  rm -rf "$dir"
  "$CLI" pull "$CASE/store" "$dir" "${args[@]}" --json > "$W/report.json" 2> "$W/pull.err" || true
  tool pull_entry "$W/report.json" "$step" "$trust" "$tensors" "$rows" "$files" "$note" "$CASE" \
    >> "$W/pulls.jsonl" 2> "$W/expect.txt" || { cat "$W/pull.err" >&2; fail "$CASE_NAME: pull $note"; }
  local expect
  expect="$(cat "$W/expect.txt")"
  if [ "$expect" = ok ]; then
    mkdir -p "$CASE/$files"
    (cd "$dir" && find . -path ./.arc_v3 -prune -o -type f -print0 | xargs -0 -r cp --parents -t "$CASE/$files")
  fi
  if [ -n "$want" ]; then
    [ "$expect" = ok ] || fail "$CASE_NAME: pull $note: $expect"
    diff -r "$want" "$CASE/$files" > /dev/null || fail "$CASE_NAME: pull $note: other files than $want"
  fi
  printf '  %-34s pull%-3s %-18s %s\n' "$CASE_NAME" "$NPULL" "$expect" "$note" >&2
  NPULL=$((NPULL + 1))
}
end_case() {
  tool case "$CASE/case.json" "$CASE_NAME" "$CASE_NOTE" "$W/pulls.jsonl"
}

# The key of a store's object or document: first_key STORE FIND-ARGS...
first_key() {
  local store="$1"
  shift
  local k
  k="$(cd "$store" && find . -type f "$@" | LC_ALL=C sort | head -n 1)"
  [ -n "$k" ] || fail "no object $* in $store"
  echo "${k#./}"
}

#------------------------------------------------------------------------------
# 1. One shard: anchors every 3 steps, efforts and both payload formats, an added and a
#    reshaped tensor, rank-0 and empty tensors, other dtypes; full and partial pulls.
gen_run "$W/d1" 7 1 full 0 5
PER_STEP_ARGS[1]="-e 0"
PER_STEP_ARGS[2]="-e 3"
PER_STEP_ARGS[4]="--format arc_v3_published"
publish_run "$W/s1" "$W/d1" 7 3
begin_case shards1-anchors "1 shard, steps 0..6, anchors at 0, 3, 6; efforts 0..3, a version-1 step (4), an added and a reshaped tensor (5)" "$W/s1"
pull "latest" --want "$W/d1/step6"
for s in 0 1 2 3 4 5; do pull "step $s" --step "$s" --want "$W/d1/step$s"; done
pull "step 5, rows 10:50 of every tensor" --step 5 --rows 10:50
pull "step 5, layers.0.*" --step 5 --tensors 'layers\.0\..*'
pull "step 4, scale and count, rows 2:5" --step 4 --tensors 'scale|count' --rows 2:5
pull "step 2, rows 100: (open-ended)" --step 2 --rows 100:
pull "step 4, dense.w rows 7:9" --step 4 --tensors 'dense\.w' --rows 7:9
pull "latest, new.bias and flags (added, reshaped)" --tensors 'new\.bias|flags'
pull "latest, rows past every tensor's end" --rows 5000:6000
pull "latest, a regex matching nothing" --tensors 'nothing'
pull "step 9: not committed" --step 9
end_case

# 2. Four shards with a model.safetensors.index.json, anchors every 2 steps.
gen_run "$W/d4" 5 4 small 1 0
publish_run "$W/s4" "$W/d4" 5 2
begin_case shards4-index "4 shards with model.safetensors.index.json, steps 0..4, anchors every 2" "$W/s4"
pull "latest" --want "$W/d4/step4"
for s in 0 1 2 3; do pull "step $s" --step "$s" --want "$W/d4/step$s"; done
pull "step 3, layers.1.mlp.w and layers.3.mlp.w rows 0:64" --step 3 --tensors 'layers\.(1|3)\.mlp\.w' --rows 0:64
pull "latest, norms" --tensors '.*norm'
pull "step 1, rows 3:4" --step 1 --rows 3:4
end_case

# 3. 34 shards: two groups (32 + 2).
gen_run "$W/d34" 4 34 tiny 1 0
publish_run "$W/s34" "$W/d34" 4 2
begin_case shards34-groups "34 shards (groups of 32 and 2), steps 0..3, anchors every 2" "$W/s34"
pull "latest" --want "$W/d34/step3"
pull "step 1" --step 1 --want "$W/d34/step1"
pull "step 2" --step 2 --want "$W/d34/step2"
pull "latest, shard 33's tensors" --tensors 'layers\.33\..*'
pull "step 1, shards 0 and 32, rows 5:9" --step 1 --tensors 'layers\.(0|32)\.w' --rows 5:9
end_case

# 4. Big tensors: one of >= 2^20 BF16 elements (rows cut by a partial pull) and one of two
#    row pieces.
gen_run "$W/dbig" 3 1 big 0 0
publish_run "$W/sbig" "$W/dbig" 3 0
begin_case big-pieces "1 shard with a 1040x1024 BF16 tensor and a 4200x512 U8 tensor (two pieces), steps 0..2" "$W/sbig"
pull "latest, embed.w rows 100:300" --tensors 'embed\.w' --rows 100:300
pull "step 1, big.u8 rows 4100: (its second piece)" --step 1 --tensors 'big\.u8' --rows 4100:
pull "latest, big.u8 rows 4000:4150 (across pieces)" --tensors 'big\.u8' --rows 4000:4150
end_case

# 5. A signed run, pulled trusting its key.
"$CLI" keygen "$W/trainer.key" > /dev/null || fail keygen
"$CLI" keygen "$W/other.key" > /dev/null || fail keygen
cat "$W/other.key.pub" "$W/trainer.key.pub" > "$W/both.key.pub"
gen_run "$W/dsig" 4 2 small 1 0
publish_run "$W/ssig" "$W/dsig" 4 2 --sign-key "$W/trainer.key"
begin_case signed "2 shards, signed steps 0..3 (anchors every 2), pulled trusting the key" "$W/ssig"
add_key "$W/trainer.key.pub"
add_key "$W/other.key.pub"
add_key "$W/both.key.pub"
pull "latest, trusting" --trust keys/trainer.key.pub --want "$W/dsig/step3"
pull "step 1, trusting" --step 1 --trust keys/trainer.key.pub --want "$W/dsig/step1"
pull "step 2, trusting a file of two keys" --step 2 --trust keys/both.key.pub
pull "step 3, trusting both keys' files" --step 3 --trust keys/other.key.pub --trust keys/trainer.key.pub
pull "latest, trusting, layers.1.* rows 8:40" --trust keys/trainer.key.pub --tensors 'layers\.1\..*' --rows 8:40
pull "latest, without trust" 
pull "latest, trusting another key" --trust keys/other.key.pub
end_case

# 6. A restarted trainer: step 2's shard 0 published by incarnation 0 (other bytes, never
#    committed), then steps 2 and 3 by incarnation r1, whose records supersede it; and a
#    step whose base is not the step before (--base-step).
gen_run "$W/dinc" 6 2 small 0 0
publish_run "$W/sinc" "$W/dinc" 2 2
"$CLI" publish "$W/sinc" --step 2 --next "$W/dinc/step3/${FILES[0]}" --prev "$W/dinc/step1/${FILES[0]}" \
  --shard 0/2 -q || fail "publish of incarnation 0's step 2"
for s in 2 3; do
  for k in 0 1; do
    "$CLI" publish "$W/sinc" --step "$s" --next "$W/dinc/step$s/${FILES[$k]}" \
      --prev "$W/dinc/step$((s - 1))/${FILES[$k]}" --shard "$k/2" --incarnation r1 --anchor-every 2 -q ||
      fail "publish r1 step $s"
  done
done
for k in 0 1; do  # step 5 from step 3 (no step 4)
  "$CLI" publish "$W/sinc" --step 5 --next "$W/dinc/step5/${FILES[$k]}" --prev "$W/dinc/step3/${FILES[$k]}" \
    --base-step 3 --anchor-every 0 --shard "$k/2" --incarnation r1 -q || fail "publish step 5"
done
begin_case incarnations "2 shards; step 2 (an anchor step) committed by incarnation r1 over an uncommitted record of incarnation 0; step 5 based on step 3" "$W/sinc"
pull "latest (step 5: anchor 2, 3, 5)" --want "$W/dinc/step5"
pull "step 2" --step 2 --want "$W/dinc/step2"
pull "step 3" --step 3 --want "$W/dinc/step3"
pull "step 4: never published" --step 4
pull "step 3, layers.0.* rows 1:5" --step 3 --tensors 'layers\.0\..*' --rows 1:5
end_case
begin_case incarnations-anchor-missing "the same run with step 2's anchor of shard 1 deleted" "$W/sinc"
rm "$CASE/store/$(first_key "$CASE/store" -path '*/000000000002-00002-00001/anchor-*.a3d')"
pull "latest"
pull "step 1" --step 1
end_case

#------------------------------------------------------------------------------
# 7. Damaged stores: copies of small runs with one thing broken, pulled from scratch.
gen_run "$W/ddmg" 4 2 small 0 0
publish_run "$W/sdmg" "$W/ddmg" 4 2
D=000000000003
damaged() {  # damaged NAME NOTE: a case on a fresh copy of the damaged-store run
  begin_case "$1" "$2" "$W/sdmg"
}

damaged damaged-delta-flipped "a bit flipped inside step 3's delta of shard 0"
tool flip "$CASE/store/$(first_key "$CASE/store" -path "*/$D-00002-00000/delta-*.a3d")" -100
pull "latest"
pull "step 2 (its route does not read step 3)" --step 2
end_case

damaged damaged-delta-head-flipped "a bit flipped in the header of step 3's delta of shard 0"
tool flip "$CASE/store/$(first_key "$CASE/store" -path "*/$D-00002-00000/delta-*.a3d")" 20
pull "latest"
end_case

damaged damaged-anchor-truncated "step 2's anchor of shard 0 cut short"
K="$(first_key "$CASE/store" -path "*/000000000002-00002-00000/anchor-*.a3d")"
tool truncate "$CASE/store/$K" "$(($(stat -c %s "$CASE/store/$K") - 7))"
pull "latest"
pull "step 2" --step 2
pull "step 1 (anchor 0)" --step 1
end_case

damaged damaged-anchor-missing "step 2's anchor of shard 1 deleted"
rm "$CASE/store/$(first_key "$CASE/store" -path "*/000000000002-00002-00001/anchor-*.a3d")"
pull "latest"
pull "step 1" --step 1
end_case

damaged damaged-record-edited "step 3's record of shard 0 edited (a digit of file_size: same size, other XXH3)"
K="$(first_key "$CASE/store" -path "./r/*/$D-00002-00000/0/00000.json")"
tool bump "$CASE/store/$K" file_size
pull "latest"
end_case

damaged damaged-record-longer "step 3's record of shard 0 one byte longer (file_size)"
K="$(first_key "$CASE/store" -path "./r/*/$D-00002-00000/0/00000.json")"
tool replace "$CASE/store/$K" '"file_size": ' '"file_size": 1'
pull "latest"
end_case

damaged damaged-group-edited "step 3's group index edited (a digit of chain_bytes: same size)"
tool bump "$CASE/store/groups/$D/00002/0/00000.json" chain_bytes
pull "latest"
end_case

damaged damaged-group-longer "step 3's group index one byte longer (chain_bytes)"
tool replace "$CASE/store/groups/$D/00002/0/00000.json" '"chain_bytes": ' '"chain_bytes": 9'
pull "latest"
end_case

damaged damaged-layout-edited "the layout edited (a tensor renamed): only partial pulls read layouts"
# every layout naming it: the group layouts and shard 0's shard layout
for K in $(cd "$CASE/store" && grep -rlF 'layers.0.norm' l); do
  tool replace "$CASE/store/$K" 'layers.0.norm' 'layers.0.NORM'
done
pull "latest"
pull "latest, layers.1.*" --tensors 'layers\.1\..*'
pull "latest, rows 0:2" --rows 0:2
end_case

damaged damaged-root-edited "step 3's root edited (a digit of chain_bytes)"
tool bump "$CASE/store/steps/$D.json" chain_bytes
pull "latest"
pull "step 2 (does not read step 3)" --step 2
end_case

damaged damaged-root-version "step 3's root of version 3"
tool replace "$CASE/store/steps/$D.json" '"version": 2' '"version": 3'
pull "latest"
end_case

damaged damaged-root-base-hash "step 3's base_root_xxh3 edited (a hex digit; the library checks it only to join a directory's step)"
tool bump "$CASE/store/steps/$D.json" base_root_xxh3
pull "latest"
end_case

damaged damaged-root-base-hash-short "step 3's base_root_xxh3 of 17 digits"
tool replace "$CASE/store/steps/$D.json" '"base_root_xxh3": "' '"base_root_xxh3": "0'
pull "latest"
end_case

damaged damaged-base-root-edited "step 2's root edited (a digit of published_at), which step 3's base_root_xxh3 pins (the library checks the pin only to join a directory's step)"
tool bump "$CASE/store/steps/000000000002.json" published_at
pull "latest"
pull "step 2" --step 2
end_case

damaged damaged-latest-ahead "latest names step 7, which has no root"
printf '{"format":"arc_v3-sync","version":2,"kind":"latest","step":7}\n' > "$CASE/store/latest"
pull "latest"
pull "step 3" --step 3
end_case

damaged damaged-latest-behind "latest names step 1; steps 2 and 3 are committed"
printf '{"format":"arc_v3-sync","version":2,"kind":"latest","step":1}\n' > "$CASE/store/latest"
pull "latest"
end_case

damaged damaged-manifest-flipped "a bit flipped in the manifest of step 3's delta of shard 1"
tool flip "$CASE/store/$(first_key "$CASE/store" -path "*/$D-00002-00001/delta-*.a3d")" 60
pull "latest"
end_case

# Signed stores, damaged.
begin_case signed-unsigned-root "the signed run's step 3 root rewritten as a valid unsigned root" "$W/ssig"
add_key "$W/trainer.key.pub"
tool unsign "$CASE/store/steps/$D.json"
pull "latest, trusting" --trust keys/trainer.key.pub
pull "step 2, trusting" --step 2 --trust keys/trainer.key.pub
pull "latest, without trust"
end_case

begin_case signed-delta-flipped "the signed run with a bit flipped in step 3's delta of shard 0" "$W/ssig"
add_key "$W/trainer.key.pub"
tool flip "$CASE/store/$(first_key "$CASE/store" -path "*/$D-00002-00000/delta-*.a3d")" -50
pull "latest, trusting" --trust keys/trainer.key.pub
pull "latest, without trust"
end_case

begin_case signed-record-resigned "the signed run's step 3 record of shard 1 replaced by an unsigned copy" "$W/ssig"
add_key "$W/trainer.key.pub"
K="$(first_key "$CASE/store" -path "./r/*/$D-00002-00000/0/00001.json")"
"$PY" - "$CASE/store/$K" <<'EOF'
import base64, json, sys
e = json.load(open(sys.argv[1]))
open(sys.argv[1], "wb").write(base64.b64decode(e["payload"]))
EOF
pull "latest, trusting" --trust keys/trainer.key.pub
pull "latest, without trust"
end_case

echo "make_stores: $(ls "$OUT" | wc -l) store cases in $OUT" >&2
