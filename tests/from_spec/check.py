#!/usr/bin/python3
"""Run tests/from_spec/impl over a case directory (format: tests/from_spec/README.md) and
compare bit for bit with the expected results and error names.

    /usr/bin/python3 tests/from_spec/check.py CASES [--only SUBSTRING] [-v]
"""
import argparse
import glob
import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from impl import ArcError  # noqa: E402
from impl import payload as arc_payload  # noqa: E402
from impl import store as arc_store  # noqa: E402


def _u16(path):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype="<u2").astype(np.uint16)


def _first_diff(a, b):
    n = min(len(a), len(b))
    d = np.flatnonzero(a[:n] != b[:n])
    if len(d):
        i = int(d[0])
        return "element %d: got %04x, expected %04x (%d elements differ)" % (i, a[i], b[i], len(d))
    return "length %d, expected %d" % (len(a), len(b))


def run_payload_case(case_dir):
    """Returns None if the case passes, else what differed."""
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    session = arc_payload.Session() if case.get("session") else None
    problems = []
    for i, st in enumerate(case["steps"]):
        if session is not None and st.get("reset"):
            session.reset()
        with open(os.path.join(case_dir, st["payload"]), "rb") as f:
            data = f.read()
        src = _u16(os.path.join(case_dir, st["src"]))
        counts = st.get("counts")
        checksum = int(st["checksum"], 16)
        expect = st["expect"]
        try:
            dst = arc_payload.decode(data, src, counts, checksum, session)
            got = "ok"
        except ArcError as e:
            got, dst = e.code, None
            detail = e.message
        except Exception as e:  # noqa: BLE001 - a crash is a failure, reported as such
            got, dst = "crash", None
            detail = "%s: %s" % (type(e).__name__, traceback.format_exc().strip().splitlines()[-3:])
        if got != expect:
            problems.append("step %d: got %s, expected %s%s" % (
                i, got, expect, (" (%s)" % detail) if got != "ok" else ""))
            continue
        if got == "ok" and st.get("dst"):
            want = _u16(os.path.join(case_dir, st["dst"]))
            if len(want) != len(dst) or not np.array_equal(want, dst):
                problems.append("step %d: dst differs: %s" % (i, _first_diff(dst, want)))
    return "; ".join(problems) or None


def _read_tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] == ".arc_v3":
            continue
        dirnames[:] = [d for d in dirnames if not (rel == "." and d == ".arc_v3")]
        for name in filenames:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.normpath(os.path.relpath(p, root))] = f.read()
    return out


def _compare_sha256(files, want):
    """What differs between files {name: bytes} and want {name: [sha256 hex, size]}."""
    want = {os.path.normpath(k): v for k, v in want.items()}
    if set(want) != set(files):
        return "files %s, expected %s" % (sorted(files), sorted(want))
    for name in sorted(want):
        got = [hashlib.sha256(files[name]).hexdigest(), len(files[name])]
        if got != want[name]:
            return "%s is %s, expected %s" % (name, got, want[name])
    return None


def run_store_case(case_dir):
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    store_dir = os.path.join(case_dir, case["store"])
    problems = []
    for i, pl in enumerate(case["pulls"]):
        trust = [os.path.join(case_dir, k) for k in (pl.get("trust") or [])]
        try:
            files = arc_store.pull(store_dir, pl.get("step"), trust, pl.get("tensors"), pl.get("rows"))
            got = "ok"
        except ArcError as e:
            got, files, detail = e.code, None, e.message
        except Exception as e:  # noqa: BLE001
            got, files = "crash", None
            detail = "%s: %s" % (type(e).__name__, traceback.format_exc().strip().splitlines()[-3:])
        expect = pl["expect"]
        if got != expect:
            problems.append("pull %d: got %s, expected %s%s" % (
                i, got, expect, (" (%s)" % detail) if got != "ok" else ""))
            continue
        if got == "ok" and pl.get("sha256") is not None:
            problem = _compare_sha256(files, pl["sha256"])
            if problem:
                problems.append("pull %d: %s" % (i, problem))
            continue
        if got == "ok" and pl.get("files"):
            want = _read_tree(os.path.join(case_dir, pl["files"]))
            if set(want) != set(files):
                problems.append("pull %d: files %s, expected %s" % (i, sorted(files), sorted(want)))
                continue
            for name in sorted(want):
                if want[name] != files[name]:
                    a, b = files[name], want[name]
                    j = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                    problems.append("pull %d: %s differs at byte %d (got %d bytes, expected %d)" % (
                        i, name, j, len(a), len(b)))
                    break
    return "; ".join(problems) or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("cases")
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print every case with its time")
    args = ap.parse_args()
    kinds = [("payloads", run_payload_case), ("stores", run_store_case)]
    total_pass = total_fail = 0
    summary = []
    for kind, runner in kinds:
        dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(args.cases, kind, "*", "case.json")))
        passed = failed = 0
        t_kind = time.time()
        for d in dirs:
            name = os.path.basename(d)
            if args.only and args.only not in name:
                continue
            t0 = time.time()
            try:
                problem = runner(d)
            except Exception as e:  # noqa: BLE001 - an unreadable case fails, not the run
                problem = "case could not be run: %s: %s" % (type(e).__name__, e)
            dt = time.time() - t0
            if problem:
                failed += 1
                print("FAIL %s/%s: %s" % (kind, name, problem), flush=True)
            else:
                passed += 1
                if args.v:
                    print("ok   %s/%s (%.2fs)" % (kind, name, dt), flush=True)
        summary.append("%s: %d passed, %d failed (%.1fs)" % (kind, passed, failed, time.time() - t_kind))
        total_pass += passed
        total_fail += failed
    for line in summary:
        print(line)
    print("%d passed, %d failed" % (total_pass, total_fail))
    if total_pass + total_fail == 0:
        print("no case under %s" % args.cases)
        return 1
    return 0 if total_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
