"""State-dict helpers: one bytes object for a whole model update.

The bytes are the CLI's checkpoint delta container (src/FORMAT.md, Part 2; magic b"A3DC"),
exactly what `arc_v3 diff prev.safetensors next.safetensors` writes, so the CLI reads them
too (`arc_v3 apply`, `arc_v3 verify`, `arc_v3 inspect`). Each state dict is serialised as
one safetensors file:

    8 bytes   N: header length, u64 little-endian
    N bytes   JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...},
              padded with spaces to a multiple of 8 bytes; names in the dict's order
    ...       tensor data (C order, little endian), tensors in sorted-name order, each
              starting at a multiple of 8 bytes (zero padding between them)

torch dtype -> safetensors: bfloat16 BF16, float16 F16, float32 F32, float64 F64, int8 I8,
int16 I16, int32 I32, int64 I64, uint8 U8, bool BOOL (others raise TypeError).

The container then describes next against prev: per tensor, row-block pieces with the
XXH3-64 of their base and target rows. BF16 tensors with a base of the same dtype and shape
are arc_v3 payloads, those under 2^20 elements with under 16,384 changes coded together in
groups (one payload for many norms and biases); other dtypes the XOR with the base through
zstd; tensors that are new, or whose dtype or shape changed, are carried whole; tensors
only in prev are listed as removed. Decoding checks every base against its checksum, and
every target.

The container's C++ diff/apply (src/checkpoint/checkpoint_delta.h) work on files: the helpers
write the safetensors files and the container into a private temporary directory (under
$TMPDIR, deleted afterwards) and call them through the extension with the GIL released.
Peak disk use is about the size of both state dicts plus the delta.
"""

import collections
import json
import os
import tempfile

from arc_v3 import _arc_v3 as _ext
from arc_v3._errors import ArcV3Error

_ALIGNMENT = 8  # every tensor's data starts 8-byte aligned (as the header's end is)
_PREV, _NEXT, _DELTA, _OUT = "prev.safetensors", "next.safetensors", "delta.a3dc", \
    "out.safetensors"
# Where the temporary files go in error messages, as the caller knows them.
_PUBLIC_NAMES = {_PREV: "prev_state_dict", _NEXT: "next_state_dict", _DELTA: "delta_bytes",
                 _OUT: "next state dict"}
_ST_DTYPES = {  # torch dtype name -> safetensors dtype
    "bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
    "bool": "BOOL",
}
_TORCH_DTYPES = {st: name for name, st in _ST_DTYPES.items()}
_CODES = {name: code for code, name in _ext.ERROR_NAMES.items()}


def _error(name, message):
    return ArcV3Error(_CODES[name], name, message)


def _torch():
    import torch  # only the dict helpers need torch; importing arc_v3 must not
    return torch


def _check_tensor(torch, name, value, which):
    if not isinstance(name, str):
        raise TypeError(f"{which} keys must be str, got {type(name).__name__}")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{which}[{name!r}] is a {type(value).__name__}, not a torch.Tensor")
    if value.device.type != "cpu":
        raise ValueError(f"{which}[{name!r}] is on {value.device}; move it to the CPU first")
    st_dtype = _ST_DTYPES.get(str(value.dtype).replace("torch.", ""))
    if st_dtype is None:
        raise TypeError(f"{which}[{name!r}] has dtype {value.dtype}, which safetensors (and "
                        f"so the delta container) cannot hold; supported: "
                        f"{', '.join(_ST_DTYPES)}")
    return st_dtype


def _write_safetensors(torch, state_dict, path, which, base=False):
    """Writes `state_dict` as one safetensors file (layout in this module's docstring).
    `base`: tensors of dtypes safetensors cannot hold are left out (they cannot be the
    base of anything the container carries) instead of raising TypeError."""
    dtypes = {}
    for name, value in state_dict.items():
        if base and isinstance(value, torch.Tensor) and \
                str(value.dtype).replace("torch.", "") not in _ST_DTYPES:
            continue
        dtypes[name] = _check_tensor(torch, name, value, which)
    state_dict = {name: state_dict[name] for name in dtypes}
    offsets, at = {}, 0
    for name in sorted(state_dict):
        at += -at % _ALIGNMENT
        size = state_dict[name].numel() * state_dict[name].element_size()
        offsets[name] = (at, at + size)
        at += size
    header = json.dumps(
        {name: {"dtype": dtypes[name], "shape": list(state_dict[name].shape),
                "data_offsets": list(offsets[name])} for name in state_dict},
        separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % _ALIGNMENT)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        written = 0
        for name in sorted(state_dict):
            begin, end = offsets[name]
            f.write(b"\0" * (begin - written))
            t = state_dict[name].detach()
            if not t.is_contiguous():
                t = t.contiguous()
            if end > begin:
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)
            written = end


def _read_safetensors(torch, path):
    """The tensors of a safetensors file written by _write_safetensors (and rebuilt by
    the container), in its header's order, each in its own new memory."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len).decode("utf-8"),
                            object_pairs_hook=collections.OrderedDict)
        result = collections.OrderedDict()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = getattr(torch, _TORCH_DTYPES[info["dtype"]])
            tensor = torch.empty(tuple(info["shape"]), dtype=dtype)
            begin, end = info["data_offsets"]
            target = tensor.reshape(-1).view(torch.uint8).numpy()
            if target.nbytes != end - begin:
                raise _error("corrupt_header", f"tensor {name!r}: {end - begin} bytes for "
                                               f"{target.nbytes}")
            f.seek(8 + header_len + begin)
            if end > begin and f.readinto(target.data) != target.nbytes:
                raise _error("truncated", f"tensor {name!r}: data extends past the end")
            result[name] = tensor
    return result


def _public_error(error, directory):
    """`error` with the temporary paths in its message replaced by the caller's names."""
    message = error.message
    for file_name, public in _PUBLIC_NAMES.items():
        message = message.replace(os.path.join(directory, file_name), public)
    return ArcV3Error(error.code, error.name, message.replace(directory + os.sep, ""))


def delta_compress_dicts(prev_state_dict, next_state_dict, *, compression_format="arc_v3",
                         threads=0):
    """Encodes next_state_dict as a delta against prev_state_dict (any safetensors dtype).

    BF16 tensors go through the arc_v3 codec (in `compression_format`), other dtypes
    through XOR + zstd; tensors without a matching base (new name, other dtype or shape)
    are carried whole. Keys that are only in prev_state_dict are recorded as removed (the
    decoded dict has next's keys, in order).

    Returns:
        bytes: a checkpoint delta container (src/FORMAT.md, Part 2; starts with b"A3DC"),
        as `arc_v3 diff` would write for the two dicts saved as safetensors files.

    Raises:
        TypeError / ValueError: non-str keys, non-tensors, non-CPU tensors, dtypes
            safetensors cannot hold (e.g. complex), unknown compression_format.
        ArcV3Error: the container could not be built (e.g. no space in $TMPDIR).
    """
    from arc_v3 import _format_id  # the package's one table of format names
    fmt = _format_id(compression_format)
    torch = _torch()
    with tempfile.TemporaryDirectory(prefix="arc_v3-dicts-") as directory:
        paths = {n: os.path.join(directory, n) for n in (_PREV, _NEXT, _DELTA)}
        _write_safetensors(torch, prev_state_dict, paths[_PREV], "prev_state_dict",
                           base=True)
        _write_safetensors(torch, next_state_dict, paths[_NEXT], "next_state_dict")
        try:
            _ext.checkpoint_diff(paths[_PREV], paths[_NEXT], paths[_DELTA], fmt,
                                 _ext.CONTAINER_EFFORT, int(threads))
        except ArcV3Error as e:
            raise _public_error(e, directory) from None
        with open(paths[_DELTA], "rb") as f:
            return f.read()


def delta_dicts_info(delta_bytes):
    """What a container's manifest says, checked (header and manifest checksums, JSON
    rules) but without decoding any piece:

        {"layout": "file" or "directory", "container_version": 1 or 2 (2: with groups),
         "removed_tensors": [name, ...],
         "tensors": [{"name", "kind": "delta"/"added"/"reshaped", "dtype": e.g. "BF16",
                      "shape": tuple, "coders": [coder of each piece, e.g. "arc_v3"],
                      "group": index of the group coding it whole, or None}]}
    """
    return _ext.container_manifest(memoryview(delta_bytes).cast("B"))


def delta_decompress_dicts(prev_state_dict, delta_bytes, *, threads=0):
    """Rebuilds the next state dict from prev_state_dict and delta_compress_dicts' bytes
    (or any single-file checkpoint delta container, e.g. from `arc_v3 diff`).

    Returns:
        an OrderedDict of new CPU tensors (prev_state_dict is not modified).

    Raises:
        ArcV3Error: corrupt or truncated bytes (bad_magic, truncated, corrupt_header,
            corrupt_chunk, ...); a wrong base (checksum_mismatch naming the tensor): a
            tensor the delta is based on is missing from prev_state_dict, has another
            dtype or shape, or other values; invalid_argument for a delta of a sharded
            checkpoint directory.
    """
    torch = _torch()
    delta = memoryview(delta_bytes).cast("B")
    magic = _ext.CONTAINER_MAGIC
    if bytes(delta[:len(magic)]) != magic[:min(delta.nbytes, len(magic))]:
        raise _error("bad_magic", "not a checkpoint delta container (magic b'A3DC')")
    with tempfile.TemporaryDirectory(prefix="arc_v3-dicts-") as directory:
        paths = {n: os.path.join(directory, n) for n in (_PREV, _DELTA, _OUT)}
        _write_safetensors(torch, prev_state_dict, paths[_PREV], "prev_state_dict",
                           base=True)
        with open(paths[_DELTA], "wb") as f:
            f.write(delta)
        try:
            _ext.checkpoint_apply(paths[_PREV], paths[_DELTA], paths[_OUT], int(threads))
        except ArcV3Error as e:
            raise _public_error(e, directory) from None
        try:
            return _read_safetensors(torch, paths[_OUT])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # The container checked the header bytes against their checksum, so this is
            # a container from another writer whose target is not a plain safetensors file.
            raise _error("corrupt_header", f"the delta's target is not a safetensors file "
                                           f"this package reads: {e}") from None
