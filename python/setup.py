"""Builds the arc_v3 Python package: the pybind11 extension plus the codec's C++ sources.

    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages ./python

The C++ sources, defines and link libraries are read from the Bazel files (src/BUILD,
src/checkpoint/BUILD, src/build_defs.bzl, third_party/BUILD), so this build compiles exactly what
//src:codec and //src/checkpoint:container (the checkpoint delta container, used by the
state-dict helpers) do and never goes stale when files are added there. Starlark BUILD files are (for what
they use) Python syntax; they are evaluated with stand-ins for the Bazel functions.
"""

import concurrent.futures
import glob
import os
import re
import threading
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
        if label in seen:
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
    """Compiles the extension's sources in parallel, one compiler per core, and without
    debug info (the codec is ~10 files of SIMD code; -g triples the compile time on small
    machines). setuptools' own `parallel` only runs several extensions at once, and this
    package has one. Prints a line per compiled source ("arc_v3 build: [3/20] ..."), which
    python/run_tests.sh shows while pip runs."""

    def build_extension(self, ext):
        compiler = self.compiler

        def compile_in_parallel(sources, output_dir=None, macros=None, include_dirs=None,
                                debug=0, extra_preargs=None, extra_postargs=None,
                                depends=None):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
            todo = [obj for obj in objects if obj in build]  # as CCompiler.compile skips
            jobs = max(1, min(len(todo), len(os.sched_getaffinity(0))
                              if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
            _progress(f"compiling {len(todo)} C++ sources, {jobs} at a time")
            done = []
            lock = threading.Lock()

            def compile_one(obj):
                source, extension = build[obj]
                start = time.monotonic()
                compiler._compile(obj, source, extension, cc_args, extra_postargs, pp_opts)
                with lock:
                    done.append(obj)
                    _progress(f"[{len(done)}/{len(todo)}] "
                              f"{os.path.relpath(os.path.abspath(source), ROOT)} "
                              f"({time.monotonic() - start:.0f} s)")

            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                futures = [pool.submit(compile_one, obj) for obj in todo]
                try:
                    for future in futures:
                        future.result()
                except BaseException:  # the first compiler error stops the build
                    for future in futures:
                        future.cancel()
                    raise
            _progress("linking")
            return objects

        compiler.compile = compile_in_parallel
        super().build_extension(ext)


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
