#!/usr/bin/env python3
"""Writes the drop-in form of arc_v3 from the maintained sources.

    python3 single_include/amalgamate.py            # rewrites single_include/arc_v3.{hpp,cc}
    python3 single_include/amalgamate.py --check    # exit 1 (and a diff) if they are stale
    python3 single_include/amalgamate.py --list     # the files it merges, and what it leaves out

single_include/arc_v3.hpp is the public header arc_v3.hpp followed by the implementation:
every file of the Bazel target //:arc_v3 (read from the BUILD files, so the list follows
the build: src/codec/ and what it uses of src/common/), compiled where one translation unit defines ARC_V3_IMPLEMENTATION.
single_include/arc_v3.cc is that translation unit (xxhash.c's form).

src/ stays the maintained code; this script only concatenates it, and fails instead of
guessing:
- a file under src/ that is neither in //:arc_v3 nor excluded below (with a reason): the
  codec and common folders whole, the checkpoint and sync folders not at all;
- an #include "..." of a file outside //:arc_v3 (or of an unknown Highway header);
- a third-party dependency other than hwy, zstd, lz4, xxhash (users link those four);
- CMakeLists.txt's arc_v3 library built from other sources than //:arc_v3, or CMake or
  python/setup.py with another Highway policy than src/common/build_defs.bzl;
- two .cc files that define the same namespace-scope name (they share one translation
  unit here: a helper of one file would clash with, or silently overload, the other's)
  or the same macro;
- a Highway file (#define HWY_TARGET_INCLUDE) that does not follow the layout of
  hwy/examples/skeleton.cc (prologue, foreach_target.h, highway.h, per-target code,
  #if HWY_ONCE).

Highway compiles a file once per SIMD target by re-including it (foreach_target.h includes
HWY_TARGET_INCLUDE, looked up from Highway's own folder, so that would need -I to the
header's folder). The header unrolls that loop itself and re-includes itself by its own
name (__FILE_NAME__), which the compiler finds beside the including file whatever the
include path: users need no -I. ARC_V3_HWY_FOREACH_TARGET selects foreach_target.h instead
(then -I to the header's folder), for a Highway with targets this header does not list.
"""

import argparse
import ast
import difflib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "single_include")
GENERATOR = "single_include/amalgamate.py"

# The target the header holds, and its public header (copied first, verbatim).
TOP_TARGET = "//:arc_v3"
PUBLIC_HEADER = "arc_v3.hpp"

# Files under src/ that are not in the header, on purpose. A directory ends with "/".
EXCLUDED = {
    "src/BUILD": "build file",
    "src/FORMAT.md": "the index of the specifications",
    "src/codec/BUILD": "build file",
    "src/codec/FORMAT.md": "the payload format specification",
    "src/common/BUILD": "build file",
    "src/common/build_defs.bzl": "build settings (the Highway policy is read from it)",
    "src/common/clock.h": "report clocks of the checkpoint and sync layers, not the codec",
    "src/common/file_io.h": "local file writes of the checkpoint and sync layers, not the codec",
    "src/checkpoint/": "the checkpoint layer (//src/checkpoint), not the codec",
    "src/sync/": "the sync layer (object stores over libcurl), not the codec",
}

# Third-party Bazel targets the codec may depend on: users link these libraries.
ALLOWED_THIRD_PARTY = ["//third_party:hwy", "//third_party:zstd", "//third_party:lz4",
                       "//third_party:xxhash"]

# Every Highway target name any release defines (foreach_target.h's list, in its order,
# plus the later ones). Names this Highway lacks are skipped; a target in HWY_TARGETS
# that is missing here stops the build with an #error (see the module comment).
HWY_TARGET_NAMES = [
    "EMU128", "SCALAR", "NEON_WITHOUT_AES", "NEON", "NEON_BF16", "RVV", "SVE", "SVE2",
    "SVE_256", "SVE2_128", "SSE2", "SSSE3", "SSE4", "AVX2", "AVX3", "AVX3_DL", "AVX3_ZEN4",
    "AVX3_SPR", "AVX10_2", "AVX10_2_512", "WASM_EMU256", "WASM", "PPC8", "PPC9", "PPC10",
    "Z14", "Z15", "LSX", "LASX",
]


class GeneratorError(Exception):
    pass


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


# ------------------------------------------------------------------------------------------
# The build: BUILD files are Starlark, which for these files is Python.

def load_package(package):
    """Targets of //package (name -> attributes), evaluating its BUILD with stubs."""
    targets = {}

    def rule(**kwargs):
        targets[kwargs["name"]] = kwargs

    def load(label, *symbols):
        pkg, _, name = label.lstrip("/").partition(":")
        scope = {}
        exec(compile(read(os.path.join(pkg, name)), label, "exec"), scope)  # noqa: S102
        for symbol in symbols:
            env[symbol] = scope[symbol]

    env = {
        "load": load,
        "package": lambda **kwargs: None,
        "exports_files": lambda *args, **kwargs: None,
        "glob": lambda *args, **kwargs: [],
        "cc_library": rule, "cc_binary": rule, "cc_test": rule,
        "sh_test": rule, "sh_binary": rule, "filegroup": rule,
    }
    exec(compile(read(os.path.join(package, "BUILD")), "//%s:BUILD" % package, "exec"), env)  # noqa: S102
    return targets


def resolve(label, package):
    if label.startswith(":"):
        return "//%s%s" % (package, label)
    if label.startswith("//") and ":" not in label:
        return label + ":" + label.rsplit("/", 1)[-1]
    return label


class Build:
    """The files, defines and third-party dependencies of TOP_TARGET."""

    def __init__(self):
        self.packages = {}
        self.order = []          # targets, dependencies first
        self.third_party = set()
        self.local_defines = []
        self.sources = []        # .cc files, in build order
        self.headers = set()     # .h / .hpp files (hdrs, textual_hdrs, headers in srcs)
        self._visit(TOP_TARGET, [])
        third_party = load_package("third_party")
        self.linkopts = []
        for label in ALLOWED_THIRD_PARTY:
            self.linkopts += third_party[label.split(":")[1]].get("linkopts", [])

    def target(self, label):
        package, name = label[2:].split(":")
        if package not in self.packages:
            self.packages[package] = load_package(package)
        try:
            return package, self.packages[package][name]
        except KeyError:
            raise GeneratorError("%s: no such target" % label) from None

    def _visit(self, label, stack):
        if label in self.order:
            return
        if label in stack:
            raise GeneratorError("dependency cycle: %s" % " -> ".join(stack + [label]))
        if label.startswith("//third_party:"):
            if label not in ALLOWED_THIRD_PARTY:
                raise GeneratorError(
                    "%s depends on %s: the drop-in header links only %s" %
                    (stack[-1], label, ", ".join(ALLOWED_THIRD_PARTY)))
            self.third_party.add(label)
            return
        package, attrs = self.target(label)
        for dep in attrs.get("deps", []):
            self._visit(resolve(dep, package), stack + [label])
        self.order.append(label)
        prefix = package + "/" if package else ""
        for src in attrs.get("srcs", []):
            path = prefix + src
            if path.endswith(".cc"):
                if path not in self.sources:
                    self.sources.append(path)
            else:
                self.headers.add(path)
        for attr in ("hdrs", "textual_hdrs"):
            for hdr in attrs.get(attr, []):
                if hdr.endswith(".cc"):
                    continue  # kernels.cc re-includes itself: it is a source here
                self.headers.add(prefix + hdr)
        for define in attrs.get("local_defines", []):
            if define not in self.local_defines:
                self.local_defines.append(define)


def check_tree(build):
    """Every file under src/ is in the build or excluded on purpose."""
    files = set(build.sources) | build.headers
    unknown = []
    for directory, dirs, names in os.walk(os.path.join(ROOT, "src")):
        dirs.sort()
        for name in sorted(names):
            path = os.path.relpath(os.path.join(directory, name), ROOT)
            if path in files:
                continue
            if any(path == key or (key.endswith("/") and path.startswith(key))
                   for key in EXCLUDED):
                continue
            unknown.append(path)
    if unknown:
        raise GeneratorError(
            "neither in %s nor excluded in %s (EXCLUDED, with a reason): %s" %
            (TOP_TARGET, GENERATOR, ", ".join(unknown)))
    for key in EXCLUDED:
        if not os.path.exists(os.path.join(ROOT, key)):
            raise GeneratorError("EXCLUDED names %s, which does not exist" % key)
        if key in files:
            raise GeneratorError("%s is both in %s and excluded" % (key, TOP_TARGET))


def check_cmake(build):
    """CMakeLists.txt builds the arc_v3 library from the same sources: every .cc of src/codec/."""
    text = read("CMakeLists.txt")
    match = re.search(r"file\(GLOB ARC_V3_CODEC_SRCS CONFIGURE_DEPENDS (\S+)\)\s*"
                      r"add_library\(arc_v3 \$\{ARC_V3_CODEC_SRCS\}\)", text)
    if not match:
        raise GeneratorError("CMakeLists.txt: no add_library(arc_v3 ${ARC_V3_CODEC_SRCS}) "
                             "after its file(GLOB ...)")
    folder, pattern = os.path.split(match.group(1))
    if pattern != "*.cc":
        raise GeneratorError("CMakeLists.txt: arc_v3 globs %s, not <folder>/*.cc" % match.group(1))
    cmake = sorted(os.path.join(folder, n) for n in os.listdir(os.path.join(ROOT, folder))
                   if n.endswith(".cc"))
    if cmake != sorted(build.sources):
        raise GeneratorError("CMakeLists.txt builds arc_v3 from %s, Bazel's %s from %s" %
                             (cmake, TOP_TARGET, sorted(build.sources)))


# ------------------------------------------------------------------------------------------
# Checks on the sources that share one translation unit.

def strip_comments(text):
    """Comments and string/char literals blanked, line structure kept."""
    def blank(match):
        return re.sub(r"[^\n]", " ", match.group(0))
    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    return re.sub(pattern, blank, text, flags=re.S)


DECL_KEYWORDS = {"struct", "class", "enum", "union", "using", "typedef", "namespace",
                 "template", "constexpr", "const", "static", "inline", "extern", "friend",
                 "operator", "return", "static_assert"}


def namespace_scope_names(path):
    """(namespace, name) of what `path` defines at namespace scope, anonymous namespaces
    folded into their parent (their names are visible there). Google style puts those
    definitions at column 0."""
    lines = strip_comments(read(path)).split("\n")
    lines = [l if not re.match(r"\s*#", l) else "" for l in lines]  # preprocessor lines
    names = set()
    stack = []  # open namespaces: (name, brace depth inside them)
    depth = 0
    for i, line in enumerate(lines):
        at_namespace_scope = depth == len(stack)
        ns = re.match(r"namespace\s*(\w*)\s*\{", line)
        if ns and at_namespace_scope:
            stack.append((ns.group(1), depth + 1))
        elif at_namespace_scope and re.match(r"[A-Za-z_]", line) and \
                not re.match(r"(template\b|namespace\s+\w+\s*=)", line):
            # The declaration up to its first "{", ";" or "=".
            text, k = line, i + 1
            while not re.search(r"[{;=]", text) and k < len(lines):
                text += " " + lines[k]
                k += 1
            head = re.split(r"[{;=]", text, maxsplit=1)[0]
            name = declared_name(head)
            if name:
                names.add(("::".join(n for n, _ in stack if n), name))
        depth += line.count("{") - line.count("}")
        while stack and depth < stack[-1][1]:
            stack.pop()
    return names


def declared_name(head):
    """The name a declaration's head (up to its first "{", ";" or "=") introduces."""
    if re.match(r"[A-Z_0-9]+\s*\(", head):
        return None  # a macro call (HWY_EXPORT(...), HWY_BEFORE_NAMESPACE())
    kind = re.match(r"(?:enum\s+class|enum|struct|class|union)\s+(\w+)", head)
    alias = re.match(r"using\s+(?!namespace\b)([\w:]+)", head)
    if kind:
        name = kind.group(1)
    elif alias:
        name = alias.group(1).split("::")[-1]  # an alias, or a using-declaration's name
    elif "(" in head:
        call = re.search(r"(operator\s*\S+?|~?[\w:]+)\s*$", head.split("(")[0])
        name = call.group(1) if call else None
    else:
        words = re.findall(r"\w+", head.split("[")[0])
        name = words[-1] if words else None
    if not name or "::" in name or name in DECL_KEYWORDS:
        return None  # a member defined outside its class, or nothing we can name
    return name


def check_collisions(sources):
    seen = {}
    for path in sources:
        for key in namespace_scope_names(path):
            seen.setdefault(key, []).append(path)
    clashes = ["%s::%s (%s)" % (ns, name, ", ".join(paths))
               for (ns, name), paths in sorted(seen.items()) if len(paths) > 1]
    if clashes:
        raise GeneratorError(
            "defined in several .cc files, which share one translation unit in the drop-in "
            "header: rename one, or move a shared helper into a header: " + "; ".join(clashes))
    macros = {}
    for path in sources:
        text = strip_comments(read(path))
        defined = re.findall(r"^\s*#\s*define\s+(\w+)", text, flags=re.M)
        undefined = set(re.findall(r"^\s*#\s*undef\s+(\w+)", text, flags=re.M))
        for name in defined:
            if name not in undefined and name != "HWY_TARGET_INCLUDE":
                macros.setdefault(name, set()).add(path)
    clashes = ["%s (%s)" % (name, ", ".join(sorted(paths)))
               for name, paths in sorted(macros.items()) if len(paths) > 1]
    if clashes:
        raise GeneratorError("macros defined by several .cc files: " + "; ".join(clashes))
    return sorted(macros)


# ------------------------------------------------------------------------------------------
# Writing the header.

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


class Writer:
    def __init__(self, build):
        self.build = build
        self.files = set(build.sources) | build.headers
        self.emitted = {PUBLIC_HEADER}
        self.system_includes = set()
        self.hwy_passes = []  # per-target code of each Highway file

    def file(self, path):
        """The text of `path` with its local includes inlined (each file once)."""
        lines = read(path).rstrip("\n").split("\n")
        if any(re.match(r"\s*#\s*define\s+HWY_TARGET_INCLUDE", l) for l in lines):
            return self.highway_file(path, lines)
        return self.lines(path, lines)

    def lines(self, path, lines):
        out = []
        depth = 0
        for line in lines:
            directive = re.match(r"\s*#\s*(\w+)", line)
            if directive:
                word = directive.group(1)
                if word in ("if", "ifdef", "ifndef"):
                    depth += 1
                elif word == "endif":
                    depth -= 1
            include = INCLUDE.match(line)
            if not include:
                out.append(line)
                continue
            kind, name = include.groups()
            if kind == '"' and name.startswith("hwy/"):
                raise GeneratorError("%s includes %s outside a Highway file" % (path, name))
            if kind == "<" or not (name == PUBLIC_HEADER or name.startswith("src/")):
                if kind == '"':
                    raise GeneratorError('%s: #include "%s" is not part of %s' %
                                         (path, name, TOP_TARGET))
                # System headers stay where they are; a repeat at file level is dropped.
                if depth == (1 if path.endswith(".h") else 0):
                    if name in self.system_includes:
                        continue
                    self.system_includes.add(name)
                out.append(line)
                continue
            if name not in self.files and name != PUBLIC_HEADER:
                raise GeneratorError('%s: #include "%s" is not part of %s' %
                                     (path, name, TOP_TARGET))
            if name in self.emitted:
                continue
            self.emitted.add(name)
            out.append(self.banner(name))
            out.extend(self.file(name))
            out.append(self.banner(path, "continued"))
        return out

    def highway_file(self, path, lines):
        """A file Highway compiles once per target (hwy/examples/skeleton.cc layout): its
        prologue here, its per-target code in the header's ARC_V3_HWY_PASS_ section, the
        target loop, then its HWY_ONCE part."""
        def find(pattern, start=0):
            for k in range(start, len(lines)):
                if re.match(pattern, lines[k]):
                    return k
            raise GeneratorError("%s: no line %r in the Highway layout" % (path, pattern))
        define = find(r"\s*#\s*define\s+HWY_TARGET_INCLUDE")
        undef = define - 1 if re.match(r"\s*#\s*undef\s+HWY_TARGET_INCLUDE", lines[define - 1]) \
            else define
        foreach = find(r'\s*#\s*include\s+"hwy/foreach_target.h"', define)
        highway = find(r'\s*#\s*include\s+"hwy/highway.h"', foreach)
        once = find(r"#if\s+HWY_ONCE\s*$", highway)
        if foreach != define + 1 or highway != foreach + 1:
            raise GeneratorError("%s: expected HWY_TARGET_INCLUDE, foreach_target.h and "
                                 "highway.h on consecutive lines" % path)
        per_target = lines[highway:once]
        if any(INCLUDE.match(l) for l in per_target[1:]) or \
                any(INCLUDE.match(l) for l in lines[once:]):
            raise GeneratorError("%s: includes after highway.h are not supported" % path)
        self.hwy_passes.append((path, per_target))
        number = len(self.hwy_passes)
        out = self.lines(path, lines[:undef])
        out.append("// The target loop of hwy/foreach_target.h, unrolled: the per-target code "
                   "of this file")
        out.append("// (ARC_V3_HWY_PASS_ == %d, at the end of this header) once per SIMD "
                   "target." % number)
        out.extend(target_loop(number))
        out.extend(lines[once:])
        return out

    @staticmethod
    def banner(path, note=""):
        text = "// ---- %s%s " % (path, " (%s)" % note if note else "")
        return text + "-" * max(4, 92 - len(text))


def target_loop(number):
    """Re-includes this header once per compiled target with ARC_V3_HWY_PASS_ = number,
    as hwy/foreach_target.h does with HWY_TARGET_INCLUDE, then for the static target."""
    out = [
        "#undef HWY_ONCE",
        "#define HWY_ONCE 0",
        "#define ARC_V3_HWY_PASS_ %d" % number,
        "#if defined(ARC_V3_HWY_FOREACH_TARGET)",
        "#undef HWY_TARGET_INCLUDE",
        "#define HWY_TARGET_INCLUDE ARC_V3_HWY_SELF_",
        '#include "hwy/foreach_target.h"  // IWYU pragma: keep',
        "#else",
    ]
    for name in HWY_TARGET_NAMES:
        out += [
            "#if defined(HWY_%s) && (HWY_TARGETS & HWY_%s) && HWY_STATIC_TARGET != HWY_%s" %
            (name, name, name),
            "#undef HWY_TARGET",
            "#define HWY_TARGET HWY_%s" % name,
            "#include ARC_V3_HWY_SELF_",
            "#endif",
        ]
    out += [
        "#endif  // ARC_V3_HWY_FOREACH_TARGET",
        "// The static target last, without a toggle after it: highway.h is then included "
        "for it,",
        "// as after foreach_target.h and highway.h.",
        "#undef HWY_ONCE",
        "#define HWY_ONCE 1",
        "#undef HWY_TARGET",
        "#define HWY_TARGET HWY_STATIC_TARGET",
        "#define ARC_V3_HWY_STATIC_PASS_",
        "#include ARC_V3_HWY_SELF_",
        "#undef ARC_V3_HWY_STATIC_PASS_",
        "#undef ARC_V3_HWY_PASS_",
    ]
    return out


def known_targets_check():
    out = []
    names = []
    for name in HWY_TARGET_NAMES:
        macro = "ARC_V3_HWY_KNOWN_%s_" % name
        out += ["#ifdef HWY_%s" % name, "#define %s HWY_%s" % (macro, name), "#else",
                "#define %s 0" % macro, "#endif"]
        names.append(macro)
    mask = " | ".join(names)
    out += [
        "#if !defined(ARC_V3_HWY_FOREACH_TARGET) && (HWY_TARGETS & ~(%s))" %
        wrap(mask, "    "),
        '#error "arc_v3.hpp: this Highway compiles a SIMD target the header does not list: '
        'define ARC_V3_HWY_FOREACH_TARGET and compile with -I to the folder of arc_v3.hpp"',
        "#endif",
    ]
    for macro in names:
        out.append("#undef %s" % macro)
    return out


def wrap(text, indent, width=90, joint=" \\"):
    """Lines of `text` up to `width`, the next ones after `indent`, joined by joint + "\\n"
    (a preprocessor continuation by default)."""
    words = text.split(" ")
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line = line + " " + word if line else word
    lines.append(line)
    return (joint + "\n").join(lines)


def policy_defines(defines):
    out = []
    for define in defines:
        name, _, value = define.partition("=")
        out += ["#ifndef %s" % name, ("#define %s %s" % (name, value)).rstrip(), "#endif"]
    return out


def header_text(build, cc_macros):
    writer = Writer(build)
    public = read(PUBLIC_HEADER).rstrip("\n").split("\n")
    link = " ".join(build.linkopts)
    impl = []
    for path in build.sources:
        writer.emitted.add(path)
        impl.append(writer.banner(path))
        impl.extend(writer.file(path))
    undefs = ["#undef %s" % name for name in cc_macros if name != "ZSTD_STATIC_LINKING_ONLY"]

    intro = """\
// arc_v3.hpp, the drop-in form: lossless compression of BF16 weight-update deltas.
//
// GENERATED by {generator} from arc_v3.hpp and the sources of the
// Bazel target //:arc_v3 (src/). Do not edit: change src/, then run
// `python3 {generator}`.
//
// Declarations by default (the public header, below, unchanged: no third-party headers).
// In exactly one .cc file of your program, compile the implementation too:
//
//   #define ARC_V3_IMPLEMENTATION
//   #include "arc_v3.hpp"
//
// (single_include/arc_v3.cc is that file), and link the libraries it uses:
//
//   g++ -std=c++17 -O2 app.cc {link} -pthread
//
// What the implementation file needs:
// - C++17 and exceptions (it reports std::bad_alloc as kOutOfMemory); -O2: unoptimised
//   SIMD code is 10-100x slower.
// - Highway (tested with 1.0.3), zstd 1.4 or later (magicless frames), lz4, xxHash 0.8.
//   On x86-64, XXH3 goes through libxxhash's runtime dispatch (xxh_x86dispatch.h) when that
//   header exists; define ARC_V3_NO_XXH_DISPATCH if your libxxhash lacks it.
// - No Highway header before this one in that file: the header sets Highway's target
//   policy before Highway decides which SIMD targets to compile, each macro only where it
//   is not defined already:
//   {policy}.
//   Every attainable target is compiled and picked at run time; the payload bytes are the
//   same on every one.
// - No -I: the header compiles its SIMD kernels once per target by including itself, by its
//   own file name, from its own folder (the loop of hwy/foreach_target.h, unrolled).
//   ARC_V3_HWY_FOREACH_TARGET uses foreach_target.h instead; it finds this file through the
//   include path, so then add -I to this file's folder.
// - After it, the file sees the macros of Highway, xxHash and ZSTD_STATIC_LINKING_ONLY.
""".format(generator=GENERATOR, link=link,
           policy=wrap(", ".join(build.local_defines), "//   ", 88, ""))

    out = intro.rstrip("\n").split("\n")
    out += ["", "#if !defined(ARC_V3_HWY_PASS_)", "", writer.banner(PUBLIC_HEADER)]
    out += public
    out += [
        "",
        "#if defined(ARC_V3_IMPLEMENTATION) && !defined(ARC_V3_IMPLEMENTATION_INCLUDED_)",
        "#define ARC_V3_IMPLEMENTATION_INCLUDED_",
        "",
        "// Misuse stops here, before the implementation would pile up errors.",
        "#if !defined(__cplusplus) || (__cplusplus < 201703L && \\",
        "                              !(defined(_MSVC_LANG) && _MSVC_LANG >= 201703L))",
        '#error "arc_v3.hpp: ARC_V3_IMPLEMENTATION needs C++17 or later (-std=c++17)"',
        "#elif !defined(__cpp_exceptions) && !defined(__EXCEPTIONS) && !defined(_CPPUNWIND)",
        '#error "arc_v3.hpp: ARC_V3_IMPLEMENTATION needs exceptions (it catches std::bad_alloc '
        'to return kOutOfMemory): compile this file without -fno-exceptions"',
        "#elif defined(HIGHWAY_HWY_DETECT_TARGETS_H_)",
        '#error "arc_v3.hpp: include arc_v3.hpp with ARC_V3_IMPLEMENTATION before any Highway '
        'header: it sets Highway\'s target policy first (a .cc file of its own is simplest)"',
        "#else",
        "",
        "// Highway's target policy (src/common/build_defs.bzl, HWY_POLICY_DEFINES, with its reasons).",
    ]
    out += policy_defines(build.local_defines)
    out += [
        '#include "hwy/detect_targets.h"',
        "#if HWY_TARGETS & HWY_SCALAR",
        '#error "arc_v3.hpp: the kernels need Highway\'s EMU128 target, not SCALAR: leave '
        'HWY_BROKEN_EMU128 at 0 and HWY_COMPILE_ONLY_SCALAR undefined"',
        "#endif",
        "#if HWY_TARGETS & HWY_SSSE3",
        '#error "arc_v3.hpp: the SSSE3 target of Highway 1.0.3 breaks per-lane u16 shifts: '
        'keep HWY_SSSE3 in HWY_DISABLED_TARGETS"',
        "#endif",
    ]
    out += known_targets_check()
    out += [
        "// How this file includes itself, per SIMD target.",
        "#if defined(ARC_V3_HWY_FOREACH_TARGET)",
        '#define ARC_V3_HWY_SELF_ "arc_v3.hpp"',
        "#elif defined(__FILE_NAME__)",
        "#define ARC_V3_HWY_SELF_ __FILE_NAME__",
        "#else",
        '#define ARC_V3_HWY_SELF_ "arc_v3.hpp"',
        "#endif",
        "",
    ]
    out += impl
    out += ["", "// Macros of the .cc files above, which user code after them need not see."]
    out += undefs
    out += [
        "#undef ARC_V3_HWY_SELF_",
        "",
        "#endif  // misuse",
        "#endif  // ARC_V3_IMPLEMENTATION",
        "",
        "#else  // ARC_V3_HWY_PASS_: included by itself, once per SIMD target (HWY_TARGET)",
    ]
    for number, (path, per_target) in enumerate(writer.hwy_passes, 1):
        out += ["#if ARC_V3_HWY_PASS_ == %d" % number,
                writer.banner(path, "per-target code, HWY_TARGET")]
        out += per_target
        out += ["#endif  // ARC_V3_HWY_PASS_ == %d" % number]
    out += [
        "// Next target: flip the toggle that lets Highway's per-target headers in again",
        "// (foreach_target.h flips it itself).",
        "#if !defined(ARC_V3_HWY_STATIC_PASS_) && !defined(ARC_V3_HWY_FOREACH_TARGET)",
        "#ifdef HWY_TARGET_TOGGLE",
        "#undef HWY_TARGET_TOGGLE",
        "#else",
        "#define HWY_TARGET_TOGGLE",
        "#endif",
        "#endif",
        "#endif  // ARC_V3_HWY_PASS_",
    ]
    return "\n".join(out) + "\n"


def cc_text():
    return """\
// The implementation of the drop-in arc_v3.hpp (GENERATED by {generator}): compile
// this file once in your program, beside arc_v3.hpp, instead of defining
// ARC_V3_IMPLEMENTATION in a file of your own.
#define ARC_V3_IMPLEMENTATION
#include "arc_v3.hpp"
""".format(generator=GENERATOR)


def check_policy_copies():
    """The builds that do not read Bazel files carry the same Highway policy and warnings."""
    scope = {}
    exec(compile(read("src/common/build_defs.bzl"), "build_defs.bzl", "exec"), scope)  # noqa: S102
    cmake = re.search(r"set\(ARC_V3_HWY_DEFINES\s+([^)]*)\)", read("CMakeLists.txt"))
    if not cmake or cmake.group(1).split() != scope["HWY_POLICY_DEFINES"]:
        raise GeneratorError("CMakeLists.txt's ARC_V3_HWY_DEFINES differ from HWY_POLICY_DEFINES")
    setup = read("python/setup.py")
    for name in ("HWY_POLICY_DEFINES", "ARC_V3_COPTS"):
        match = re.search(r"^%s = (\[[^]]*\])" % name, setup, re.M)
        if not match or ast.literal_eval(match.group(1)) != scope[name]:
            raise GeneratorError("python/setup.py's %s differ from build_defs.bzl's" % name)


def generate():
    build = Build()
    check_tree(build)
    check_cmake(build)
    check_policy_copies()
    cc_macros = check_collisions(build.sources)
    return build, {"arc_v3.hpp": header_text(build, cc_macros), "arc_v3.cc": cc_text()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files on disk instead of writing them")
    parser.add_argument("--list", action="store_true", help="print what goes in and out")
    parser.add_argument("--out", default=OUT_DIR, help="folder to write (default: %(default)s)")
    args = parser.parse_args()
    try:
        build, outputs = generate()
    except GeneratorError as e:
        print("%s: error: %s" % (GENERATOR, e), file=sys.stderr)
        return 2
    if args.list:
        print("target: %s (%s)" % (TOP_TARGET, " ".join(build.order)))
        print("sources: " + " ".join(build.sources))
        print("headers: " + " ".join(sorted(build.headers)))
        print("links: " + " ".join(build.linkopts))
        for key, reason in sorted(EXCLUDED.items()):
            print("excluded: %s (%s)" % (key, reason))
        return 0
    stale = []
    for name, text in sorted(outputs.items()):
        path = os.path.join(args.out, name)
        old = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                old = f.read()
        if old == text:
            continue
        if args.check:
            stale.append(name)
            sys.stdout.writelines(difflib.unified_diff(
                (old or "").splitlines(True), text.splitlines(True),
                "%s (on disk)" % path, "%s (generated)" % path, n=2))
        else:
            os.makedirs(args.out, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print("wrote %s (%d bytes, %d lines)" %
                  (os.path.relpath(path), len(text.encode()), text.count("\n")))
    if stale:
        print("%s: stale, run `python3 %s`: %s" % (GENERATOR, GENERATOR, " ".join(stale)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
