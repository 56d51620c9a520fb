"""delta_compress_dicts / delta_decompress_dicts: whole state dicts, any dtypes."""

import collections
import struct

import pytest
import torch

from arc_v3 import ArcV3Error, delta_compress_dicts, delta_decompress_dicts, delta_dicts_info
from conftest import bf16_step


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


def tensors_of(delta):
    return {t["name"]: t for t in delta_dicts_info(delta)["tensors"]}


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
    info = delta_dicts_info(delta)
    assert info["layout"] == "file" and info["removed_tensors"] == ["removed"]
    tensors = tensors_of(delta)
    assert set(tensors) == set(nxt)
    assert tensors["layer0.weight"]["kind"] == "delta"
    assert tensors["layer0.weight"]["coders"] == ["arc_v3"]
    # Small BF16 tensors share one payload (a group); others have pieces of their own.
    assert tensors["layer0.weight"]["group"] == 0
    assert tensors["norm.weight"]["group"] is None
    assert tensors["layer0.weight"]["dtype"] == "BF16"
    assert tensors["layer0.weight"]["shape"] == (256, 128)
    assert tensors["norm.weight"]["kind"] == "delta" and \
        tensors["norm.weight"]["dtype"] == "F32"
    assert tensors["norm.weight"]["coders"][0] in ("stored", "zstd", "zstd-planes")
    assert tensors["resized"]["kind"] == "reshaped"  # no usable base: carried whole
    assert tensors["added.half"]["kind"] == "added" and \
        tensors["added.half"]["dtype"] == "F16"
    assert tensors["mask"]["dtype"] == "BOOL" and tensors["step"]["shape"] == ()
    assert tensors["empty"]["coders"] == []
    assert "removed" not in restored


def test_bytes_are_the_checkpoint_delta_container():
    prev, nxt = make_state_dicts()
    delta = delta_compress_dicts(prev, nxt)
    # src/checkpoint/FORMAT.md "Header": magic, version 2 (it has a group), flags 0, then M and D
    # with 40 + M + D the whole size.
    magic, version, flags, manifest_size, _, data_size, _ = struct.unpack_from(
        "<4sHHQQQQ", delta)
    assert magic == b"A3DC" and version == 2 and flags == 0
    assert delta_dicts_info(delta)["container_version"] == version
    assert 40 + manifest_size + data_size == len(delta)
    # The bytes do not depend on the thread count or on the dicts' key order.
    assert delta_compress_dicts(prev, nxt, threads=1) == delta
    shuffled = collections.OrderedDict(reversed(list(nxt.items())))
    again = delta_compress_dicts(prev, shuffled)
    assert_same(delta_decompress_dicts(prev, again), shuffled)  # next's key order kept


def test_tensors_added_to_an_empty_base():
    _, nxt = make_state_dicts(seed=5)
    delta = delta_compress_dicts({}, nxt)
    assert {t["kind"] for t in delta_dicts_info(delta)["tensors"]} == {"added"}
    # Needs nothing from a base: any prev decodes it.
    assert_same(delta_decompress_dicts({}, delta), nxt)
    assert_same(delta_decompress_dicts({"unrelated": torch.ones(2)}, delta), nxt)


def test_unsupported_dtypes():
    with pytest.raises(TypeError, match="complex64"):
        delta_compress_dicts({}, {"z": torch.zeros(3, dtype=torch.complex64)})
    # In prev, a tensor safetensors cannot hold is no base; it is simply not used.
    prev = {"z": torch.zeros(3, dtype=torch.complex64), "w": torch.ones(4)}
    nxt = {"z": torch.ones(3), "w": torch.full((4,), 2.0)}
    delta = delta_compress_dicts(prev, nxt)
    assert tensors_of(delta)["z"]["kind"] == "added"
    assert_same(delta_decompress_dicts(prev, delta), nxt)


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
    for name in ("layer1.weight", "norm.weight", "positions", "mask"):
        wrong = dict(prev)
        wrong[name] = prev[name].clone()
        wrong[name].view(-1)[-1] = ~wrong[name].view(-1)[-1] if name == "mask" else \
            wrong[name].view(-1)[-1] + 1
        with pytest.raises(ArcV3Error) as info:
            delta_decompress_dicts(wrong, delta)
        # The container checks each piece's base rows before decoding it.
        assert info.value.name == "checksum_mismatch", name
        assert name in info.value.message and "wrong base" in info.value.message
    missing = dict(prev)
    del missing["layer2.weight"]
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(missing, delta)
    assert info.value.name == "checksum_mismatch" and "layer2.weight" in info.value.message
    assert "prev_state_dict" in info.value.message  # not the temporary file's path
    assert "/" not in info.value.message
    reshaped = dict(prev)
    reshaped["layer1.weight"] = prev["layer1.weight"].reshape(32, 32)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(reshaped, delta)
    assert info.value.name == "checksum_mismatch" and "[32, 32]" in info.value.message
    # A whole other state dict as the base.
    other, _ = make_state_dicts(seed=9)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(other, delta)
    assert info.value.name == "checksum_mismatch"


def test_corrupted_bytes_raise():
    prev, nxt = make_state_dicts()
    delta = delta_compress_dicts(prev, nxt)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(prev, b"XXXX" + delta[4:])
    assert info.value.name == "bad_magic"
    with pytest.raises(ArcV3Error) as info:
        delta_dicts_info(b"XXXX" + delta[4:])
    assert info.value.name == "bad_magic"
    with pytest.raises(ArcV3Error) as info:
        delta_decompress_dicts(prev, delta + b"\0")
    assert info.value.name == "corrupt_header"
    for size in (0, 5, 20, 40, len(delta) // 2, len(delta) - 1):
        with pytest.raises(ArcV3Error):
            delta_decompress_dicts(prev, delta[:size])
    # Every byte is covered by a checksum (header, manifest, each piece): any flip raises.
    for at in range(0, len(delta), max(1, len(delta) // 300)):
        bad = bytearray(delta)
        bad[at] ^= 0x10
        with pytest.raises(ArcV3Error):
            delta_decompress_dicts(prev, bytes(bad))


def test_misuse_raises():
    with pytest.raises(ValueError, match="compression_format"):
        delta_compress_dicts({}, {}, compression_format="gzip")
    with pytest.raises(TypeError):
        delta_compress_dicts({}, {"a": [1, 2]})
    with pytest.raises(TypeError):
        delta_compress_dicts({}, {1: torch.ones(1)})
    assert delta_decompress_dicts({}, delta_compress_dicts({}, {})) == {}
