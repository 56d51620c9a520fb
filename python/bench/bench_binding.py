#!/usr/bin/env python3
"""What the Python binding costs: the published API vs the same C++ calls made directly.

Both sides run the very same compiled codec (the extension's _time_direct loops over
arc_v3::delta_compress / delta_decompress in C++ with the GIL released), on the same BF16
data: a realistic update of N values (FP32 master weights, an Adam-sized step, BF16
round-to-nearest-even), and the first pair of the real corpus if present.

    /usr/bin/python3 python/bench/bench_binding.py [--elements 16777216] [--threads 1] [--repeats 7]
"""

import argparse
import os
import time

import numpy as np
import torch

import arc_v3
from arc_v3 import _arc_v3 as ext
from arc_v3 import delta_compress, delta_decompress


def best_of(repeats, func):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - t0)
    return best


def realistic_update(n, lr, seed=0):
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(n, generator=g) * 0.02
    update = lr * torch.randn(n, generator=g).sign() * torch.rand(n, generator=g)
    return master.to(torch.bfloat16), (master - update).to(torch.bfloat16)


def corpus_update():
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(here, "..", "..", "..", "shared", "corpus", "real_gpt2_lr1e-6")
    import sys
    sys.path.insert(0, os.path.join(here, "..", "tests"))
    from conftest import read_safetensors
    paths = [os.path.join(folder, f"step_00{i}.safetensors") for i in (0, 1)]
    if not all(os.path.exists(p) for p in paths):
        return None
    a, b = (read_safetensors(p) for p in paths)
    cat = lambda d: torch.from_numpy(np.concatenate([v.reshape(-1) for v in d.values()])
                                     .view(np.int16)).view(torch.bfloat16)
    return cat(a), cat(b)


def measure(name, src, dst, threads, repeats):
    """Interleaves C++ and Python rounds (the machine may be shared) and keeps each best."""
    src_np = src.view(torch.int16).numpy()
    dst_np = dst.view(torch.int16).numpy()
    payload, checksum = delta_compress(src, dst, threads=threads)
    out = torch.empty_like(src)
    best, rounds = {}, {}

    def keep(key, seconds):
        best[key] = min(best.get(key, float("inf")), seconds)
        rounds.setdefault(key, []).append(seconds)

    for _ in range(repeats):
        for key, seconds in ext._time_direct(src_np, dst_np, ext.FORMAT_DEFAULT, threads,
                                             1).items():
            keep("cpp_" + key, seconds)
        keep("py_compress", best_of(1, lambda: delta_compress(
            src=src, dst=dst, compression_format="arc_v3", threads=threads)))
        keep("py_decompress_new", best_of(1, lambda: delta_decompress(
            src=src, compressed_diff=payload, checksum=checksum, compression_format="arc_v3",
            threads=threads)))
        keep("py_decompress_into", best_of(1, lambda: delta_decompress(
            src, payload, checksum, out=out, threads=threads)))
    mb = src.numel() * 2 / 1e6
    changed = (src.view(torch.int16) != dst.view(torch.int16)).float().mean().item()
    print(f"{name}: {src.numel():,} values ({mb:.0f} MB), {changed:.3%} changed, "
          f"payload {len(payload) / (src.numel() * 2):.3%} of BF16, threads={threads}, "
          f"best of {repeats}")
    for key, what in [("compress", "compress"), ("decompress_new", "decompress (new result)"),
                      ("decompress_into", "decompress (out=)")]:
        cpp, py = best["cpp_" + key], best["py_" + key]
        # Per-round ratios pair runs made moments apart, which cancels slow drifts in load.
        paired = np.median([p / c for p, c in zip(rounds["py_" + key], rounds["cpp_" + key])])
        print(f"  {what:24s} C++ {mb / cpp:8.0f} MB/s   Python {mb / py:8.0f} MB/s   "
              f"binding cost {100 * (py - cpp) / cpp:+6.2f}% (best), "
              f"{100 * (paired - 1):+6.2f}% (median of paired rounds)")


def per_call_overhead(repeats=300):
    """The binding's fixed cost per call, in microseconds: best Python time minus best C++
    time on a small tensor, where the codec's own work is tiny and the machine's noise
    hardly matters."""
    src, dst = realistic_update(4096, lr=1e-4, seed=1)
    src_np, dst_np = src.view(torch.int16).numpy(), dst.view(torch.int16).numpy()
    payload, checksum = delta_compress(src, dst, threads=1)
    out = torch.empty_like(src)
    cpp = ext._time_direct(src_np, dst_np, ext.FORMAT_DEFAULT, 1, repeats)
    py = {
        "compress": best_of(repeats, lambda: delta_compress(src, dst, threads=1)),
        "decompress_new": best_of(repeats, lambda: delta_decompress(src, payload, checksum,
                                                                    threads=1)),
        "decompress_into": best_of(repeats, lambda: delta_decompress(src, payload, checksum,
                                                                     out=out, threads=1)),
    }
    print("per-call binding cost (4096 values, best of %d):" % repeats)
    for key in py:
        print(f"  {key:16s} C++ {cpp[key] * 1e6:8.1f} us   Python {py[key] * 1e6:8.1f} us   "
              f"cost {(py[key] - cpp[key]) * 1e6:+7.1f} us")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"arc_v3 {arc_v3.__version__}, SIMD target {arc_v3.ACTIVE_TARGET}, "
          f"torch {torch.__version__}")
    per_call_overhead()
    src, dst = realistic_update(args.elements, lr=2e-6)
    measure("synthetic", src, dst, args.threads, args.repeats)
    pair = corpus_update()
    if pair is not None:
        measure("real_gpt2_lr1e-6 step 0->1", *pair, args.threads, args.repeats)


if __name__ == "__main__":
    main()
