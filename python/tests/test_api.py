"""delta_compress / delta_decompress: the published API on tensors, arrays and buffers."""

import numpy as np
import pytest
import torch

import arc_v3
from arc_v3 import ArcV3Error, delta_compress, delta_decompress
from conftest import bf16_step, changed_fraction


def test_published_example_verbatim():
    src, dst = bf16_step((512, 384), lr=3e-6, seed=1)
    assert 0 < changed_fraction(src, dst) < 0.2

    from arc_v3 import delta_compress, delta_decompress  # noqa: F811 - as published
    compressed_diff, checksum = delta_compress(src=src, dst=dst, compression_format="arc_v3")
    restored = delta_decompress(src=src, compressed_diff=compressed_diff, checksum=checksum,
                                compression_format="arc_v3")
    assert torch.equal(restored.view(torch.uint8), dst.view(torch.uint8))

    assert isinstance(compressed_diff, bytes)
    assert isinstance(checksum, int)
    assert restored.dtype == torch.bfloat16 and restored.shape == src.shape
    assert checksum == arc_v3.checksum(dst)


@pytest.mark.parametrize("compression_format", arc_v3.COMPRESSION_FORMATS)
@pytest.mark.parametrize("shape,lr", [((1,), 1e-3), ((1000,), 1e-5), ((64, 257), 3e-6),
                                      ((3, 50, 70), 1e-4), ((300_000,), 1e-5)])
def test_round_trip_realistic_updates(compression_format, shape, lr):
    src, dst = bf16_step(shape, lr=lr, seed=sum(shape))
    payload, checksum = delta_compress(src, dst, compression_format)
    restored = delta_decompress(src, payload, checksum, compression_format)
    assert torch.equal(restored.view(torch.int16), dst.view(torch.int16))
    assert restored.shape == dst.shape
    info = arc_v3.payload_info(payload)
    assert info["element_count"] == src.numel()
    # ARCv3 as published keeps its format version 1.
    published = compression_format == "arc_v3_published"
    assert info["format_version"] == (1 if published else arc_v3.FORMAT_VERSION)


def test_sparse_updates_compress_well():
    src, dst = bf16_step((1 << 20,), lr=2e-6, seed=3)
    density = changed_fraction(src, dst)
    assert 0.0005 < density < 0.05
    payload, _ = delta_compress(src, dst)
    # Each change costs a few bits; the raw BF16 bytes would cost 16 per value.
    assert len(payload) < 0.25 * src.numel() * 2
    assert len(payload) * 8 < 16 * density * src.numel()


def test_real_corpus_pair(corpus_pair):
    prev, nxt = corpus_pair
    total_raw = total_payload = 0
    for name, a in prev.items():
        b = nxt[name]
        payload, checksum = delta_compress(a, b)
        restored = delta_decompress(a, payload, checksum)
        assert restored.dtype == np.uint16 and restored.shape == a.shape
        assert np.array_equal(restored, b), name
        total_raw += a.nbytes
        total_payload += len(payload)
    # ≈0.2% of values change per step: the delta is a small fraction of the weights.
    assert total_payload < 0.05 * total_raw


def test_every_bit_pattern_round_trips():
    src = np.arange(1 << 16, dtype=np.uint16)  # NaN payloads, ±Inf, ±0, denormals
    dst = np.random.default_rng(0).permutation(src)
    payload, checksum = delta_compress(src, dst, chunk_elements=1024)
    assert np.array_equal(delta_decompress(src, payload, checksum), dst)


def test_bytes_do_not_depend_on_threads():
    src, dst = bf16_step((1 << 16,), lr=1e-4, seed=4)
    one = delta_compress(src, dst, threads=1, chunk_elements=4096)
    many = delta_compress(src, dst, threads=4, chunk_elements=4096)
    assert one == many
    for threads in (1, 3):
        out = delta_decompress(src, one[0], one[1], threads=threads)
        assert torch.equal(out.view(torch.int16), dst.view(torch.int16))


def test_effort_levels_all_round_trip():
    src, dst = bf16_step((20_000,), lr=1e-4, seed=5)
    for effort in range(4):
        payload, checksum = delta_compress(src, dst, effort=effort)
        out = delta_decompress(src, payload, checksum)
        assert torch.equal(out.view(torch.int16), dst.view(torch.int16))


def test_published_format_is_read_under_either_name():
    src, dst = bf16_step((5000,), lr=1e-4, seed=6)
    payload, checksum = delta_compress(src, dst, "arc_v3_published")
    out = delta_decompress(src, payload, checksum, "arc_v3")
    assert torch.equal(out.view(torch.int16), dst.view(torch.int16))


# --- Layouts --------------------------------------------------------------------------

def test_non_contiguous_tensors():
    src, dst = bf16_step((300, 200), lr=1e-4, seed=7)
    s, d = src.t(), dst.t()  # transposed views
    assert not s.is_contiguous()
    payload, checksum = delta_compress(s, d)
    out = delta_decompress(s, payload, checksum)
    assert out.shape == s.shape and out.is_contiguous()
    assert torch.equal(out.view(torch.int16), d.contiguous().view(torch.int16))

    s2, d2 = src[::3, 1::2], dst[::3, 1::2]  # strided slices
    payload, checksum = delta_compress(s2, d2)
    out = delta_decompress(s2, payload, checksum)
    assert torch.equal(out.view(torch.int16), d2.contiguous().view(torch.int16))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 2)])
def test_zero_size(shape):
    src = torch.empty(shape, dtype=torch.bfloat16)
    payload, checksum = delta_compress(src, src.clone())
    out = delta_decompress(src, payload, checksum)
    assert out.shape == src.shape and out.dtype == torch.bfloat16
    a = np.empty(shape, dtype=np.uint16)
    payload, checksum = delta_compress(a, a)
    assert delta_decompress(a, payload, checksum).shape == shape
    payload, checksum = delta_compress(b"", b"")
    assert delta_decompress(b"", payload, checksum) == b""


def test_scalar_tensor():
    src = torch.tensor(1.5, dtype=torch.bfloat16)
    dst = torch.tensor(-2.0, dtype=torch.bfloat16)
    payload, checksum = delta_compress(src, dst)
    out = delta_decompress(src, payload, checksum)
    assert out.shape == () and out.item() == -2.0


def test_parameters_with_grad():
    src, dst = bf16_step((100, 10), lr=1e-3, seed=8)
    p_src = torch.nn.Parameter(src.clone())
    p_dst = torch.nn.Parameter(dst.clone())
    payload, checksum = delta_compress(p_src, p_dst)
    out = delta_decompress(p_src, payload, checksum)
    assert torch.equal(out.view(torch.int16), dst.view(torch.int16))
    delta_decompress(p_src, payload, checksum, out=p_src)  # in place into a parameter
    assert torch.equal(p_src.detach().view(torch.int16), dst.view(torch.int16))


def test_numpy_arrays():
    src_t, dst_t = bf16_step((40, 60), lr=1e-4, seed=9)
    src = src_t.view(torch.int16).numpy().view(np.uint16)
    dst = dst_t.view(torch.int16).numpy().view(np.uint16)
    payload, checksum = delta_compress(src, dst)
    # numpy and torch inputs with the same values give the same bytes.
    assert (payload, checksum) == delta_compress(src_t, dst_t)
    out = delta_decompress(src, payload, checksum)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16 and out.shape == src.shape
    assert np.array_equal(out, dst)

    # Non-contiguous and big-endian arrays are accepted and read by value.
    payload, checksum = delta_compress(src[:, ::2], dst[:, ::2])
    assert np.array_equal(delta_decompress(src[:, ::2], payload, checksum), dst[:, ::2])
    src_be, dst_be = src.astype(">u2"), dst.astype(">u2")
    assert delta_compress(src_be, dst_be) == delta_compress(src, dst)


def test_raw_buffers():
    src_t, dst_t = bf16_step((1000,), lr=1e-4, seed=10)
    src = src_t.view(torch.int16).numpy().tobytes()
    dst = dst_t.view(torch.int16).numpy().tobytes()
    payload, checksum = delta_compress(src, dst)
    assert (payload, checksum) == delta_compress(src_t, dst_t)
    out = delta_decompress(src, payload, checksum)
    assert isinstance(out, bytes) and out == dst
    out = delta_decompress(bytearray(src), memoryview(payload), checksum)
    assert out == dst
    with pytest.raises(ValueError, match="odd"):
        delta_compress(src[:-1], dst[:-1])


# --- In place and out= ----------------------------------------------------------------

def test_in_place_torch():
    src, dst = bf16_step((256, 100), lr=1e-4, seed=11)
    payload, checksum = delta_compress(src, dst)
    base = src.clone()
    result = delta_decompress(base, payload, checksum, out=base)
    assert result is base
    assert torch.equal(base.view(torch.int16), dst.view(torch.int16))


def test_in_place_non_contiguous_and_numpy():
    src, dst = bf16_step((256, 100), lr=1e-4, seed=12)
    s, d = src.t(), dst.t()
    payload, checksum = delta_compress(s, d)
    base = src.clone().t()
    assert delta_decompress(base, payload, checksum, out=base) is base
    assert torch.equal(base.contiguous().view(torch.int16), d.contiguous().view(torch.int16))

    a = src.view(torch.int16).numpy().view(np.uint16).copy()
    b = dst.view(torch.int16).numpy().view(np.uint16)
    payload, checksum = delta_compress(a, b)
    assert delta_decompress(a, payload, checksum, out=a) is a
    assert np.array_equal(a, b)


def test_out_into_preallocated_buffers():
    src, dst = bf16_step((3000,), lr=1e-4, seed=13)
    payload, checksum = delta_compress(src, dst)
    out = torch.empty_like(src)
    delta_decompress(src, payload, checksum, out=out)
    assert torch.equal(out.view(torch.int16), dst.view(torch.int16))
    buf = bytearray(src.numel() * 2)
    delta_decompress(src, payload, checksum, out=buf)
    assert bytes(buf) == dst.view(torch.int16).numpy().tobytes()


def test_failed_in_place_leaves_out_unchanged():
    src, dst = bf16_step((5000,), lr=1e-4, seed=14)
    payload, checksum = delta_compress(src, dst)
    wrong = src.clone()
    wrong[17] = 123.0
    before = wrong.clone()
    with pytest.raises(ArcV3Error) as info:
        delta_decompress(wrong, payload, checksum, out=wrong)
    assert info.value.name == "checksum_mismatch"
    assert torch.equal(wrong.view(torch.int16), before.view(torch.int16))


# --- Errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("compression_format", arc_v3.COMPRESSION_FORMATS)
def test_wrong_base_raises(compression_format):
    src, dst = bf16_step((10_000,), lr=1e-4, seed=15)
    payload, checksum = delta_compress(src, dst, compression_format)
    other, _ = bf16_step((10_000,), lr=1e-4, seed=16)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress(other, payload, checksum)
    # One error whatever the decoder meets first: the result's checksum fails (XOR fields,
    # as published), or a modelled chunk derails on the wrong base (test_wrong_base.py).
    assert info.value.code == 10 and info.value.name == "checksum_mismatch"
    assert arc_v3.ERROR_NAMES[info.value.code] == info.value.name
    assert info.value.name in str(info.value) and "wrong base" in info.value.message
    with pytest.raises(ArcV3Error, match="checksum_mismatch"):
        delta_decompress(src, payload, checksum ^ 1)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress(src[:-1], payload, checksum)
    assert info.value.name == "size_mismatch"


def test_corrupted_bytes_raise():
    src, dst = bf16_step((20_000,), lr=1e-4, seed=17)
    payload, checksum = delta_compress(src, dst)
    for size in range(len(payload)):  # every truncation
        with pytest.raises(ArcV3Error):
            delta_decompress(src, payload[:size], checksum)
    rng = np.random.default_rng(0)
    for at in rng.choice(len(payload), size=min(200, len(payload)), replace=False):
        for bit in (0, 3, 7):
            bad = bytearray(payload)
            bad[at] ^= 1 << bit
            with pytest.raises(ArcV3Error):
                delta_decompress(src, bytes(bad), checksum)
    with pytest.raises(ArcV3Error) as info:
        delta_decompress(src, b"not an arc_v3 payload", checksum)
    assert info.value.name == "bad_magic"


def test_misuse_raises_python_errors():
    src, dst = bf16_step((100,), lr=1e-4, seed=18)
    payload, checksum = delta_compress(src, dst)
    with pytest.raises(ValueError, match="compression_format"):
        delta_compress(src, dst, compression_format="arc_v2")
    with pytest.raises(ValueError, match="compression_format"):
        delta_decompress(src, payload, checksum, compression_format="zip")
    with pytest.raises(TypeError, match="bfloat16"):
        delta_compress(src.float(), dst.float())
    with pytest.raises(TypeError, match="uint16"):
        delta_compress(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="shape"):
        delta_compress(src.reshape(10, 10), dst.reshape(100))
    with pytest.raises(ValueError, match="differ in length"):
        delta_compress(b"\0\0", b"\0\0\0\0")
    with pytest.raises(ValueError):
        delta_decompress(src, payload, -1)
    with pytest.raises(TypeError):
        delta_decompress(src, payload, "123")
    with pytest.raises(TypeError):
        delta_decompress(src, 12345, checksum)
    with pytest.raises(ValueError, match="read-only"):
        delta_decompress(src, payload, checksum, out=memoryview(bytes(200)))
    with pytest.raises(ValueError, match="shape"):
        delta_decompress(src, payload, checksum, out=torch.empty(99, dtype=torch.bfloat16))
    with pytest.raises(ArcV3Error) as info:
        delta_compress(src, dst, effort=9)
    assert info.value.name == "invalid_argument"
    with pytest.raises(ArcV3Error):
        delta_compress(src, dst, chunk_elements=1000)


def test_error_class_is_an_exception_with_code_and_name():
    e = ArcV3Error(10, "checksum_mismatch", "msg")
    assert isinstance(e, Exception)
    assert (e.code, e.name, e.message) == (10, "checksum_mismatch", "msg")
    assert set(arc_v3.ERROR_NAMES.values()) >= {"ok", "checksum_mismatch", "truncated"}


def test_gil_is_released_while_the_codec_runs():
    import threading
    import time
    src, dst = bf16_step((1 << 21,), lr=1e-4, seed=19)
    window = {}

    def work():
        window["enter"] = time.perf_counter()
        delta_compress(src, dst, threads=1)
        window["exit"] = time.perf_counter()

    stamps = []
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
    worker.join()
    # Holding the GIL during the call would stop this loop for the call's whole length;
    # released, the loop only pauses for scheduling (milliseconds).
    inside = [window["enter"]] + [t for t in stamps if window["enter"] < t < window["exit"]]
    inside.append(window["exit"])
    longest_pause = max(b - a for a, b in zip(inside, inside[1:]))
    duration = window["exit"] - window["enter"]
    assert longest_pause < 0.5 * duration, (longest_pause, duration)
