"""A wrong base raises ONE documented error, checksum_mismatch, whatever the decoder meets
first (issue #39).

A stateless payload (delta_compress, delta_compress_tensors) holds the checksum of its
result only, not of its base. Its context-modelled and rANS chunks predict from the base,
so on a wrong base they may derail before the result can be hashed: the C++ library then
says corrupt_chunk ("inconsistent range-coded stream"), on other inputs
checksum_mismatch. The binding reports both as checksum_mismatch; damage that the
payload's bytes show by themselves keeps its own code (python/README.md, "Errors").
"""

import collections
import functools
import os

import numpy as np
import pytest
import torch

import arc_v3
from arc_v3 import (ArcV3Error, delta_compress, delta_compress_dicts, delta_compress_tensors,
                    delta_decompress, delta_decompress_dicts, delta_decompress_tensors)

WRONG_BASE_MESSAGE = "does not decode against this base: wrong base or damaged payload"
# Sizes and seeds of the realistic deltas: 1-2% of the values change, by a BF16 ULP or
# two (an optimizer step on FP32 master weights, cast to BF16).
SIZES = (4096, 65_536, 300_000, 1 << 20)
SEEDS = (0, 1, 2)
# (compression_format, effort): the default format's chunk modes (XOR streams at effort
# 0, modelled / rANS chunks above) and ARCv3 as published (XOR streams only).
CODINGS = (("arc_v3", 0), ("arc_v3", None), ("arc_v3", 3), ("arc_v3_published", None))


def trainer_snapshots(n, seed, steps=2, scale=0.02):
    """BF16 snapshots of FP32 master weights ~N(0, scale), one Adam-like step apart."""
    g = torch.Generator().manual_seed(seed)
    lr = (5e-7, 1e-6)[seed % 2]  # 1.2% and 2.3% of the values change per step
    master = torch.randn(n, generator=g) * scale
    snapshots = [master.to(torch.bfloat16)]
    for _ in range(steps):
        master = master - lr * torch.randn(n, generator=g).sign() * torch.rand(n, generator=g)
        snapshots.append(master.to(torch.bfloat16))
    return snapshots


def _bits(t):
    return t.view(torch.int16)


def _with_some_changed(t, seed, add, fraction=0.01):
    """`t` with `add` added to the bit patterns of `fraction` of its values (at least one:
    add=1 moves a value by one ULP, add=0x80 doubles it)."""
    n = t.numel()
    at = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7))
    at = at[:max(1, int(n * fraction))]
    bits = _bits(t.clone())
    bits[at] += add
    return bits.view(torch.bfloat16)


def _with_one_bit_flipped(t):
    bits = _bits(t.clone())
    bits[t.numel() // 3] ^= 1
    return bits.view(torch.bfloat16)


# How a receiver ends up with the wrong base: name -> f(snapshots, seed) -> base, where the
# payload codes snapshots[1] -> snapshots[2].
WRONG_BASES = {
    # One step behind: it missed the previous delta.
    "stale_step": lambda s, seed: s[0],
    # Another tensor of the same size (the wrong layer, another run).
    "other_tensor": lambda s, seed: trainer_snapshots(s[1].numel(), seed + 1000)[1],
    # The right base with 1% of its values moved by one ULP.
    "some_values_changed": lambda s, seed: _with_some_changed(s[1], seed, 1),
    # One mantissa bit of one value.
    "one_bit": lambda s, seed: _with_one_bit_flipped(s[1]),
    # Every exponent one higher (the base scaled by 2).
    "exponents_shifted": lambda s, seed: (_bits(s[1]) + 0x80).view(torch.bfloat16),
    # 1% of the values scaled by 2.
    "some_exponents_shifted": lambda s, seed: _with_some_changed(s[1], seed, 0x80),
    # Nothing loaded yet.
    "zeros": lambda s, seed: torch.zeros_like(s[1]),
}


@functools.lru_cache(maxsize=None)
def _case(n, seed, compression_format, effort):
    """(snapshots, payload, checksum): the delta from snapshot 1 to snapshot 2."""
    s = trainer_snapshots(n, seed)
    payload, checksum = delta_compress(s[1], s[2], compression_format, effort=effort)
    return s, payload, checksum


def _decode_error(src, payload, checksum, **kwargs):
    with pytest.raises(ArcV3Error) as info:
        delta_decompress(src, payload, checksum, **kwargs)
    return info.value


def _assert_wrong_base_error(e):
    assert e.name == "checksum_mismatch" and e.code == 10, str(e)
    assert arc_v3.ERROR_NAMES[e.code] == e.name
    assert "wrong base" in e.message, e.message


@pytest.mark.parametrize("wrong_base", sorted(WRONG_BASES))
@pytest.mark.parametrize("compression_format,effort", CODINGS)
def test_wrong_base_is_always_checksum_mismatch(compression_format, effort, wrong_base):
    names = collections.Counter()
    errors = []
    for n in SIZES:
        for seed in SEEDS:
            s, payload, checksum = _case(n, seed, compression_format, effort)
            base = WRONG_BASES[wrong_base](s, seed)
            assert not torch.equal(_bits(base), _bits(s[1]))
            e = _decode_error(base, payload, checksum)
            names[e.name] += 1
            errors.append(e)
    assert set(names) == {"checksum_mismatch"}, (
        f"{compression_format} effort {effort}, {wrong_base}: {dict(names)}")
    for e in errors:
        _assert_wrong_base_error(e)


def _derailing_case():
    """A payload and a wrong base on which the C++ decoder stops inside a chunk (its own
    error: corrupt_chunk) before it can hash the result."""
    s, payload, checksum = _case(65_536, 0, "arc_v3", None)
    return WRONG_BASES["exponents_shifted"](s, 0), s, payload, checksum


def test_a_derailed_chunk_says_so_in_the_message():
    base, _, payload, checksum = _derailing_case()
    e = _decode_error(base, payload, checksum)
    _assert_wrong_base_error(e)
    assert e.message.startswith(WRONG_BASE_MESSAGE), e.message
    assert "(corrupt_chunk: " in e.message and e.message.endswith(")"), e.message
    assert str(e).startswith("checksum_mismatch (10): " + WRONG_BASE_MESSAGE)


def test_every_input_and_output_kind_gives_the_same_error():
    base, s, payload, checksum = _derailing_case()
    array = base.view(torch.int16).numpy().view(np.uint16)
    raw = array.tobytes()
    for src in (base, base.reshape(256, 256), base.reshape(256, 256).t(), array, raw,
                bytearray(raw), memoryview(raw)):
        _assert_wrong_base_error(_decode_error(src, payload, checksum))
    # Into out=: a copy, in place, a numpy array, a buffer, a non-contiguous tensor; on
    # error each is left unchanged.
    in_place = base.clone()
    square = torch.empty(256, 512, dtype=torch.bfloat16)[:, ::2]
    for src, out in ((base, base.clone()), (in_place, in_place), (array, array.copy()),
                     (raw, bytearray(raw)), (base.reshape(256, 256), square)):
        before = _snapshot(out)
        _assert_wrong_base_error(_decode_error(src, payload, checksum, out=out))
        assert _snapshot(out) == before
    # The right base still decodes.
    assert torch.equal(_bits(delta_decompress(s[1], payload, checksum)), _bits(s[2]))


def _snapshot(out):
    if isinstance(out, torch.Tensor):
        return out.contiguous().view(torch.int16).numpy().tobytes()
    return bytes(out) if isinstance(out, bytearray) else out.tobytes()


def small_layers(seed, wrong=None):
    """The (prev, next) tensors of a model's small layers: norms, biases, small
    matrices, each 1-2% changed; `wrong` names a WRONG_BASES entry for every prev."""
    prevs, nexts = [], []
    for i, n in enumerate((256, 4096, 1000, 65_536, 16_384)):
        s = trainer_snapshots(n, seed * 10 + i)
        prevs.append(s[1] if wrong is None else WRONG_BASES[wrong](s, seed * 10 + i))
        nexts.append(s[2])
    return prevs, nexts


@pytest.mark.parametrize("wrong_base", sorted(WRONG_BASES))
def test_wrong_base_of_a_group_is_checksum_mismatch(wrong_base):
    names = collections.Counter()
    for seed in SEEDS:
        prevs, nexts = small_layers(seed)
        payload, checksum = delta_compress_tensors(prevs, nexts)
        wrong, _ = small_layers(seed, wrong_base)
        outs = [w.clone() for w in wrong]
        with pytest.raises(ArcV3Error) as info:
            delta_decompress_tensors(wrong, payload, checksum, outs=outs)
        names[info.value.name] += 1
        _assert_wrong_base_error(info.value)
        for o, w in zip(outs, wrong):  # all or none
            assert torch.equal(_bits(o), _bits(w))
        # One tensor of the group wrong is enough.
        mixed = list(prevs)
        mixed[3] = wrong[3]
        with pytest.raises(ArcV3Error) as info:
            delta_decompress_tensors(mixed, payload, checksum)
        names[info.value.name] += 1
        _assert_wrong_base_error(info.value)
        restored = delta_decompress_tensors(prevs, payload, checksum)
        assert all(torch.equal(_bits(r), _bits(d)) for r, d in zip(restored, nexts))
    assert set(names) == {"checksum_mismatch"}, dict(names)


@pytest.mark.parametrize("wrong_base", sorted(WRONG_BASES))
def test_wrong_base_of_a_session_is_wrong_base(wrong_base):
    """Session payloads carry their base's checksum (a continuing step, its session's
    last result): a wrong base is wrong_base, before any chunk is decoded."""
    s = trainer_snapshots(65_536, 3, steps=4)
    sender, receiver = arc_v3.Session(), arc_v3.Session()
    weights = s[1].clone()
    for k in (1, 2, 3):  # the steps s[k] -> s[k + 1]; s[k - 1] is one step behind
        payload, checksum = sender.compress(s[k], s[k + 1])
        wrong = WRONG_BASES[wrong_base](s[k - 1:], 3)
        with pytest.raises(ArcV3Error) as info:
            receiver.decompress(wrong, payload, checksum)
        assert info.value.name == "wrong_base", (k, str(info.value))
        receiver.decompress(weights, payload, checksum, out=weights)
        assert torch.equal(_bits(weights), _bits(s[k + 1]))
    # Groups, the second step continuing the first (no tensor list, no base checksum).
    prevs, nexts = small_layers(4)
    group_sender, group_receiver = arc_v3.Session(), arc_v3.Session()
    payload, checksum = group_sender.compress_tensors(prevs, nexts)
    wrong, _ = small_layers(4, wrong_base)
    with pytest.raises(ArcV3Error) as info:
        group_receiver.decompress_tensors(wrong, payload, checksum)
    assert info.value.name == "wrong_base", str(info.value)
    group_receiver.decompress_tensors(prevs, payload, checksum)
    nexts2 = [(_bits(t) + (torch.arange(t.numel()) % 97 == 0).to(torch.int16)).view(
        torch.bfloat16) for t in nexts]
    payload, checksum = group_sender.compress_tensors(nexts, nexts2)
    assert arc_v3.payload_info(payload)["continues"]
    wrong = [WRONG_BASES[wrong_base]((p, n), 4) for p, n in zip(prevs, nexts)]
    with pytest.raises(ArcV3Error) as info:
        group_receiver.decompress_tensors(wrong, payload, checksum)
    assert info.value.name == "wrong_base", str(info.value)
    restored = group_receiver.decompress_tensors(nexts, payload, checksum)
    assert all(torch.equal(_bits(r), _bits(d)) for r, d in zip(restored, nexts2))


@pytest.mark.parametrize("wrong_base", sorted(WRONG_BASES))
def test_wrong_base_of_a_state_dict_is_checksum_mismatch(wrong_base):
    """The container checks each piece's base rows (base_xxh3): checksum_mismatch, naming
    the tensor, for large tensors and for grouped small ones."""
    prevs, nexts = small_layers(5)
    big = trainer_snapshots(1 << 20, 6)
    prev = {f"layer{i}": t for i, t in enumerate(prevs)}
    nxt = {f"layer{i}": t for i, t in enumerate(nexts)}
    prev["big"], nxt["big"] = big[1], big[2]
    delta = delta_compress_dicts(prev, nxt)
    wrong_small, _ = small_layers(5, wrong_base)
    for name, value in (("layer3", wrong_small[3]), ("big", WRONG_BASES[wrong_base](big, 6))):
        wrong = dict(prev)
        wrong[name] = value
        with pytest.raises(ArcV3Error) as info:
            delta_decompress_dicts(wrong, delta)
        assert info.value.name == "checksum_mismatch", str(info.value)
        assert "wrong base" in info.value.message and name in info.value.message


# --- Damage the payload's bytes show by themselves keeps its own code ------------------

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden")


def _golden_errors():
    folder = os.path.join(GOLDEN, "errors")
    return sorted(f[:-len(".arc3")] for f in os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.mark.parametrize("name", _golden_errors() or ["(no tests/golden beside python/)"])
def test_golden_error_payloads(name):
    """tests/golden/errors/NAME.arc3 on v1_sparse's base fails with NAME in C++; in Python
    too, except that corrupt_chunk (which a wrong base also gives) is checksum_mismatch."""
    if not _golden_errors():
        pytest.skip("tests/golden is not beside python/ (the Bazel test's runfiles)")
    src = np.fromfile(os.path.join(GOLDEN, "v1_sparse.src.bf16"), dtype="<u2")
    with open(os.path.join(GOLDEN, "MANIFEST.txt"), encoding="utf-8") as f:
        checksum = next(int(line.split()[2], 16) for line in f
                        if line.split()[:1] == ["v1_sparse"])
    with open(os.path.join(GOLDEN, "errors", name + ".arc3"), "rb") as f:
        payload = f.read()
    for base in (src, src ^ np.uint16(0x80)):  # the right base and a wrong one
        e = _decode_error(base, payload, checksum)
        if name == "corrupt_chunk":
            _assert_wrong_base_error(e)
            assert e.message.startswith(WRONG_BASE_MESSAGE + " (corrupt_chunk: "), e.message
        else:
            assert e.name == name, str(e)


def test_structural_damage_keeps_its_code_on_any_base():
    s, payload, checksum = _case(65_536, 1, "arc_v3", None)
    wrong = WRONG_BASES["other_tensor"](s, 1)
    damaged = {
        "bad_magic": b"XXXX" + payload[4:],
        "truncated": payload[:5],
        "unsupported_version": payload[:4] + bytes([200]) + payload[5:],
        "reserved_bits_set": payload[:5] + bytes([payload[5] | 0x80]) + payload[6:],
        "corrupt_header": payload[:5] + bytes([payload[5] | 0x04]) + payload[6:],
    }
    for name, bad in damaged.items():
        for base in (s[1], wrong):
            assert _decode_error(base, bad, checksum).name == name
    assert _decode_error(s[1][:-1], payload, checksum).name == "size_mismatch"
    # The right base with the wrong checksum: the C++ library's own checksum_mismatch.
    e = _decode_error(s[1], payload, checksum ^ 1)
    _assert_wrong_base_error(e)
