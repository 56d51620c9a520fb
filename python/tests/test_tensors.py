"""delta_compress_tensors / delta_decompress_tensors: several tensors in one payload."""

import numpy as np
import pytest
import torch

import arc_v3
from arc_v3 import (ArcV3Error, delta_compress, delta_compress_tensors, delta_decompress,
                    delta_decompress_tensors)
from conftest import bf16_step


def small_layers(seed=0):
    """Norms, biases and a small matrix, as a model has many of."""
    shapes = [(256,), (256,), (64, 32), (1,), (0,), (1000,)]
    pairs = [bf16_step(shape, lr=1e-4, seed=seed + i) for i, shape in enumerate(shapes)]
    return [p for p, _ in pairs], [n for _, n in pairs]


def test_round_trip_tensors_arrays_and_buffers():
    srcs, dsts = small_layers()
    payload, checksum = delta_compress_tensors(srcs, dsts)
    info = arc_v3.payload_info(payload)
    # A group names its tensors by count and a check of their sizes, not by the list (the
    # decoder is handed it).
    assert info["format_version"] == arc_v3.FORMAT_VERSION == 16
    assert info["tensor_count"] == len(srcs)
    assert checksum == arc_v3.checksum(torch.cat([t.reshape(-1) for t in dsts]))

    restored = delta_decompress_tensors(srcs, payload, checksum)
    assert len(restored) == len(dsts)
    for r, d in zip(restored, dsts):
        assert r.dtype == torch.bfloat16 and r.shape == d.shape
        assert torch.equal(r.view(torch.int16), d.view(torch.int16))

    arrays = [t.view(torch.int16).numpy().view(np.uint16) for t in srcs]
    for r, d in zip(delta_decompress_tensors(arrays, payload, checksum), dsts):
        assert np.array_equal(r, d.view(torch.int16).numpy().view(np.uint16))
    raw = [t.view(torch.int16).numpy().tobytes() for t in srcs]
    for r, d in zip(delta_decompress_tensors(raw, payload, checksum), dsts):
        assert isinstance(r, bytes) and r == d.view(torch.int16).numpy().tobytes()


def test_in_place_and_into_outs():
    srcs, dsts = small_layers(seed=5)
    payload, checksum = delta_compress_tensors(srcs, dsts)
    outs = [torch.empty_like(t) for t in srcs]
    assert delta_decompress_tensors(srcs, payload, checksum, outs=outs) is not None
    for o, d in zip(outs, dsts):
        assert torch.equal(o.view(torch.int16), d.view(torch.int16))
    work = [t.clone() for t in srcs]
    delta_decompress_tensors(work, payload, checksum, outs=work)
    for w, d in zip(work, dsts):
        assert torch.equal(w.view(torch.int16), d.view(torch.int16))


def test_group_is_smaller_than_one_payload_per_tensor():
    srcs, dsts = small_layers(seed=9)
    together, _ = delta_compress_tensors(srcs, dsts)
    apart = sum(len(delta_compress(s, d)[0]) + 8 for s, d in zip(srcs, dsts))
    assert len(together) + 8 < apart


def test_wrong_sizes_wrong_base_and_one_tensor_calls_are_refused():
    srcs, dsts = small_layers(seed=3)
    payload, checksum = delta_compress_tensors(srcs, dsts)
    outs = [t.clone() for t in srcs]
    before = [o.clone() for o in outs]
    with pytest.raises(ArcV3Error) as e:
        delta_decompress_tensors(srcs[:-1], payload, checksum, outs=outs[:-1])
    assert e.value.name == "size_mismatch"
    swapped = [srcs[2], srcs[1], srcs[0]] + srcs[3:]
    with pytest.raises(ArcV3Error) as e:
        delta_decompress_tensors(swapped, payload, checksum)
    assert e.value.name == "size_mismatch"
    wrong = [t.clone() for t in srcs]
    wrong[5].view(torch.int16)[7] ^= 1  # a mantissa bit: decodes, then fails the checksum
    with pytest.raises(ArcV3Error) as e:
        delta_decompress_tensors(wrong, payload, checksum, outs=outs)
    assert e.value.name == "checksum_mismatch"
    for o, b in zip(outs, before):
        assert torch.equal(o.view(torch.int16), b.view(torch.int16))
    with pytest.raises(ArcV3Error) as e:
        delta_decompress(torch.cat([t.reshape(-1) for t in srcs]), payload, checksum)
    assert e.value.name == "size_mismatch"


def test_misuse_raises_python_errors():
    srcs, dsts = small_layers()
    with pytest.raises(ValueError):
        delta_compress_tensors(srcs, dsts[:-1])
    with pytest.raises(ValueError):
        delta_compress_tensors([torch.zeros(3, dtype=torch.bfloat16)],
                               [torch.zeros(4, dtype=torch.bfloat16)])
    with pytest.raises(TypeError):
        delta_compress_tensors([torch.zeros(3)], [torch.zeros(3)])  # float32
    payload, checksum = delta_compress_tensors(srcs, dsts)
    with pytest.raises(ValueError):
        delta_decompress_tensors(srcs, payload, checksum, outs=[t.clone() for t in srcs[:2]])
    with pytest.raises(ArcV3Error) as e:
        delta_compress_tensors(srcs, dsts, "arc_v3_published")
    assert e.value.name == "invalid_argument"


def test_session_steps_and_errors():
    """arc_v3.Session: per tensor and over a group, in step on both sides; a wrong base
    or a missed step is refused with the receiver unchanged."""
    steps = [bf16_step((200_000,), lr=1e-5, seed=s) for s in range(3)]
    chain = [steps[0][0]]
    for _, n in steps:  # a chain of snapshots: each step moves the previous one
        chain.append(torch.where(torch.rand(200_000, generator=torch.Generator().manual_seed(
            len(chain))) < 0.02, n, chain[-1]))
    sender, receiver = arc_v3.Session(), arc_v3.Session()
    weights = chain[0].clone()
    payloads = []
    for k in range(len(chain) - 1):
        payload, checksum = sender.compress(chain[k], chain[k + 1])
        payloads.append((payload, checksum))
        with pytest.raises(ArcV3Error) as e:
            delta_decompress(chain[k], payload, checksum)
        assert e.value.name == "history_mismatch"
        assert receiver.decompress(weights, payload, checksum, out=weights) is weights
        assert torch.equal(weights.view(torch.int16), chain[k + 1].view(torch.int16))
        assert receiver.history_id == sender.history_id and receiver.steps == k + 1
    late = arc_v3.Session()
    with pytest.raises(ArcV3Error) as e:
        late.decompress(chain[1], *payloads[1])  # step 1 without step 0
    assert e.value.name == "history_mismatch" and late.steps == 0
    with pytest.raises(ArcV3Error) as e:
        late.decompress(chain[1], *payloads[0])  # step 0 on the wrong base
    assert e.value.name == "wrong_base" and late.steps == 0
    restored = late.decompress(chain[0], *payloads[0])
    assert torch.equal(restored.view(torch.int16), chain[1].view(torch.int16))

    srcs, dsts = small_layers(seed=11)
    group_sender, group_receiver = arc_v3.Session(), arc_v3.Session()
    payload, checksum = group_sender.compress_tensors(srcs, dsts)
    info = arc_v3.payload_info(payload)
    assert info["session"] and not info["continues"]
    assert info["tensor_count"] == len(srcs)
    restored = group_receiver.decompress_tensors(srcs, payload, checksum)
    for r, d in zip(restored, dsts):
        assert torch.equal(r.view(torch.int16), d.view(torch.int16))
    # The next step starts from that result over the same tensors: it continues the step
    # and leaves out its base checksum and tensor list, which the receiver remembers.
    nexts = [d.clone() for d in dsts]
    nexts[0].view(torch.int16)[:3] += 1
    payload, checksum = group_sender.compress_tensors(dsts, nexts)
    info = arc_v3.payload_info(payload)
    assert info["continues"] and info["tensor_count"] == 0
    restored = group_receiver.decompress_tensors(restored, payload, checksum)
    for r, d in zip(restored, nexts):
        assert torch.equal(r.view(torch.int16), d.view(torch.int16))
    group_sender.reset()
    assert group_sender.steps == 0


def test_worth_grouping_small_sparse_tensors():
    src = np.full(1000, 0x3C00, dtype=np.uint16)
    dst = src.copy()
    dst[:10] += 1
    assert arc_v3.delta_worth_grouping(src, dst)
    big = np.zeros(1 << 20, dtype=np.uint16)
    assert not arc_v3.delta_worth_grouping(big, big)
    dense_src = np.full(20000, 0x3C00, dtype=np.uint16)
    dense_dst = dense_src + 1  # 20,000 changes: more than 16,384
    assert not arc_v3.delta_worth_grouping(dense_src, dense_dst)
    with pytest.raises(ValueError):
        arc_v3.delta_worth_grouping(src, dst[:999])
