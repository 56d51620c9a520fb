"""Builds the arc_v3 Python package: the pybind11 extension plus the codec's C++ sources.

    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages ./python

The C++ sources, defines and link libraries are read from the Bazel files (src/BUILD,
src/checkpoint/BUILD, src/build_defs.bzl, third_party/BUILD), so this build compiles exactly what
//src:codec and //src/checkpoint:container (the checkpoint delta container, used by the
state-dict helpers) do and never goes stale when files are added there. Starlark BUILD files are (for what
they use) Python syntax; they are evaluated with stand-ins for the Bazel functions.
"""

import glob
import os
import re
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the workspace root: includes are root-relative
# The codec, the checkpoint delta container (with safetensors, zstd, xxhash) and the
# sync roles (with libcurl, pugixml).
TARGETS = ("//src:codec", "//src/checkpoint:container", "//src/sync:roles")


def _eval_bzl(path, scope):
    """Runs a .bzl/BUILD file with `scope` as globals; returns the globals."""
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec")
    exec(code, scope)  # noqa: S102 - our own build files
    return scope


def _read_package(package):
    """{target name: cc_library/cc_binary kwargs} of //package."""
    targets = {}

    def rule(**kwargs):
        targets[kwargs["name"]] = kwargs

    def load(label, *symbols, **aliases):
        assert label.startswith("//") and ":" in label, label
        pkg, name = label[2:].split(":")
        scope = _eval_bzl(os.path.join(ROOT, pkg, name), {})
        for symbol in symbols:
            scope_globals[symbol] = scope[symbol]
        for alias, symbol in aliases.items():
            scope_globals[alias] = scope[symbol]

    def bzl_glob(include, exclude=(), **_):
        base = os.path.join(ROOT, package)
        found = {os.path.relpath(p, base) for pattern in include
                 for p in glob.glob(os.path.join(base, pattern), recursive=True)}
        return sorted(found - set(bzl_glob(exclude) if exclude else ()))

    def ignore(*_, **__):
        return None

    scope_globals = {
        "load": load, "package": ignore, "exports_files": ignore, "glob": bzl_glob,
        "cc_library": rule, "cc_binary": rule, "cc_test": ignore, "sh_test": ignore,
        "sh_binary": ignore, "filegroup": ignore, "genrule": ignore, "test_suite": ignore,
    }
    _eval_bzl(os.path.join(ROOT, package, "BUILD"), scope_globals)
    return targets, scope_globals


def _codec_build_inputs():
    """(sources, defines, copts, libraries) of TARGETS and their transitive deps."""
    packages = {}
    sources, defines, copts, libraries = [], [], [], []
    seen = set()

    def visit(label):
        if label in seen or label.startswith("@"):  # an external repository: system headers
            return
        seen.add(label)
        pkg, name = label[2:].split(":")
        if pkg not in packages:
            packages[pkg] = _read_package(pkg)[0]
        target = packages[pkg][name]
        for src in target.get("srcs", []):
            path = os.path.join(pkg, src)
            if path.endswith((".cc", ".cpp")) and path not in sources:
                sources.append(path)
        for define in target.get("local_defines", []) + target.get("defines", []):
            if define not in defines:
                defines.append(define)
        for copt in target.get("copts", []):
            if copt not in copts:
                copts.append(copt)
        for opt in target.get("linkopts", []):
            if opt.startswith("-l") and opt[2:] not in libraries:
                libraries.append(opt[2:])
        for dep in target.get("deps", []):
            visit(f"//{pkg}{dep}" if dep.startswith(":") else dep)

    for target in TARGETS:
        visit(target)
    return sources, defines, copts, libraries


class BuildExt(build_ext):
    """Compiles without debug info (the codec is ~10 files of SIMD code; -g triples the
    compile time on small machines) and prints a line per compiled source ("arc_v3 build:
    [3/20] ..."), which python/run_tests.sh shows while pip runs."""

    def build_extension(self, ext):
        compiler = self.compiler
        compile_one = compiler._compile  # CCompiler.compile calls it once per object to build
        count = [0]

        def compile_with_progress(obj, source, *args):
            start = time.monotonic()
            compile_one(obj, source, *args)
            count[0] += 1
            _progress(f"[{count[0]}/{len(ext.sources)}] "
                      f"{os.path.relpath(os.path.abspath(source), ROOT)} ({time.monotonic() - start:.0f} s)")

        compiler._compile = compile_with_progress
        _progress(f"compiling up to {len(ext.sources)} C++ sources")
        super().build_extension(ext)
        _progress("linked")


def _progress(line):
    print(f"arc_v3 build: {line}", flush=True)


def _extension():
    sources, defines, copts, libraries = _codec_build_inputs()
    macros = []
    for define in defines:
        key, _, value = define.partition("=")
        macros.append((key, value or None))
    macros.append(("NDEBUG", None))  # as Bazel's -c opt
    return Extension(
        "arc_v3._arc_v3",
        # Relative to python/, so that object files stay inside python/build.
        sources=[os.path.relpath(os.path.join(HERE, "arc_v3", "_arc_v3.cc"), HERE)] +
                [os.path.relpath(os.path.join(ROOT, s), HERE) for s in sources],
        # pybind11's headers come from /usr/include (Debian's pybind11-dev), a system
        # directory, so that -Wshadow & co. stay quiet about them.
        include_dirs=[ROOT],
        define_macros=macros,
        libraries=libraries,
        # Any change to a header or to the build description rebuilds (setuptools only
        # compares sources and these against the .so).
        depends=sorted(glob.glob(os.path.join(ROOT, "src", "*.h")) +
                       glob.glob(os.path.join(ROOT, "src", "checkpoint", "*.h")) +
                glob.glob(os.path.join(ROOT, "src", "sync", "*.h"))) + [
            os.path.join(ROOT, path) for path in (
                "arc_v3.hpp", "arc_v3_sync.hpp", "src/BUILD", "src/checkpoint/BUILD", "src/sync/BUILD", "src/build_defs.bzl",
                "third_party/BUILD", "python/setup.py")],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"] + copts,
        extra_link_args=["-g0"],
    )


def _version():
    """The library version from arc_v3.hpp, e.g. "1.0.0"."""
    with open(os.path.join(ROOT, "arc_v3.hpp"), encoding="utf-8") as f:
        text = f.read()
    parts = [re.search(rf"#define ARC_V3_VERSION_{part} (\d+)", text).group(1)
             for part in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


setup(
    name="arc_v3",
    version=_version(),
    description="Lossless compression of BF16 weight-update deltas (Python binding)",
    packages=["arc_v3"],
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.9",
    install_requires=[],  # numpy is required; torch is optional (see README)
    zip_safe=False,
)
