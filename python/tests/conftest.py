"""Realistic BF16 updates for the tests, made the way an RL trainer makes them.

FP32 master weights get a small optimizer-like step and are cast to BF16 with PyTorch's
round-to-nearest-even; most values do not move by a whole BF16 ULP, so only a small
fraction of the bit patterns change (as in real AdamW RL runs).
"""

import os

import numpy as np
import pytest
import torch

# A folder of consecutive checkpoints of a real run (step_000.safetensors, step_001...),
# e.g. of your own trainer; the tests that need one are skipped without it.
CORPUS = os.environ.get("ARC_V3_CORPUS", "")


def bf16_step(shape, lr=1e-5, seed=0, scale=0.02):
    """(prev, next) BF16 tensors: weights ~N(0, scale), one Adam-like step of size ~lr."""
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(shape, generator=g) * scale
    update = lr * torch.randn(shape, generator=g).sign() * torch.rand(shape, generator=g)
    return master.to(torch.bfloat16), (master - update).to(torch.bfloat16)


def changed_fraction(a, b):
    a = a.contiguous().view(torch.int16)
    b = b.contiguous().view(torch.int16)
    return (a != b).float().mean().item() if a.numel() else 0.0


def read_safetensors(path):
    """{name: numpy uint16 array} of a BF16 safetensors file (stdlib + numpy only)."""
    import json
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "BF16":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data, dtype="<u2", count=(end - begin) // 2,
                                      offset=base + begin).reshape(info["shape"])
    return tensors


@pytest.fixture(scope="session")
def corpus_pair():
    """Two consecutive real snapshots of the run ARC_V3_CORPUS names, or skip."""
    first, second = (os.path.join(CORPUS, f"step_00{i}.safetensors") for i in (0, 1))
    if not (CORPUS and os.path.exists(first) and os.path.exists(second)):
        pytest.skip("no real run: ARC_V3_CORPUS names a folder of step_*.safetensors")
    return read_safetensors(first), read_safetensors(second)
