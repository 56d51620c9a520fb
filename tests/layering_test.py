#!/usr/bin/env python3
"""The layers' include rule (CONTRIBUTING.md): every #include "..." of the library, the CLI
and the Python binding points to its own layer or one below it; nothing outside src/codec/
includes the codec's private headers (the codec is used through arc_v3.hpp; src/common/
takes only Status and ErrorCode from it); the Python
binding and the CLI include public headers only (the CLI also its own files); neither the codec nor the checkpoint layer includes
libcurl; and the include graph has no cycle.

Run from the source root (CMake) or as a Bazel test (the files are its runfiles).
"""
import os
import re
import sys

LAYERS = {"common": 0, "codec": 1, "checkpoint": 2, "sync": 3, "cli": 4, "python": 4}
PUBLIC = {"arc_v3.hpp": "codec", "arc_v3_checkpoint.hpp": "checkpoint", "arc_v3_sync.hpp": "sync"}
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def layer_of(path):
    if path in PUBLIC:
        return PUBLIC[path]
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2 and parts[1] in LAYERS:
        return parts[1]
    if path.startswith("tools/cli/"):
        return "cli"
    if path.startswith("python/"):
        return "python"
    return None


def sources(root):
    found = list(PUBLIC)
    for folder in ("src/common", "src/codec", "src/checkpoint", "src/sync", "tools/cli",
                   "python/arc_v3"):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith((".h", ".cc", ".hpp")):
                found.append(folder + "/" + name)
    return found


def main():
    root = os.environ.get("TEST_SRCDIR")
    root = os.path.join(root, os.environ.get("TEST_WORKSPACE", "arc_v3")) if root else "."
    files = sources(root)
    if len(files) < 40:
        print("FAIL: only %d files found under %s" % (len(files), os.path.abspath(root)))
        return 1
    problems, graph = [], {}
    for path in files:
        layer = layer_of(path)
        text = open(os.path.join(root, path), encoding="utf-8").read()
        graph[path] = []
        for kind, target in INCLUDE.findall(text):
            if kind == "<":
                if target.startswith("curl/") and layer in ("common", "codec", "checkpoint"):
                    problems.append("%s: the %s layer includes libcurl (<%s>)" % (path, layer, target))
                continue
            if path.endswith("kernels.cc") and target == path:
                continue  # Highway's re-inclusion of the file itself
            to = layer_of(target)
            if to is None:
                continue  # bench/ or tests/ helpers are not includes of the library
            graph[path].append(target)
            if layer == "common" and target == "arc_v3.hpp":
                continue  # Status and ErrorCode: the vocabulary every layer shares
            if LAYERS[to] > LAYERS[layer]:
                problems.append("%s (%s) includes %s, of the %s layer above it" % (path, layer, target, to))
            if target.startswith("src/codec/") and layer != "codec":
                problems.append("%s includes the codec's private %s (use arc_v3.hpp)" % (path, target))
            if layer == "python" and target not in PUBLIC:
                problems.append("%s includes %s: the binding uses public headers only" % (path, target))
            if layer == "cli" and target not in PUBLIC and not target.startswith("tools/cli/"):
                problems.append("%s includes %s: the CLI uses public headers only" % (path, target))
    # No cycle among the headers.
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                problems.append("include cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt in graph and not state.get(nxt):
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in graph:
        if not state.get(node):
            visit(node, [node])
    for p in problems:
        print("FAIL:", p)
    print("%d files, %d includes checked, %d problems" %
          (len(files), sum(len(v) for v in graph.values()), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
