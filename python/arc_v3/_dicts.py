"""State-dict helpers: one bytes object for a whole model update.

Framing (version 1, all integers little-endian). A stop-gap until the CLI's delta
container (src/cli/) is available to Python; these helpers should then switch to it.

    offset  size  field
    0       8     magic b"ARC3DICT"
    8       4     framing version (1)
    12      4     reserved, 0
    16      8     H: header length in bytes
    24      8     XXH3-64 (seed 0) of the header bytes
    32      H     header: UTF-8 JSON {"entries": [entry, ...]}
    32+H    ...   blobs; each entry's "offset" counts from here

    entry = {"name": str, "dtype": torch dtype name without "torch.", e.g. "bfloat16",
             "shape": [int, ...], "method": see below, "offset": int, "length": int,
             "checksum": XXH3-64 of the new tensor's bytes (C order, little endian)}

    method      blob                                       base needed
    "arc_v3"    arc_v3 payload (BF16 only)                 yes, same dtype and shape
    "xor_zlib"  zlib(base bytes XOR new bytes)             yes, same dtype and shape
    "zlib"      zlib(new bytes)                            no
    "raw"       new bytes                                  no

A base is used when the previous state dict holds a tensor of the same name, dtype and
shape; otherwise the tensor is sent whole ("zlib" if that is smaller, else "raw"). Every
tensor is verified against its checksum on decode (arc_v3 payloads by the codec).
"""

import collections
import json
import struct
import zlib

import numpy as np

from arc_v3 import _arc_v3 as _ext
from arc_v3._errors import ArcV3Error

_MAGIC = b"ARC3DICT"
_FRAMING_VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ")  # magic, version, reserved, header length, header hash
_CODES = {name: code for code, name in _ext.ERROR_NAMES.items()}


def _error(name, message):
    return ArcV3Error(_CODES[name], name, message)


def _torch():
    import torch  # only the dict helpers need torch; importing arc_v3 must not
    return torch


def _bytes_view(tensor):
    """The tensor's values as a flat numpy uint8 array (no copy when contiguous)."""
    torch = _torch()
    t = tensor.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _dtype_from_name(torch, name):
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise _error("corrupt_header", f"unknown dtype {name!r}")
    return dtype


def _check_tensor(torch, name, value, which):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{which}[{name!r}] is a {type(value).__name__}, not a torch.Tensor")
    if value.device.type != "cpu":
        raise ValueError(f"{which}[{name!r}] is on {value.device}; move it to the CPU first")


def delta_compress_dicts(prev_state_dict, next_state_dict, *, compression_format="arc_v3",
                         threads=0, zlib_level=6):
    """Encodes next_state_dict as a delta against prev_state_dict (any dtypes).

    BF16 tensors go through the arc_v3 codec (in `compression_format`), other dtypes
    through XOR + zlib; tensors without a matching base (new name, other dtype or shape)
    are stored whole. Keys that are only in prev_state_dict are dropped (the decoded dict
    has next's keys, in order).

    Returns:
        bytes in the framing described in this module's docstring.
    """
    from arc_v3 import _format_id  # the package's one table of format names
    fmt = _format_id(compression_format)
    torch = _torch()
    entries, blobs, offset = [], [], 0
    for name, new in next_state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"state dict keys must be str, got {type(name).__name__}")
        _check_tensor(torch, name, new, "next_state_dict")
        base = prev_state_dict.get(name)
        if base is not None:
            _check_tensor(torch, name, base, "prev_state_dict")
            if base.dtype != new.dtype or tuple(base.shape) != tuple(new.shape):
                base = None
        new_bytes = _bytes_view(new)
        if base is not None and new.dtype == torch.bfloat16:
            s = base.detach().contiguous().view(torch.int16).numpy()
            d = new_bytes.view(np.int16)
            blob, checksum = _ext.compress(s, d, fmt, _ext.DEFAULT_EFFORT,
                                           int(threads), _ext.DEFAULT_CHUNK_ELEMENTS)
            method = "arc_v3"
        else:
            checksum = _ext.xxh3_64(new_bytes)
            if base is not None:
                blob = zlib.compress(np.bitwise_xor(_bytes_view(base), new_bytes).data,
                                     zlib_level)
                method = "xor_zlib"
            else:
                blob = zlib.compress(new_bytes.data, zlib_level)
                method = "zlib"
                if len(blob) >= new_bytes.nbytes:
                    blob, method = new_bytes.tobytes(), "raw"
        entries.append({
            "name": name,
            "dtype": _dtype_name(new.dtype),
            "shape": list(new.shape),
            "method": method,
            "offset": offset,
            "length": len(blob),
            "checksum": checksum,
        })
        blobs.append(blob)
        offset += len(blob)
    header = json.dumps({"entries": entries}, separators=(",", ":")).encode("utf-8")
    prefix = _PREFIX.pack(_MAGIC, _FRAMING_VERSION, 0, len(header), _ext.xxh3_64(header))
    return b"".join([prefix, header] + blobs)


def _parse(delta_bytes):
    view = memoryview(delta_bytes).cast("B")
    if view.nbytes < _PREFIX.size:
        if bytes(view[:len(_MAGIC)]) != _MAGIC[:min(view.nbytes, len(_MAGIC))]:
            raise _error("bad_magic", "not an arc_v3 state-dict delta")
        raise _error("truncated", f"{view.nbytes} bytes is shorter than the framing prefix")
    magic, version, reserved, header_len, header_hash = _PREFIX.unpack_from(view)
    if magic != _MAGIC:
        raise _error("bad_magic", "not an arc_v3 state-dict delta")
    if version > _FRAMING_VERSION:
        raise _error("unsupported_version", f"framing version {version} is newer than "
                                            f"{_FRAMING_VERSION}")
    if version != _FRAMING_VERSION or reserved != 0:
        raise _error("reserved_bits_set" if reserved else "unsupported_version",
                     f"framing version {version}, reserved field {reserved}")
    if header_len > view.nbytes - _PREFIX.size:
        raise _error("truncated", "header extends past the end of the data")
    header = view[_PREFIX.size:_PREFIX.size + header_len]
    if _ext.xxh3_64(header) != header_hash:
        raise _error("corrupt_header", "header does not match its checksum")
    try:
        entries = json.loads(bytes(header).decode("utf-8"))["entries"]
    except (ValueError, KeyError, TypeError) as e:
        raise _error("corrupt_header", f"header is not valid JSON framing: {e}") from None
    return entries, view[_PREFIX.size + header_len:]


def delta_decompress_dicts(prev_state_dict, delta_bytes, *, threads=0):
    """Rebuilds the next state dict from prev_state_dict and delta_compress_dicts' bytes.

    Returns:
        an OrderedDict of new CPU tensors (prev_state_dict is not modified).

    Raises:
        ArcV3Error: corrupt or truncated bytes, a missing or mismatched base tensor
            (invalid_argument / size_mismatch), or a checksum mismatch (wrong base).
    """
    torch = _torch()
    entries, blobs = _parse(delta_bytes)
    result = collections.OrderedDict()
    for entry in entries:
        try:
            name, method = entry["name"], entry["method"]
            dtype = _dtype_from_name(torch, entry["dtype"])
            shape = tuple(int(n) for n in entry["shape"])
            offset, length, checksum = int(entry["offset"]), int(entry["length"]), \
                int(entry["checksum"])
        except (KeyError, TypeError, ValueError) as e:
            raise _error("corrupt_header", f"bad entry {entry!r}: {e}") from None
        if offset < 0 or length < 0 or offset + length > blobs.nbytes:
            raise _error("truncated", f"tensor {name!r}: data extends past the end")
        if any(n < 0 for n in shape):
            raise _error("corrupt_header", f"tensor {name!r}: negative shape {shape}")
        blob = blobs[offset:offset + length]
        new = torch.empty(shape, dtype=dtype)
        out = new.reshape(-1).view(torch.uint8).numpy()
        base = None
        if method in ("arc_v3", "xor_zlib"):
            base = prev_state_dict.get(name)
            if base is None:
                raise _error("invalid_argument", f"prev_state_dict has no tensor {name!r}, "
                                                 "which this delta is based on")
            _check_tensor(torch, name, base, "prev_state_dict")
            if base.dtype != dtype or tuple(base.shape) != shape:
                raise _error("size_mismatch",
                             f"tensor {name!r}: the delta is based on {entry['dtype']} "
                             f"{list(shape)}, prev_state_dict holds {base.dtype} "
                             f"{list(base.shape)}")
        if method == "arc_v3":
            if dtype != torch.bfloat16:
                raise _error("corrupt_header", f"tensor {name!r}: arc_v3 needs bfloat16")
            s = base.detach().contiguous().view(torch.int16).numpy()
            try:
                _ext.decompress_into(s, blob, checksum, out.view(np.int16), int(threads))
            except ArcV3Error as e:
                raise ArcV3Error(e.code, e.name, f"tensor {name!r}: {e.message}") from None
        else:
            if method == "raw":
                data = blob
            elif method in ("zlib", "xor_zlib"):
                try:
                    data = zlib.decompress(blob)
                except zlib.error as e:
                    raise _error("codec_failure", f"tensor {name!r}: {e}") from None
            else:
                raise _error("corrupt_header", f"tensor {name!r}: unknown method {method!r}")
            if len(data) != out.nbytes:
                raise _error("corrupt_chunk", f"tensor {name!r}: {len(data)} bytes decoded, "
                                              f"{out.nbytes} expected")
            data = np.frombuffer(data, dtype=np.uint8)
            if method == "xor_zlib":
                np.bitwise_xor(_bytes_view(base), data, out=out)
            else:
                out[...] = data
            if _ext.xxh3_64(out) != checksum:
                raise _error("checksum_mismatch",
                             f"tensor {name!r} does not match its checksum: wrong base "
                             "(prev_state_dict) or corrupt data")
        result[name] = new
    return result

