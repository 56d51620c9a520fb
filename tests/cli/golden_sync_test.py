#!/usr/bin/python3
"""The golden store of sync protocol 2 (tests/golden/sync_v2/README.md) through the CLI.

    tests/cli/golden_sync_test.py PATH/TO/arc_v3_cli tests/golden/sync_v2

For every case: the store is copied (the committed one is only read), each recorded pull
runs into a fresh directory (a chained one into a copy of its earlier pull's directory),
and must exit as recorded, with every file outside .arc_v3/ of the recorded SHA-256 and
size and no other file. Then one byte of a copied object is flipped: a signed store pulled
with --trusted-keys must refuse it as untrusted (exit 8), an unsigned one as damaged (exit 4),
each leaving the directory without a file.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

EXIT_DAMAGED, EXIT_UNTRUSTED = 4, 8


def manifest(root):
    """{relative path: [sha256 hex, size]} of every file under root outside .arc_v3/."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.relpath(dirpath, root) == ".":
            dirnames[:] = [d for d in dirnames if d != ".arc_v3"]
        for name in filenames:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                data = f.read()
            out[os.path.relpath(p, root)] = [hashlib.sha256(data).hexdigest(), len(data)]
    return out


def run_pull(cli, store, dest, case_dir, pl, step="default", trust="default"):
    # --no-sync: fsync changes no byte, and the test would mostly wait on it.
    args = [cli, "pull", store, dest, "--json", "--no-sync"]
    step = pl.get("step") if step == "default" else step
    if step is not None:
        args += ["--step", str(step)]
    for key in (pl.get("trust") or []) if trust == "default" else trust:
        args += ["--trusted-keys", os.path.join(case_dir, key)]
    if pl.get("tensors") is not None:
        args += ["--tensors", pl["tensors"]]
    if pl.get("rows") is not None:
        a, b = pl["rows"]
        args += ["--rows", "%d:%s" % (a, "" if b is None else b)]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def check_pull(cli, work, case_dir, i, pl, dirs):
    """Returns None if pull i gives what case.json records, else what differed."""
    dest = os.path.join(work, "pull%d" % i)
    if pl.get("after") is not None:
        shutil.copytree(dirs[pl["after"]], dest, symlinks=True)
    dirs[i] = dest
    rc, out, err = run_pull(cli, os.path.join(work, "store"), dest, case_dir, pl)
    what = "pull %d (%s)" % (i, pl.get("note", ""))
    if rc != pl["exit"]:
        return "%s exited %d, recorded %d: %s%s" % (what, rc, pl["exit"], out, err)
    if pl["expect"] != "ok":
        got = json.loads(out).get("error") if out.strip() else None
        if got != pl["expect"]:
            return "%s: error %s, recorded %s" % (what, got, pl["expect"])
        return None
    got, want = manifest(dest), pl["sha256"]
    if set(got) != set(want):
        return "%s: files %s, recorded %s" % (what, sorted(got), sorted(want))
    for name in sorted(want):
        if got[name] != want[name]:
            return "%s: %s is %s, recorded %s" % (what, name, got[name], want[name])
    return None


def copy_writable(src, dst):
    """A copy of src that the test may change, whatever the modes of the committed files."""
    shutil.copytree(src, dst)
    for dirpath, _, filenames in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def flip_one(store, step):
    """Flips a byte in the middle of a delta object of `step` (the first by key: a shard's
    delta-*.a3d under a folder named for the step); returns its key."""
    keys = sorted(os.path.join(d, f) for d, _, files in os.walk(store) for f in files
                  if f.startswith("delta-") and f.endswith(".a3d")
                  and os.path.basename(d).startswith("%012d-" % step))
    if not keys:
        raise SystemExit("FAIL: no delta object of step %d in %s" % (step, store))
    with open(keys[0], "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x10
        f.seek(0)
        f.write(data)
    return os.path.relpath(keys[0], store)


def check_tamper(cli, work, case_dir, case):
    """A flipped byte in the latest step's delta: exit 8 when signed (with --trusted-keys), 4 else."""
    trusted = [pl for pl in case["pulls"] if pl["expect"] == "ok" and pl.get("step") is None
               and pl.get("tensors") is None and pl.get("rows") is None and pl.get("after") is None]
    if not trusted:
        return "no full pull of the latest step to tamper with"
    pl = trusted[0]
    store = os.path.join(work, "tampered")
    copy_writable(os.path.join(work, "store"), store)
    with open(os.path.join(store, "latest")) as f:
        latest = json.load(f)["step"]
    key = flip_one(store, latest)
    want = EXIT_UNTRUSTED if pl.get("trust") else EXIT_DAMAGED
    dest = os.path.join(work, "tampered_pull")
    rc, out, err = run_pull(cli, store, dest, case_dir, pl, step=None)
    if rc != want:
        return "a byte flipped in %s: exit %d, want %d: %s%s" % (key, rc, want, out, err)
    if os.path.isdir(dest) and manifest(dest):
        return "a byte flipped in %s: the refused pull left %s" % (key, sorted(manifest(dest)))
    return None


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    cli, golden = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    for var in ("ARC_V3_TRUST", "ARC_V3_TRUSTED_KEYS", "ARC_V3_SIGN_KEY"):
        os.environ.pop(var, None)
    cases = sorted(glob.glob(os.path.join(golden, "stores", "*", "case.json")))
    if len(cases) < 4:
        print("FAIL: %d cases under %s/stores (4 expected)" % (len(cases), golden))
        return 1
    before = manifest(golden)
    top = tempfile.mkdtemp(prefix="golden_sync.", dir=os.environ.get("TEST_TMPDIR"))
    os.environ["TMPDIR"] = top
    failures = pulls = 0
    try:
        for path in cases:
            case_dir = os.path.dirname(path)
            with open(path) as f:
                case = json.load(f)
            work = os.path.join(top, case["name"])
            copy_writable(os.path.join(case_dir, case["store"]), os.path.join(work, "store"))
            dirs = {}
            problems = [check_pull(cli, work, case_dir, i, pl, dirs)
                        for i, pl in enumerate(case["pulls"])]
            if not any(pl["expect"] == "ok" for pl in case["pulls"]):
                problems.append("no pull that succeeds")
            problems.append(check_tamper(cli, work, case_dir, case))
            problems = [p for p in problems if p]
            pulls += len(case["pulls"])
            for p in problems:
                print("FAIL %s: %s" % (case["name"], p))
            print("%s %s: %d pulls and a tampered copy" % (
                "FAIL" if problems else "ok  ", case["name"], len(case["pulls"])))
            failures += bool(problems)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    if manifest(golden) != before:
        print("FAIL: the committed golden store changed under the test")
        failures += 1
    print("%d cases, %d pulls, %d failed" % (len(cases), pulls, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
