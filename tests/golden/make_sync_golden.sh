#!/bin/bash
# Writes the golden store of sync protocol 2 (tests/golden/sync_v2/): small local stores
# published with the CLI, and what the CLI's pull makes of them, as SHA-256 and size per
# file. Its README.md (written below) says what it holds and when it may be regenerated.
#
#   bazel build //tools/cli:arc_v3_cli
#   bash tests/golden/make_sync_golden.sh bazel-bin/tools/cli/arc_v3_cli tests/golden/sync_v2
#
# OUT/stores/<case>/{case.json, store/, keys/*.pub} in the case format of
# tests/from_spec/README.md, so that two readers check it: tests/cli/golden_sync_test.py
# (the CLI's pull, bit for bit) and tests/from_spec/check.py (the implementation written
# from the specifications). Replaces OUT/stores and OUT/README.md, nothing else in OUT.
# The checkpoints are deterministic (fixed seeds); the stores differ from run to run in
# times (published_at), run ids and keys, so regenerating rewrites the stores but not the
# expected files' hashes.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PATH/TO/arc_v3_cli OUT" >&2; exit 2; }
CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$CLI" ] || { echo "make_sync_golden: $CLI is not executable" >&2; exit 1; }
mkdir -p "$2"
OUT="$(cd "$2" && pwd)"
rm -rf "$OUT/stores" "$OUT/README.md"
mkdir -p "$OUT/stores"

PY=
for p in /usr/bin/python3 python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || { echo "make_sync_golden: no python3 with numpy" >&2; exit 1; }

W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/tmp" && export TMPDIR="$W/tmp"
export ARC_V3_INCARNATION=0
unset ARC_V3_SIGN_KEY ARC_V3_TRUST ARC_V3_TRUSTED_KEYS

fail() { echo "make_sync_golden: $*" >&2; exit 1; }

cat > "$W/tool.py" <<'EOF'
import hashlib, json, os, re, sys, zlib
import numpy as np

def write_st(path, tensors, metadata=None):
    """A safetensors file of {name: (dtype, array)} in that order."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, a) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
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

# BF16 bit patterns the codec must carry exactly: quiet and signalling NaNs (with
# payloads, both signs), infinities, zeros of both signs, denormals, the extremes.
ODD_BF16 = [0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F,
            0x0040, 0x7F7F, 0xFF7F]
ODD_F32 = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -1.2e-38, 3.4e38, 1.0], dtype="<f4")

def with_odd(a, k):
    """Puts the odd BF16 values into a (rotated by k so that shards differ)."""
    flat = a.reshape(-1)
    for i, v in enumerate(ODD_BF16[k % 4:][: flat.size // 2]):
        flat[(3 * i + k) % flat.size] = v
    return a

def shard_tensors(rng, k, shards):
    if shards > 2:  # the many-shard run: a few dozen elements per shard
        return {f"layers.{k}.w": ("BF16", with_odd(bf16(rng, (6, 8)), k)),
                f"layers.{k}.b": ("BF16", bf16(rng, (8,)))}
    t = {f"layers.{k}.attn.w": ("BF16", with_odd(bf16(rng, (12, 8)), k)),
         f"layers.{k}.mlp.w": ("BF16", bf16(rng, (16, 8))),
         f"layers.{k}.norm": ("BF16", (0x3F80 + rng.integers(-3, 4, 8)).astype("<u2"))}
    if k == 0:
        t["embed.w"] = ("BF16", with_odd(bf16(rng, (20, 8)), 5))
        t["scale"] = ("F32", ODD_F32.copy())
        t["h16"] = ("F16", np.array([np.nan, -np.inf, -0.0, 6e-8, 1.5], dtype="<f2"))
        t["count"] = ("I64", np.array(0, dtype="<i8"))  # rank 0
        t["mask"] = ("U8", rng.integers(0, 4, (5, 3)).astype("u1"))
        t["flag"] = ("BOOL", rng.integers(0, 2, 7).astype("u1"))
        t["empty"] = ("BF16", np.zeros((0, 4), dtype="<u2"))
    else:
        t["lm_head.w"] = ("BF16", bf16(rng, (10, 8)))
    return t

def step_update(rng, t, step):
    for name, (dtype, a) in list(t.items()):
        flat = a.reshape(-1)
        if dtype == "BF16" and a.size:
            idx = rng.choice(a.size, max(1, a.size // 8), replace=False)
            steps = rng.choice(np.array([-2, -1, 1, 2], dtype=np.int32), idx.size)
            flat[idx] = (flat[idx].astype(np.int32) + steps).astype(np.uint16)
            if step == 3:  # odd values moved: NaN <-> -0, Inf <-> denormal
                flat[0], flat[1] = 0x8000, 0x7FC0
                flat[-1] = 0x0001 if flat[-1] != 0x0001 else 0x7F80
        elif dtype == "F32":
            flat[:] = np.roll(flat, 1)
        elif dtype == "F16":
            flat[-1] = np.float16(step) / 3
        elif dtype == "I64":
            t[name] = (dtype, np.array(step, dtype="<i8"))
        elif dtype in ("U8", "BOOL"):
            flat[step % a.size] ^= 1

def gen(out, steps, shards):
    rng = np.random.default_rng(zlib.crc32(("golden-%d-%d" % (shards, steps)).encode()))
    names = ["model-%05d-of-%05d.safetensors" % (k + 1, shards) for k in range(shards)]
    state = [shard_tensors(rng, k, shards) for k in range(shards)]
    for step in range(steps):
        if step > 0:
            for t in state:
                step_update(rng, t, step)
        d = os.path.join(out, "step%d" % step)
        os.makedirs(d, exist_ok=True)
        for k, t in enumerate(state):
            write_st(os.path.join(d, names[k]), t, {"format": "pt"} if k == 0 else None)
        if shards > 2:  # the many-shard run carries no index (it would be most of its bytes)
            continue
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            size = sum(a.nbytes for t in state for _, a in t.values())
            json.dump({"metadata": {"total_size": size},
                       "weight_map": {n: names[k] for k, t in enumerate(state) for n in t}},
                      f, indent=2, sort_keys=True)
            f.write("\n")
    print(" ".join(names))

def manifest(root):
    """{relative path: [sha256 hex, size]} of every file outside .arc_v3/."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.relpath(dirpath, root) == ".":
            dirnames[:] = [d for d in dirnames if d != ".arc_v3"]
        for name in filenames:
            p = os.path.join(dirpath, name)
            data = open(p, "rb").read()
            out[os.path.relpath(p, root)] = [hashlib.sha256(data).hexdigest(), len(data)]
    return dict(sorted(out.items()))

def pull_entry(report, rc, step, trust, tensors, rows, after, pulled, note, w):
    """One pull of case.json from the CLI's `pull --json` report and exit code."""
    try:
        r = json.load(open(report))
    except ValueError:
        sys.exit("not a JSON report: " + open(report).read())
    ok = r.get("ok") is True
    if ok != (rc == "0"):
        sys.exit("exit %s but ok=%s" % (rc, ok))
    expect = "ok" if ok else r.get("error")
    if not expect:
        sys.exit("a failed pull without an error name: " + json.dumps(r))
    if rows:
        a, _, b = rows.partition(":")
        rows = [int(a or 0), int(b) if b else None]
    e = {"step": int(step) if step else None, "trust": trust.split() if trust else [],
         "tensors": tensors or None, "rows": rows or None,
         "after": int(after) if after else None, "expect": expect, "exit": int(rc),
         "sha256": manifest(pulled) if ok else None, "note": note}
    if not ok:
        # Paths of the machine that ran the generator are dropped: "store" is the case's store.
        msg = r.get("message", "").replace(w + "/", "")
        e["message"] = re.sub(r"(?<!\S)/\S*/store(?=/|\s|$)", "store", msg)
    print(json.dumps(e))
    print(expect, file=sys.stderr)

def case(path, name, note, pulls_file):
    pulls = [json.loads(l) for l in open(pulls_file) if l.strip()]
    with open(path, "w") as f:
        json.dump({"name": name, "note": note, "store": "store", "pulls": pulls}, f, indent=1)
        f.write("\n")

def same_files(a, b):
    """Exit 1 unless a's files outside .arc_v3/ are b's, byte for byte."""
    sys.exit(0 if manifest(a) == manifest(b) else 1)

cmd, args = sys.argv[1], sys.argv[2:]
{"gen": lambda: gen(args[0], int(args[1]), int(args[2])),
 "pull_entry": lambda: pull_entry(*args),
 "case": lambda: case(*args),
 "same_files": lambda: same_files(*args)}[cmd]()
EOF
tool() { "$PY" "$W/tool.py" "$@"; }

# gen_run DIR STEPS SHARDS: the checkpoints of a run (DIR/stepN/); FILES: the shard files.
gen_run() {
  FILES=($(tool gen "$@")) || fail "generating $1"
}

# publish_run STORE DATA STEPS ANCHOR_EVERY [ARGS...]: publishes steps 0..STEPS-1 of every
# shard in order; ARGS go to every publish, PER_STEP_ARGS[step] to that step's.
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
        --shard "$k/${#FILES[@]}" --anchor-every "$every" -q -T 1 "$@" ${PER_STEP_ARGS[$s]:-} \
        > "$W/publish.out" 2>&1 ||
        { cat "$W/publish.out" >&2; fail "publish $store step $s shard $k"; }
    done
  done
  PER_STEP_ARGS=()
}

# begin_case NAME NOTE STORE DATA; pull ...; end_case.
CASE= CASE_NAME= DATA= NPULL=0
begin_case() {
  CASE_NAME="$1" CASE_NOTE="$2" CASE="$OUT/stores/$1" DATA="$4" NPULL=0
  mkdir -p "$CASE"
  cp -a "$3" "$CASE/store"
  : > "$W/pulls.jsonl"
  rm -rf "$W/pulls"
}
add_key() {
  mkdir -p "$CASE/keys"
  cp "$1" "$CASE/keys/"
}
# pull NOTE [--step N] [--trust keys/K.pub]... [--tensors RE] [--rows A:B] [--after K]:
# the CLI's pull of the case's store into an empty directory (--after K: into pull K's
# directory, which then holds this pull's result), recorded with its result. A full pull
# that succeeds must give the published checkpoint of its step.
pull() {
  local note="$1" step= trust= tensors= rows= after= args=()
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --step) step="$2"; args+=(--step "$2") ;;
      --trust) trust="${trust:+$trust }$2"; args+=(--trusted-keys "$CASE/$2") ;;
      --tensors) tensors="$2"; args+=(--tensors "$2") ;;
      --rows) rows="$2"; args+=(--rows "$2") ;;
      --after) after="$2" ;;
      *) fail "pull: unknown option $1" ;;
    esac
    shift 2
  done
  local dir="$W/pulls/$NPULL" rc=0
  mkdir -p "$W/pulls"
  if [ -n "$after" ]; then cp -a "$W/pulls/$after" "$dir"; fi
  "$CLI" pull "$CASE/store" "$dir" "${args[@]}" -T 1 --json > "$W/report.json" 2> "$W/pull.err" ||
    rc=$?
  tool pull_entry "$W/report.json" "$rc" "$step" "$trust" "$tensors" "$rows" "$after" "$dir" \
    "$note" "$W" >> "$W/pulls.jsonl" 2> "$W/expect.txt" ||
    { cat "$W/pull.err" >&2; fail "$CASE_NAME: pull $note"; }
  local expect
  expect="$(cat "$W/expect.txt")"
  if [ "$expect" = ok ] && [ -z "$tensors$rows" ]; then
    tool same_files "$dir" "$DATA/step${step:-$LAST}" ||
      fail "$CASE_NAME: pull $note: not the published checkpoint"
  fi
  printf '  %-12s pull%-3s %-12s %s\n' "$CASE_NAME" "$NPULL" "$expect" "$note" >&2
  NPULL=$((NPULL + 1))
}
end_case() {
  tool case "$CASE/case.json" "$CASE_NAME" "$CASE_NOTE" "$W/pulls.jsonl"
}

# The pulls every case records: full pulls of every step from empty, chains (a directory
# pulled again: the deltas after its step), partial pulls, a step not committed.
standard_pulls() {  # standard_pulls [--trust keys/K.pub]
  local s
  pull "latest (step $LAST)" "$@"
  for ((s = 0; s < LAST; s++)); do pull "step $s" --step "$s" "$@"; done
  pull "step 3 after step 1 (pull 2's directory)" --step 3 --after 2 "$@"
  pull "step $LAST after step 3 (the previous pull's directory)" --step "$LAST" \
    --after "$((NPULL - 1))" "$@"
  pull "step 5 after step 4 (pull 5's directory)" --step 5 --after 5 "$@"
  pull "step 3, layers.1.*" --step 3 --tensors 'layers\.1\..*' "$@"
  pull "step 4, rows 2:5 of every tensor" --step 4 --rows 2:5 "$@"
  pull "latest, embed.w|layers.0.w|scale rows 1: (open-ended)" \
    --tensors 'embed\.w|layers\.0\.w|scale' --rows 1: "$@"
  pull "step 9: not committed" --step 9 "$@"
}

STEPS=6
LAST=$((STEPS - 1))
"$CLI" keygen "$W/trainer.key" > /dev/null || fail keygen
"$CLI" keygen "$W/other.key" > /dev/null || fail keygen

# Two shards (model.safetensors.index.json), anchors every 2 steps (0, 2, 4).
gen_run "$W/d2" "$STEPS" 2
PER_STEP_ARGS[1]="-e 0"
PER_STEP_ARGS[3]="--format arc_v3_published"
publish_run "$W/s2" "$W/d2" "$STEPS" 2
begin_case shards2 "2 shards with an index, steps 0..5, anchors at 0, 2, 4; step 1 at effort 0, \
step 3 in format arc_v3_published; BF16 NaN/Inf/-0/denormals, F32, F16, I64 (rank 0), U8, BOOL, \
an empty tensor" "$W/s2" "$W/d2"
add_key "$W/trainer.key.pub"
standard_pulls
pull "latest, trusting a key (the steps are unsigned)" --trust keys/trainer.key.pub
end_case

publish_run "$W/s2sig" "$W/d2" "$STEPS" 2 --sign-key "$W/trainer.key"
begin_case shards2-signed "the shards2 checkpoints signed (Ed25519, keys/trainer.key.pub), \
anchors at 0, 2, 4" "$W/s2sig" "$W/d2"
add_key "$W/trainer.key.pub"
add_key "$W/other.key.pub"
standard_pulls --trust keys/trainer.key.pub
pull "latest, without trust"
pull "latest, trusting another key" --trust keys/other.key.pub
end_case

# 33 shards: two groups (32 + 1), anchors every 3 steps (0, 3).
gen_run "$W/d33" "$STEPS" 33
publish_run "$W/s33" "$W/d33" "$STEPS" 3
begin_case shards33 "33 shards without an index (groups of 32 and 1), steps 0..5, anchors at 0, 3" \
  "$W/s33" "$W/d33"
standard_pulls
pull "step 2, shards 0, 31, 32" --step 2 --tensors 'layers\.(0|31|32)\..*'
end_case

publish_run "$W/s33sig" "$W/d33" "$STEPS" 3 --sign-key "$W/trainer.key"
begin_case shards33-signed "shards33's checkpoints, signed (keys/trainer.key.pub), anchors 0, 3" \
  "$W/s33sig" "$W/d33"
add_key "$W/trainer.key.pub"
standard_pulls --trust keys/trainer.key.pub
end_case

cat > "$OUT/README.md" <<'EOF'
# sync_v2: the golden store of sync protocol 2

Local stores of protocol 2 (src/sync/PROTOCOL.md), published by the CLI, and the files
that pulling them must give, bit for bit. Every later reader of protocol 2 must pass them:

- `tests/cli/golden_sync_test.py` (Bazel `//tests/cli:golden_sync_test`, CMake
  `golden_sync_test`): the current CLI's `pull` of every case into a fresh directory (a
  chained case into the directory of its earlier pull), each file's SHA-256 and size as
  recorded, no other file; and a byte flipped in a copied object is refused (exit 8 from a
  signed store with `--trusted-keys`, exit 4 from an unsigned one).
- `tests/from_spec/check.py` (Bazel `//tests/from_spec:golden_from_spec_test`, CMake
  `golden_from_spec_test`): the implementation written from the specifications alone.

| case | what |
|---|---|
| `shards2` | 2 shards, `model.safetensors.index.json`, steps 0..5, anchors at 0, 2, 4 (a) |
| `shards2-signed` | the same checkpoints, signed with Ed25519 (`keys/trainer.key.pub`) |
| `shards33` | 33 shards (two groups: 32 + 1), no index, steps 0..5, anchors at 0, 3 |
| `shards33-signed` | the same, signed |

(a) Unsigned; step 1 at effort 0, step 3 in format `arc_v3_published`; BF16 with NaN, Inf,
-0 and denormals, F32, F16, I64 (rank 0), U8, BOOL, an empty tensor.

Each `stores/<case>/case.json` is the store case format of tests/from_spec/README.md:
`store/` the local store, `keys/` public keys (never a private one), and `pulls`, each with
the step (null: the latest), `trust`, `tensors`, `rows`, `after` (null: into an empty
directory; K: into the directory of pull K), `expect` (`ok` or the error name), `exit`
(the CLI's exit code), and `sha256`: every file outside `.arc_v3/` the pull leaves, as
`[SHA-256, size]`.

Protocol version: 2. Until arc_v3 2.0.0 is released, a change of protocol 2 regenerates
this folder, from the repository root:

    bazel build //tools/cli:arc_v3_cli &&
      bash tests/golden/make_sync_golden.sh bazel-bin/tools/cli/arc_v3_cli tests/golden/sync_v2

Once 2.0.0 is released this folder is never regenerated or edited: it is the promise that
every later version reads protocol-2 stores. A later protocol adds its own golden folder
beside it (`sync_v3/`, by its own generator) and leaves this one as it is.
EOF
BYTES="$(find "$OUT" -type f -printf "%s\n" | awk '{s += $1} END {print s}')"
echo "make_sync_golden: $(ls "$OUT/stores" | wc -l) cases, $BYTES bytes in $OUT" >&2
