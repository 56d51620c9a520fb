"""arc_v3: lossless compression of BF16 weight-update deltas (Python binding).

The published API::

    from arc_v3 import delta_compress, delta_decompress
    compressed_diff, checksum = delta_compress(src=src, dst=dst, compression_format="arc_v3")
    restored = delta_decompress(src=src, compressed_diff=compressed_diff, checksum=checksum,
                                compression_format="arc_v3")

``src``/``dst`` may be torch.bfloat16 CPU tensors (any shape, contiguous or not), NumPy
uint16 arrays (BF16 bit patterns; any shape), or raw buffers (bytes, bytearray,
memoryview) holding little-endian BF16 values. The result mirrors ``src``: a bfloat16
tensor or a uint16 array of src's shape, or ``bytes``. Contiguous inputs are passed to
the C++ codec without copies and the GIL is released while it runs.

Errors from the codec raise :class:`ArcV3Error` with ``.code`` / ``.name`` / ``.message``
(a wrong base: always ``checksum_mismatch``); misuse (wrong dtype, shape, device, unknown
format) raises TypeError / ValueError.
"""

import operator
import sys

import numpy as np

from arc_v3 import _arc_v3 as _ext
from arc_v3._errors import ArcV3Error

__all__ = [
    "ArcV3Error",
    "COMPRESSION_FORMATS",
    "ERROR_NAMES",
    "Session",
    "checksum",
    "delta_compress",
    "delta_compress_dicts",
    "delta_compress_tensors",
    "delta_decompress",
    "delta_decompress_dicts",
    "delta_decompress_tensors",
    "delta_dicts_info",
    "delta_worth_grouping",
    "payload_info",
    "sync",
]

__version__ = _ext.VERSION
# Payload format version the library writes and reads (src/codec/FORMAT.md).
FORMAT_VERSION = _ext.FORMAT_VERSION
# SIMD target the kernels dispatch to on this machine, e.g. "AVX3".
ACTIVE_TARGET = _ext.ACTIVE_TARGET
# Stable error code -> name, e.g. {10: "checksum_mismatch", ...} (from the C++ library).
ERROR_NAMES = dict(_ext.ERROR_NAMES)

# The one table of compression_format names -> arc_v3::Format. Add new formats here.
# Decoding reads every format (payloads are self-describing); the name is still checked.
_FORMATS = {
    "arc_v3": _ext.FORMAT_DEFAULT,  # the best general choice; may change between releases
    "arc_v3_published": _ext.FORMAT_ARC_V3,  # ARCv3 exactly as published
}
COMPRESSION_FORMATS = tuple(_FORMATS)

if sys.byteorder != "little":  # the payload and the checksum are defined on LE bytes
    raise ImportError("arc_v3 supports little-endian hosts only")


def _format_id(compression_format):
    try:
        return _FORMATS[compression_format]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown compression_format {compression_format!r}; "
            f"expected one of {', '.join(COMPRESSION_FORMATS)}") from None


def _torch_module(value):
    """torch, if `value` is a torch.Tensor (never imports torch itself)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return torch
    return None


def _is_u16_dtype(dtype):
    """uint16 in either byte order, or ml_dtypes' bfloat16."""
    return (dtype.kind == "u" and dtype.itemsize == 2) or dtype.name == "bfloat16"


class _Values:
    """A BF16 input as a C-contiguous buffer the extension reads without copying.

    kind: "torch", "numpy" or "raw"; shape: None for raw buffers; buf: what the
    extension receives; obj: the contiguous tensor/array (keeps buf's memory alive).
    """

    __slots__ = ("kind", "shape", "buf", "obj")

    def __init__(self, value, what):
        torch = _torch_module(value)
        if torch is not None:
            if value.dtype != torch.bfloat16:
                raise TypeError(f"{what}: expected a torch.bfloat16 tensor, got {value.dtype}")
            if value.device.type != "cpu":
                raise ValueError(f"{what}: tensor is on {value.device}; move it to the CPU first")
            t = value.detach()
            if not t.is_contiguous():
                t = t.contiguous()  # the one copy a strided tensor needs
            self.kind, self.shape, self.obj = "torch", tuple(value.shape), t
            self.buf = t.view(torch.int16).numpy()  # zero-copy view of the tensor's memory
        elif isinstance(value, np.ndarray):
            if not _is_u16_dtype(value.dtype):
                raise TypeError(f"{what}: expected a numpy uint16 array of BF16 bit patterns, "
                                f"got dtype {value.dtype}")
            a = value
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            a = np.ascontiguousarray(a)  # no copy when already C-contiguous
            self.kind, self.shape, self.obj, self.buf = "numpy", value.shape, a, a
        else:
            try:
                view = memoryview(value)
            except TypeError:
                raise TypeError(f"{what}: expected a torch.bfloat16 tensor, a numpy uint16 "
                                f"array or a bytes-like buffer, got {type(value).__name__}"
                                ) from None
            if not view.c_contiguous:
                view = memoryview(view.tobytes())
            if view.itemsize not in (1, 2):
                view = view.cast("B")
            self.kind, self.shape, self.obj, self.buf = "raw", None, value, view


def _check_same_shape(a, b, what_a, what_b):
    if a.shape is not None and b.shape is not None and tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{what_a} has shape {tuple(a.shape)} but {what_b} has shape "
                         f"{tuple(b.shape)}")


def _payload_buffer(compressed_diff):
    torch = _torch_module(compressed_diff)
    if torch is not None:
        return compressed_diff.detach().contiguous().view(torch.uint8).numpy()
    try:
        view = memoryview(compressed_diff)
    except TypeError:
        raise TypeError("compressed_diff: expected bytes or another bytes-like object, got "
                        f"{type(compressed_diff).__name__}") from None
    return view if view.c_contiguous else memoryview(view.tobytes())


def _checksum_value(checksum):
    try:
        value = operator.index(checksum)
    except TypeError:
        raise TypeError(f"checksum: expected an int, got {type(checksum).__name__}") from None
    if not 0 <= value < 1 << 64:
        raise ValueError(f"checksum {value} is not a 64-bit unsigned integer")
    return value


def delta_compress(src, dst, compression_format="arc_v3", *, threads=0, effort=None,
                   chunk_elements=None):
    """Encodes the change from ``src`` (previous weights) to ``dst`` (new weights).

    Args:
        src, dst: BF16 values of the same shape: torch.bfloat16 CPU tensors, numpy uint16
            arrays or bytes-like buffers (little-endian BF16 bit patterns).
        compression_format: one of COMPRESSION_FORMATS ("arc_v3" = best default,
            "arc_v3_published" = ARCv3 as published).
        threads: worker threads, 0 = all hardware threads (the bytes do not depend on it).
        effort: 0 (fastest) .. 3 (smallest); None = the library default.
        chunk_elements: values per independently coded chunk (power of two in
            [2**10, 2**24]); None = the library default.

    Returns:
        (compressed_diff: bytes, checksum: int), checksum = XXH3-64 of dst's bytes.
    """
    fmt = _format_id(compression_format)
    s = _Values(src, "src")
    d = _Values(dst, "dst")
    _check_same_shape(s, d, "src", "dst")
    return _ext.compress(
        s.buf, d.buf, fmt,
        _ext.DEFAULT_EFFORT if effort is None else int(effort),
        int(threads),
        _ext.DEFAULT_CHUNK_ELEMENTS if chunk_elements is None else int(chunk_elements))


def delta_decompress(src, compressed_diff, checksum, compression_format="arc_v3", *, out=None,
                     threads=0):
    """Rebuilds dst from ``src`` and ``compressed_diff``, verified against ``checksum``.

    Args:
        src: the same base values delta_compress saw (tensor, array or buffer).
        compressed_diff: the payload (bytes-like).
        checksum: the int delta_compress returned.
        compression_format: one of COMPRESSION_FORMATS (any payload format is decoded).
        out: optional destination to write into: a bfloat16 tensor, uint16 array or
            writable buffer with src's shape. ``out=src`` applies the delta in place,
            touching only the changed values. On error ``out`` is left unchanged.
        threads: worker threads, 0 = all hardware threads.

    Returns:
        ``out`` if given; else a new object mirroring src: a torch.bfloat16 tensor or numpy
        array of src's shape and dtype, or ``bytes`` for buffer inputs.

    Raises:
        ArcV3Error: checksum_mismatch for a wrong base, whatever the decoder meets first
            (a result that fails the checksum, or a chunk that derails on the base: its
            message then says "does not decode against this base"); a payload damaged
            inside its chunks raises the same. Damage the bytes show by themselves keeps
            its name: bad_magic, truncated, unsupported_version, reserved_bits_set,
            corrupt_header, codec_failure; size_mismatch when src's size differs.
    """
    _format_id(compression_format)
    s = _Values(src, "src")
    payload = _payload_buffer(compressed_diff)
    checksum = _checksum_value(checksum)
    threads = int(threads)

    if out is None:
        if s.kind == "raw":
            return _ext.decompress_to_bytes(s.buf, payload, checksum, threads)
        if s.kind == "torch":
            # The memory comes from numpy, which asks for transparent huge pages on large
            # arrays: first-touch page faults on a fresh torch.empty cost more than the
            # decode itself (measured 150 ms vs 19 ms for 32 MB, python/bench).
            values = np.empty(s.shape, dtype=np.int16)
            _ext.decompress_into(s.buf, payload, checksum, values, threads)
            return _torch_module(src).from_numpy(values).view(_torch_module(src).bfloat16)
        result = np.empty(s.shape, dtype=s.buf.dtype)
        _ext.decompress_into(s.buf, payload, checksum, result, threads)
        return result

    torch = _torch_module(out)
    if torch is not None:
        if out.dtype != torch.bfloat16 or out.device.type != "cpu":
            raise TypeError(f"out: expected a torch.bfloat16 CPU tensor, got {out.dtype} "
                            f"on {out.device}")
        _check_same_shape(s, out, "src", "out")
        target = out.detach()
        if target.is_contiguous():
            _ext.decompress_into(s.buf, payload, checksum, target.view(torch.int16).numpy(),
                                 threads)
        else:  # decode into a contiguous temporary, copy only on success
            temp = torch.empty(tuple(out.shape), dtype=torch.bfloat16)
            _ext.decompress_into(s.buf, payload, checksum, temp.view(torch.int16).numpy(),
                                 threads)
            target.copy_(temp)
        return out
    if isinstance(out, np.ndarray):
        if not _is_u16_dtype(out.dtype):
            raise TypeError(f"out: expected a numpy uint16 array, got dtype {out.dtype}")
        if out.dtype.byteorder == ">":
            raise TypeError("out: big-endian arrays are not supported as out")
        if not out.flags.writeable:
            raise ValueError("out: array is read-only")
        _check_same_shape(s, out, "src", "out")
        if out.flags.c_contiguous:
            _ext.decompress_into(s.buf, payload, checksum, out, threads)
        else:
            temp = np.empty(out.shape, dtype=out.dtype)
            _ext.decompress_into(s.buf, payload, checksum, temp, threads)
            out[...] = temp
        return out
    try:
        view = memoryview(out)
    except TypeError:
        raise TypeError("out: expected a torch.bfloat16 tensor, numpy uint16 array or "
                        f"writable buffer, got {type(out).__name__}") from None
    if view.readonly:
        raise ValueError("out: buffer is read-only")
    if not view.c_contiguous:
        raise ValueError("out: buffer must be C-contiguous")
    if view.itemsize not in (1, 2):
        view = view.cast("B")
    _ext.decompress_into(s.buf, payload, checksum, view, threads)
    return out


def _value_pairs(srcs, dsts):
    """The _Values of two equally long sequences of same-shaped tensors."""
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) != len(dsts):
        raise ValueError(f"srcs holds {len(srcs)} tensors but dsts {len(dsts)}")
    s = [_Values(v, f"srcs[{i}]") for i, v in enumerate(srcs)]
    d = [_Values(v, f"dsts[{i}]") for i, v in enumerate(dsts)]
    for i, (a, b) in enumerate(zip(s, d)):
        _check_same_shape(a, b, f"srcs[{i}]", f"dsts[{i}]")
    return s, d


def delta_worth_grouping(src, dst):
    """Whether a tensor should share a delta_compress_tensors payload with others rather
    than have its own: under 2**20 values, under 16,384 of them changed (the C++
    arc_v3::delta_worth_grouping). A Session's group must stay the same from step to step:
    choose it by size instead.

    Args:
        src, dst: as for delta_compress.
    """
    s = _Values(src, "src")
    d = _Values(dst, "dst")
    _check_same_shape(s, d, "src", "dst")
    return _ext.worth_grouping(s.buf, d.buf)


def delta_compress_tensors(srcs, dsts, compression_format="arc_v3", *, threads=0, effort=None,
                           chunk_elements=None):
    """Encodes the changes of several tensors as one payload (format version 6).

    Every payload pays a frame, a checksum and the time its adaptive contexts take to
    learn, about 20-30 bytes: for norms, biases and small layers with a few hundred changed
    values, one payload for the group is 5-20% smaller than one per tensor. Where ~10% of
    the values change, grouping tensors with thousands of changes each can cost ~1%:
    delta_worth_grouping says which tensors to group.

    Args:
        srcs, dsts: sequences of the same length; srcs[i] and dsts[i] as for
            delta_compress (same shape; torch.bfloat16 CPU tensors, numpy uint16 arrays or
            bytes-like buffers).
        compression_format: "arc_v3" (groups need the default format).
        threads, effort, chunk_elements: as for delta_compress.

    Returns:
        (compressed_diff: bytes, checksum: int), checksum = XXH3-64 of the dsts' bytes
        concatenated in order.
    """
    fmt = _format_id(compression_format)
    s, d = _value_pairs(srcs, dsts)
    return _ext.compress_tensors(
        [v.buf for v in s], [v.buf for v in d], fmt,
        _ext.DEFAULT_EFFORT if effort is None else int(effort),
        int(threads),
        _ext.DEFAULT_CHUNK_ELEMENTS if chunk_elements is None else int(chunk_elements))


def _writable_u16(out, what):
    """A C-contiguous writable view of ``out`` for the extension (no copy)."""
    torch = _torch_module(out)
    if torch is not None:
        if out.dtype != torch.bfloat16 or out.device.type != "cpu":
            raise TypeError(f"{what}: expected a torch.bfloat16 CPU tensor, got {out.dtype} "
                            f"on {out.device}")
        if not out.is_contiguous():
            raise ValueError(f"{what}: tensor must be contiguous")
        return out.detach().view(torch.int16).numpy()
    if isinstance(out, np.ndarray):
        if not _is_u16_dtype(out.dtype) or out.dtype.byteorder == ">":
            raise TypeError(f"{what}: expected a little-endian numpy uint16 array, got dtype "
                            f"{out.dtype}")
        if not out.flags.writeable or not out.flags.c_contiguous:
            raise ValueError(f"{what}: array must be writable and C-contiguous")
        return out
    try:
        view = memoryview(out)
    except TypeError:
        raise TypeError(f"{what}: expected a torch.bfloat16 tensor, numpy uint16 array or "
                        f"writable buffer, got {type(out).__name__}") from None
    if view.readonly or not view.c_contiguous:
        raise ValueError(f"{what}: buffer must be writable and C-contiguous")
    return view if view.itemsize in (1, 2) else view.cast("B")


def delta_decompress_tensors(srcs, compressed_diff, checksum, compression_format="arc_v3", *,
                             outs=None, threads=0):
    """Rebuilds every tensor of a delta_compress_tensors payload, all or none.

    Args:
        srcs: the base values delta_compress_tensors saw, in the same order.
        compressed_diff, checksum: what delta_compress_tensors returned.
        compression_format: one of COMPRESSION_FORMATS (any payload format is decoded).
        outs: optional destinations, one per src (contiguous bfloat16 tensors, uint16
            arrays or writable buffers of the same sizes); outs[i] may be srcs[i] (in
            place). On error none of them is changed.
        threads: worker threads, 0 = all hardware threads.

    Returns:
        ``outs`` if given, else a list mirroring srcs (as delta_decompress returns).

    Raises:
        ArcV3Error: size_mismatch when the tensors' sizes or count differ from the
            payload's; checksum_mismatch for a wrong base (any tensor's), as for
            delta_decompress; corrupt or truncated payloads.
    """
    _format_id(compression_format)
    s = [_Values(v, f"srcs[{i}]") for i, v in enumerate(srcs)]
    payload = _payload_buffer(compressed_diff)
    checksum = _checksum_value(checksum)
    return _decode_into_outputs(
        s, outs, lambda views: _ext.decompress_tensors_into([v.buf for v in s], payload,
                                                            checksum, views, int(threads)))


def _decode_into_outputs(sources, outs, decode):
    """Runs ``decode(views)`` into writable views of ``outs`` (checked against the
    sources' count), or of new outputs mirroring the sources, which it returns."""
    if outs is not None:
        outs = list(outs)
        if len(outs) != len(sources):
            raise ValueError(f"srcs holds {len(sources)} tensors but outs {len(outs)}")
        decode([_writable_u16(o, f"outs[{i}]") for i, o in enumerate(outs)])
        return outs
    results = []
    for v in sources:
        if v.kind == "raw":
            results.append(bytearray(v.buf.nbytes))
        else:
            results.append(np.empty(v.shape, dtype=np.int16 if v.kind == "torch" else v.buf.dtype))
    decode(results)
    for i, v in enumerate(sources):
        if v.kind == "raw":
            results[i] = bytes(results[i])
        elif v.kind == "torch":
            torch = _torch_module(v.obj)
            results[i] = torch.from_numpy(results[i]).view(torch.bfloat16)
    return results


class Session:
    """Stateful coding of a sequence of steps (arc_v3::Session): smaller payloads than
    delta_compress, because the coder also knows which weights changed in earlier steps.

    Both sides keep one Session (for one tensor, or for a group of tensors or a whole
    model) and call it for every step in the same order: the sender ``compress`` /
    ``compress_tensors``, the receiver ``decompress`` / ``decompress_tensors``. Each
    payload names the base and the history it was made with: a receiver with the wrong
    base gets ArcV3Error ``wrong_base``, one that missed or repeated a step
    ``history_mismatch`` -- never wrong weights -- and its state is unchanged by a
    failed step. Session payloads decode only through a Session.
    """

    def __init__(self, *, threads=0, effort=None, chunk_elements=None):
        self._session = _ext.Session(
            _ext.DEFAULT_EFFORT if effort is None else int(effort), int(threads),
            _ext.DEFAULT_CHUNK_ELEMENTS if chunk_elements is None else int(chunk_elements))

    @property
    def steps(self):
        """Steps coded or decoded so far."""
        return self._session.steps

    @property
    def history_id(self):
        """Identity of the history; equal on both sides while they are in step."""
        return self._session.history_id

    def reset(self):
        """Forgets the history (both sides must reset together)."""
        self._session.reset()

    def compress(self, src, dst):
        """One step of one tensor: (compressed_diff: bytes, checksum: int)."""
        s = _Values(src, "src")
        d = _Values(dst, "dst")
        _check_same_shape(s, d, "src", "dst")
        return self._session.compress(s.buf, d.buf)

    def decompress(self, src, compressed_diff, checksum, *, out=None):
        """Rebuilds one step's tensor; ``out`` as for delta_decompress_tensors (``out=src``
        applies in place). Returns ``out`` or a new object mirroring src."""
        s = _Values(src, "src")
        payload = _payload_buffer(compressed_diff)
        checksum = _checksum_value(checksum)
        result = _decode_into_outputs(
            [s], None if out is None else [out],
            lambda views: self._session.decompress_into(s.buf, payload, checksum, views[0]))
        return result[0]

    def compress_tensors(self, srcs, dsts):
        """One step of a group of tensors (as delta_compress_tensors)."""
        s, d = _value_pairs(srcs, dsts)
        return self._session.compress_tensors([v.buf for v in s], [v.buf for v in d])

    def decompress_tensors(self, srcs, compressed_diff, checksum, *, outs=None):
        """Rebuilds one step's group of tensors, all or none (as delta_decompress_tensors)."""
        s = [_Values(v, f"srcs[{i}]") for i, v in enumerate(srcs)]
        payload = _payload_buffer(compressed_diff)
        checksum = _checksum_value(checksum)
        return _decode_into_outputs(
            s, outs, lambda views: self._session.decompress_tensors_into(
                [v.buf for v in s], payload, checksum, views))


def payload_info(compressed_diff):
    """What a payload's header says, without decoding it: format_version, element_count,
    chunk_elements, chunk_count, tensor_count (of a delta_compress_tensors group, else 1),
    session (made by a Session), continues (a session payload whose base and tensors are
    those of its session's last step, not repeated in it, so a group's tensor_count is 0).
    Untrusted until delta_decompress verified the result."""
    return _ext.inspect(_payload_buffer(compressed_diff))


def checksum(values):
    """XXH3-64 (seed 0) of BF16 values' bytes: the checksum delta_compress returns."""
    return _ext.xxh3_64(_Values(values, "values").buf)


from arc_v3._dicts import (  # noqa: E402
    delta_compress_dicts, delta_decompress_dicts, delta_dicts_info)
from arc_v3 import sync  # noqa: E402,F401  (arc_v3.sync.Publisher / Follower)
