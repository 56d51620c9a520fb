#!/usr/bin/env python3
"""Every relative link of the tree's Markdown files resolves: the file exists and, for a
`#anchor` into a Markdown file, one of its headings has that anchor (GitHub's rule).

Run from the source root (CMake), or with the path of the root's README.md (Bazel: its
runfile, whose real path is in the source tree).
"""
import os
import re
import sys

SKIP_DIRS = {"third_party", "node_modules", "build", "bench_out"}


def markdown_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "bazel-")) and d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.relpath(os.path.join(folder, name), root)


def without_code(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
        for m in re.finditer(r"^#+\s+(.*?)\s*$", text, flags=re.M):
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            found.add(a if n == 0 else "%s-%d" % (a, n))
        cache[path] = found
    return cache[path]


def broken_links(root):
    for md in markdown_files(root):
        with open(os.path.join(root, md), encoding="utf-8") as f:
            text = without_code(f.read())
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            url = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", url):
                continue  # http:, https:, mailto:
            path, _, anchor = url.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            full = os.path.join(root, target)
            if not os.path.exists(full):
                yield "%s: %s: no such file" % (md, url)
            elif anchor and target.endswith(".md") and anchor not in anchors(full):
                yield "%s: %s: no heading with that anchor" % (md, url)


def main():
    root = os.path.dirname(os.path.realpath(sys.argv[1])) if len(sys.argv) > 1 else os.getcwd()
    if not os.path.exists(os.path.join(root, "CONTRIBUTING.md")):
        print("not the source root: %s" % root)
        return 1
    bad = list(broken_links(root))
    for line in bad:
        print(line)
    count = sum(1 for _ in markdown_files(root))
    print("%d Markdown files, %d broken links" % (count, len(bad)))
    return 1 if bad or count < 10 else 0


if __name__ == "__main__":
    sys.exit(main())
