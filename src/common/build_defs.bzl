"""Build settings shared by the kernels and their tests."""

# Which Highway targets are compiled is decided per translation unit, so the kernels and
# every test that enumerates targets must see the same policy:
# - all attainable targets, so that tests can exercise each one and the scalar-ish
#   fallback (EMU128) exists on every machine;
# - GCC 12.2 makes Highway 1.0.3 fall back to SCALAR (HWY_BROKEN_EMU128), which lacks
#   ops we use; the bug it guards against (GCC PR106322) is caught by our per-target
#   tests against the reference, so EMU128 is re-enabled;
# - SSSE3 breaks per-lane u16 shifts in 1.0.3, and SSE4 supersedes it anyway;
# - AVX3_DL is opt-in in 1.0.3.
HWY_POLICY_DEFINES = [
    "HWY_COMPILE_ALL_ATTAINABLE",
    "HWY_BROKEN_EMU128=0",
    "HWY_DISABLED_TARGETS=HWY_SSSE3",
    "HWY_WANT_AVX3_DL",
]

# Warnings in the spirit of Highway's COPTS.
ARC_V3_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wshadow",
    "-Wvla",
]
