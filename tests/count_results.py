#!/usr/bin/env python3
"""Counts what one `bazel test` invocation (and optionally one pytest run) decided.

    tests/count_results.py --bep BEP.json [--bazel-status N] [--junit PYTEST.xml|MISSING]

Bazel's verdicts come first: the targets counted are exactly those this invocation
tested, as its build event file (`bazel test --build_event_json_file=BEP.json`) names
them, and each one's test.log and test.xml are the files that event file points at (so
the logs of targets that no longer exist, or that this invocation did not run, are never
read). Per target:
  - Bazel's status (testSummary) and its test.xml decide whether it passed; a target
    whose test.xml or status says failed is failed even if its doctest summary says
    "0 failed" (a binary that crashes at exit, a sanitizer report at exit, a timeout);
  - doctest's summary in the target's test.log gives the detail: N passed, N failed,
    N skipped test cases; a failed target with no failed test case counts one failure
    more; a passed doctest target that ran no test case counts as one failure;
  - a target that is not a doctest binary (a shell test) counts as one test;
  - every "SKIP: ..." line a passed target printed (a part it could not run, e.g. the S3
    half of the sync tests without a server) counts as one skipped test;
  - a test target that failed to build counts as one failure; one not built or not run
    because the build failed elsewhere counts as skipped (Bazel's "N were skipped"); a
    failed build with no target to blame counts as one failure.
pytest's own junit XML adds its tests, failures + errors and skips (a missing file:
one failure).
Prints one line per target, then the last line "N passed, N failed, N skipped".
Exits 0 if nothing failed, else 3.
"""
import argparse
import json
import os
import re
import sys
import urllib.parse
import xml.etree.ElementTree as ET

DOCTEST_CASES = re.compile(
    r"^\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed"
    r"(?:\s*\|\s*(\d+) skipped)?", re.M)
SKIP_LINE = re.compile(r"(^|\s)SKIP: ", re.M)
TEST_KIND = re.compile(r"_test rule$")


def uri_path(uri):
  parsed = urllib.parse.urlparse(uri)
  return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else None


def read(path):
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read()
  except OSError:
    return None


def xml_verdict(path):
  """'passed', 'failed' or 'missing' from a Bazel test.xml (JUnit)."""
  if path is None or not os.path.exists(path):
    return "missing"
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError:
    return "failed"
  suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
  for suite in suites:
    for attr in ("failures", "errors"):
      if int(suite.get(attr, "0") or 0) > 0:
        return "failed"
  if root.find(".//failure") is not None or root.find(".//error") is not None:
    return "failed"
  return "passed"


def load_bep(path):
  configured = {}   # label -> kind, for test rules
  completed = {}    # label -> "built", "failed" (to build) or "aborted"
  results = {}      # label -> [(status, {name: path})]
  summaries = {}    # label -> overallStatus
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      event = json.loads(line)
      eid = event.get("id", {})
      if "targetConfigured" in eid and "configured" in event:
        kind = event["configured"].get("targetKind", "")
        if TEST_KIND.search(kind):
          configured[eid["targetConfigured"]["label"]] = kind
      elif "targetCompleted" in eid:
        label = eid["targetCompleted"]["label"]
        if "completed" in event:
          state = "built" if event["completed"].get("success", False) else "failed"
        else:
          state = "aborted"  # the build stopped before this target (another one failed)
        if completed.get(label) != "failed":
          completed[label] = state
      elif "testResult" in eid and "testResult" in event:
        label = eid["testResult"]["label"]
        files = {o.get("name"): uri_path(o.get("uri", ""))
                 for o in event["testResult"].get("testActionOutput", [])}
        results.setdefault(label, []).append(
            (event["testResult"].get("status", "NO_STATUS"), files))
      elif "testSummary" in eid and "testSummary" in event:
        summaries[eid["testSummary"]["label"]] = event["testSummary"].get(
            "overallStatus", "NO_STATUS")
  return configured, completed, results, summaries


def count_bazel(bep, bazel_status, totals):
  configured, completed, results, summaries = load_bep(bep)
  blamed = 0
  for label in sorted(set(summaries) | set(results)):
    status = summaries.get(label, "NO_STATUS")
    attempts = results.get(label, [])
    verdict = "passed" if status in ("PASSED", "FLAKY") and attempts else "failed"
    p = f = s = 0
    notes = []
    # Each run/shard's last attempt (flaky retries: the last one decides, like Bazel).
    last = {}
    for st, files in attempts:
      last[files.get("test.log") or len(last)] = (st, files)
    doctest = False
    for st, files in last.values():
      xml = xml_verdict(files.get("test.xml"))
      if xml != "passed" or st not in ("PASSED", "FLAKY"):
        if verdict == "passed":
          notes.append("test.xml: %s, status %s" % (xml, st))
        verdict = "failed"
      log = read(files.get("test.log")) if files.get("test.log") else None
      m = list(DOCTEST_CASES.finditer(log or ""))
      if m:
        doctest = True
        p += int(m[-1].group(2))
        f += int(m[-1].group(3))
        s += int(m[-1].group(4) or 0)
      if log and verdict == "passed":
        s += len(SKIP_LINE.findall(log))
    if doctest:
      if verdict == "failed" and f == 0:
        f = 1
        notes.append("failed outside its test cases (e.g. crashed at exit)")
      elif verdict == "passed" and p + f == 0:
        f = 1
        notes.append("ran no test case")
    elif verdict == "passed":
      p = 1
    else:
      f = 1
    if f:
      verdict = "failed"
    blamed += 1 if f else 0
    totals[0] += p
    totals[1] += f
    totals[2] += s
    print("%-7s %s (bazel: %s; %d passed, %d failed, %d skipped%s)" % (
        "ok" if verdict == "passed" else "FAILED", label, status, p, f, s,
        "; " + "; ".join(notes) if notes else ""))
  # Test targets configured but not tested: failed to build (failed); not built or not run
  # because the build failed elsewhere (skipped, Bazel's "N were skipped"). After a
  # complete build, a built target that did not run was filtered out (--test_tag_filters,
  # --test_size_filters): not counted.
  build_failed = bazel_status not in (0, 3)
  for label in sorted(configured):
    if label in summaries or label in results:
      continue
    state = completed.get(label, "aborted")
    if state == "failed":
      print("FAILED  %s (failed to build)" % label)
      totals[1] += 1
      blamed += 1
    elif state == "aborted" or build_failed:
      print("skipped %s (not run: the build failed elsewhere)" % label)
      totals[2] += 1
  if bazel_status not in (0, 3) and blamed == 0:
    print("FAILED  bazel exited %d (the build failed) with no test to blame" % bazel_status)
    totals[1] += 1
  elif bazel_status == 3 and blamed == 0:
    print("FAILED  bazel exited 3 (a test failed) but no target's result says which")
    totals[1] += 1


def count_junit(path, totals):
  if path is None or not os.path.exists(path):
    print("FAILED  pytest (no junit XML: it did not run)")
    totals[1] += 1
    return
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as e:
    print("FAILED  pytest (unreadable junit XML: %s)" % e)
    totals[1] += 1
    return
  suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
  tests = sum(int(x.get("tests", 0)) for x in suites)
  bad = sum(int(x.get("failures", 0)) + int(x.get("errors", 0)) for x in suites)
  skipped = sum(int(x.get("skipped", 0)) for x in suites)
  p = tests - bad - skipped
  if tests == 0:
    bad = 1
  print("%-7s pytest (%d passed, %d failed, %d skipped)" % (
      "ok" if bad == 0 else "FAILED", p, bad, skipped))
  totals[0] += p
  totals[1] += bad
  totals[2] += skipped


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--bep")
  ap.add_argument("--bazel-status", type=int, default=0)
  ap.add_argument("--junit", action="append", default=[])
  args = ap.parse_args()
  totals = [0, 0, 0]
  if args.bep:
    if os.path.exists(args.bep):
      count_bazel(args.bep, args.bazel_status, totals)
    else:
      print("FAILED  bazel wrote no build event file (exit %d)" % args.bazel_status)
      totals[1] += 1
  for junit in args.junit:
    count_junit(junit, totals)
  print("%d passed, %d failed, %d skipped" % tuple(totals))
  return 0 if totals[1] == 0 else 3


if __name__ == "__main__":
  sys.exit(main())
