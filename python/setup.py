"""Builds the arc_v3 Python package: the pybind11 extension plus the codec's C++ sources.

    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages ./python

The C++ sources are every .cc of the library's layer folders (src/codec, src/checkpoint,
src/sync): the files //:arc_v3 and //:arc_v3_sync build, so a file added there is built
here too. Highway's target policy and the warnings are plain lists below, the same as
src/common/build_defs.bzl's (single_include/amalgamate.py --check compares them).
"""

import os
import re
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the workspace root: includes are root-relative

# The codec, the checkpoint layer (safetensors, the delta container) and the sync layer.
LAYERS = ("src/codec", "src/checkpoint", "src/sync")
# HWY_POLICY_DEFINES and ARC_V3_COPTS of src/common/build_defs.bzl.
HWY_POLICY_DEFINES = ["HWY_COMPILE_ALL_ATTAINABLE", "HWY_BROKEN_EMU128=0",
                      "HWY_DISABLED_TARGETS=HWY_SSSE3", "HWY_WANT_AVX3_DL"]
ARC_V3_COPTS = ["-Wall", "-Wextra", "-Wshadow", "-Wvla"]
# What the layers link (third_party/BUILD).
LIBRARIES = ["hwy", "zstd", "lz4", "xxhash", "curl", "crypto", "pugixml", "microhttpd"]


def _layer_files(suffixes):
    return sorted(os.path.join(layer, name) for layer in LAYERS + ("src/common",)
                  for name in os.listdir(os.path.join(ROOT, layer)) if name.endswith(suffixes))


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
    macros = [tuple(d.split("=", 1)) if "=" in d else (d, None) for d in HWY_POLICY_DEFINES]
    macros.append(("NDEBUG", None))  # as Bazel's -c opt
    return Extension(
        "arc_v3._arc_v3",
        # Relative to python/, so that object files stay inside python/build.
        sources=[os.path.relpath(os.path.join(HERE, "arc_v3", "_arc_v3.cc"), HERE)] +
                [os.path.relpath(os.path.join(ROOT, s), HERE) for s in _layer_files(".cc")],
        # pybind11's headers come from /usr/include (Debian's pybind11-dev), a system
        # directory, so that -Wshadow & co. stay quiet about them.
        include_dirs=[ROOT],
        define_macros=macros,
        libraries=LIBRARIES,
        # Any change to a header rebuilds (setuptools only compares sources and these
        # against the .so).
        depends=[os.path.join(ROOT, path) for path in
                 _layer_files((".h", ".hpp")) + ["arc_v3.hpp", "arc_v3_checkpoint.hpp", "arc_v3_sync.hpp", "python/setup.py"]],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"] + ARC_V3_COPTS,
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
