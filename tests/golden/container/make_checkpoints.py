import json, struct, numpy as np
rng = np.random.default_rng(20261203)
def bf16(x):  # float32 -> bf16 bits, round to nearest even
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
def write(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape, data in tensors:
        b = data.tobytes(); header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b); at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def step(w32, lr):
    return w32 - lr * np.sign(rng.standard_normal(w32.shape)).astype(np.float32)
prev, nxt = [], []
for name, shape, lr in [("embed", (256, 64), 3e-6), ("layer.0.weight", (64, 48), 5e-6), ("layer.0.bias", (48,), 2e-5),
                        ("norm", (64,), 2e-4)]:
    w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    if name == "norm": w += 1
    prev.append((name, "BF16", shape, bf16(w))); nxt.append((name, "BF16", shape, bf16(step(w, lr))))
flags = rng.integers(0, 2, 7).astype(np.uint8)
prev.append(("flags", "U8", (7,), flags)); f2 = flags.copy(); f2[2] ^= 1; nxt.append(("flags", "U8", (7,), f2))
w = (rng.standard_normal((33, 3)) * 0.05).astype(np.float32)  # at an odd offset, after the U8
prev.append(("odd", "BF16", (33, 3), bf16(w))); nxt.append(("odd", "BF16", (33, 3), bf16(step(w, 2e-5))))
s = np.array([0.5], np.float32)
prev.append(("scale", "F32", (), s)); nxt.append(("scale", "F32", (), s * 1.001))
w = None
prev.append(("removed", "I64", (4,), np.arange(4, dtype=np.int64)))
nxt.append(("added", "BF16", (5,), bf16(rng.standard_normal(5).astype(np.float32))))
write("prev.safetensors", prev); write("next.safetensors", nxt)
