"""The C headers of the python3 that builds the Python extension (`@local_python//:headers`).

Its include directory is asked of the interpreter itself (sysconfig), so no Python version
is written into the build: $PYTHON if set, else /usr/bin/python3 (Debian's, which
python/run_tests.sh also uses), else the first python3 on PATH. Without an interpreter or
its -dev headers the library is empty, and only //python's targets fail to compile.
"""

def _local_python_impl(ctx):
    python = ctx.os.environ.get("PYTHON", "")
    if not python:
        python = "/usr/bin/python3" if ctx.path("/usr/bin/python3").exists else ctx.which("python3")
    include = ""
    if python:
        result = ctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
        if result.return_code == 0:
            include = result.stdout.strip()
    if include and ctx.path(include).exists:
        ctx.symlink(include, "include")
    else:
        ctx.file("include/.none", "")
    ctx.file("BUILD", """cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
    visibility = ["//visibility:public"],
)
""")

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["PYTHON"],
    local = True,
)
