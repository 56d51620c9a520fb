"""delta_compress_dicts / delta_decompress_dicts: whole state dicts, any dtypes."""

import collections
import json
import struct

import pytest
import torch

from arc_v3 import ArcV3Error, delta_compress_dicts, delta_decompress_dicts
from conftest import WRONG_BASE_ERRORS, bf16_step


def make_state_dicts(seed=0):
    """A model update: BF16 matrices, FP32 norms, integer buffers, a bool mask, a scalar,
    a tensor only in next, one only in prev, one whose shape changes."""
    g = torch.Generator().manual_seed(seed)
    prev, nxt = collections.OrderedDict(), collections.OrderedDict()
    for i, shape in enumerate([(256, 128), (1024,), (64, 3, 3)]):
        prev[f"layer{i}.weight"], nxt[f"layer{i}.weight"] = bf16_step(shape, lr=1e-5,
                                                                      seed=seed + i)
    norm = torch.ones(128) + 0.01 * torch.randn(128, generator=g)
    prev["norm.weight"], nxt["norm.weight"] = norm, norm + 1e-4 * torch.randn(128, generator=g)
    prev["step"], nxt["step"] = torch.tensor(41), torch.tensor(42)
    prev["positions"] = torch.arange(100, dtype=torch.int64)
    nxt["positions"] = prev["positions"].clone()
    mask = torch.rand(50, generator=g) > 0.5
    prev["mask"], nxt["mask"] = mask, mask.clone()
    nxt["mask"][3] = ~nxt["mask"][3]
    prev["resized"] = torch.zeros(10, dtype=torch.bfloat16)
    nxt["resized"] = torch.randn(12, generator=g).to(torch.bfloat16)
    prev["removed"] = torch.ones(3)
    nxt["added.half"] = torch.randn(7, 5, generator=g).half()
    nxt["empty"] = torch.empty(0, 4, dtype=torch.bfloat16)
    prev["empty"] = torch.empty(0, 4, dtype=torch.bfloat16)
    nxt["transposed"] = torch.randn(30, 20, generator=g).to(torch.bfloat16).t()
    prev["transposed"] = nxt["transposed"].clone()
    return prev, nxt


def header_of(delta):
    (header_len,) = struct.unpack_from("<Q", delta, 16)
    return json.loads(delta[32:32 + header_len])


def assert_same(a, b):
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        x, y = a[name].contiguous(), b[name].contiguous()
        assert x.reshape(-1).view(torch.uint8).tolist() == \
            y.reshape(-1).view(torch.uint8).tolist(), name


def test_round_trip_any_dtypes():
    prev, nxt = make_state_dicts()
    delta = delta_compress_dicts(prev, nxt)
    assert isinstance(delta, bytes)
    restored = delta_decompress_dicts(prev, delta)
    assert_same(restored, nxt)
    methods = {e["name"]: e["method"] for e in header_of(delta)["entries"]}
    assert methods["layer0.weight"] == "arc_v3"
    assert methods["norm.weight"] == "xor_zlib"
    assert methods["resized"] in ("zlib", "raw")  # no usable base: sent whole
    assert methods["added.half"] in ("zlib", "raw")
    assert "removed" not in restored


@pytest.mark.parametrize("compression_format", ["arc_v3", "arc_v3_published"])
def test_delta_is_small_for_sparse_bf16_updates(compression_format):
    prev, nxt = {}, {}
    for i in range(4):
        prev[f"w{i}"], nxt[f"w{i}"] = bf16_step((512, 512), lr=3e-6, seed=20 + i)
    delta = delta_compress_dicts(prev, nxt, compression_format=compression_format)
    raw = sum(t.numel() * 2 for t in nxt.values())
    assert len(delta) < 0.1 * raw
    assert_same(delta_decompress_dicts(prev, delta), nxt)


def test_unchanged_dict_round_trips():
    prev, _ = make_state_dicts(seed=3)
    assert_same(delta_decompress_dicts(prev, delta_compress_dicts(prev, prev)), prev)


def test_wrong_base_raises():
    prev, nxt = make_state_dicts()
    delta = delta_compress_dicts(prev, nxt)
    for name in ("layer1.weight", "norm.weight", "positions"):
        wrong = dict(prev)
        wrong[name] = prev[name].clone()
        wrong[name].view(-1)[0] += 1
        with pytest.raises(ArcV3Error) as info:
            delta_decompress_dicts(wrong, delta)
        expected = WRONG_BASE_ERRORS if wrong[name].dtype == torch.bfloat16 else \
            ("checksum_mismatch",)
        assert info.value.name in expected, name
        assert name in info.value.message
    missing = dict(prev)
    del missing["layer2.weight"]
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(missing, delta)
    assert info.value.name == "invalid_argument" and "layer2.weight" in info.value.message
    reshaped = dict(prev)
    reshaped["layer1.weight"] = prev["layer1.weight"].reshape(32, 32)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(reshaped, delta)
    assert info.value.name == "size_mismatch"


def test_corrupted_bytes_raise():
    prev, nxt = make_state_dicts()
    delta = delta_compress_dicts(prev, nxt)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(prev, b"XXXXXXXX" + delta[8:])
    assert info.value.name == "bad_magic"
    for size in (0, 5, 20, 40, len(delta) // 2, len(delta) - 1):
        with pytest.raises(ArcV3Error):
            delta_decompress_dicts(prev, delta[:size])
    for at in range(0, len(delta), max(1, len(delta) // 300)):
        bad = bytearray(delta)
        bad[at] ^= 0x10
        try:
            restored = delta_decompress_dicts(prev, bytes(bad))
        except ArcV3Error:
            continue
        # A flip may only go unnoticed where it cannot change a value (e.g. inside a
        # zlib stream's header options or an unused varint bit); the result must be exact.
        assert_same(restored, nxt)


def test_misuse_raises():
    with pytest.raises(ValueError, match="compression_format"):
        delta_compress_dicts({}, {}, compression_format="gzip")
    with pytest.raises(TypeError):
        delta_compress_dicts({}, {"a": [1, 2]})
    with pytest.raises(TypeError):
        delta_compress_dicts({}, {1: torch.ones(1)})
    assert delta_decompress_dicts({}, delta_compress_dicts({}, {})) == {}
