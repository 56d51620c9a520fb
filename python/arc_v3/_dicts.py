"""State-dict helpers: one bytes object for a whole model update.

The bytes are the CLI's checkpoint delta container (src/checkpoint/FORMAT.md; magic b"A3DC"):
the delta between the two dicts as single safetensors files (tensors in the dict's order,
back to back, under the header safetensors' own writer would give them), so the CLI reads
them too (`arc_v3 apply`, `arc_v3 verify`, `arc_v3 inspect`) with such a file as PREV.

torch dtype -> safetensors: bfloat16 BF16, float16 F16, float32 F32, float64 F64, int8 I8,
int16 I16, int32 I32, int64 I64, uint8 U8, bool BOOL (others raise TypeError).

The container describes next against prev: per tensor, row-block pieces with the XXH3-64
of their base and target rows. BF16 tensors with a base of the same dtype and shape are
arc_v3 payloads, those under 2^20 elements with under 16,384 changes coded together in
groups (one payload for many norms and biases); other dtypes the XOR with the base through
zstd; tensors that are new, or whose dtype or shape changed, are carried whole; tensors
only in prev are listed as removed. Decoding checks every base against its checksum, and
every target.

Both directions work on the tensors' memory directly (the container's in-memory diff and
staged apply, with the GIL released): no temporary files, no copy of the inputs.
"""

import collections

from arc_v3 import _arc_v3 as _ext
from arc_v3._errors import ArcV3Error

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


def _entries(torch, state_dict, which, base=False):
    """(name, safetensors dtype, shape, bytes view) of each tensor, in the dict's order.
    `base`: tensors of dtypes safetensors cannot hold are left out (they cannot be the
    base of anything the container carries) instead of raising TypeError."""
    entries = []
    for name, value in state_dict.items():
        if base and isinstance(value, torch.Tensor) and \
                str(value.dtype).replace("torch.", "") not in _ST_DTYPES:
            continue
        dtype = _check_tensor(torch, name, value, which)
        t = value.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        entries.append((name, dtype, list(value.shape), t.reshape(-1).view(torch.uint8).numpy()))
    return entries


def delta_compress_dicts(prev_state_dict, next_state_dict, *, compression_format="arc_v3",
                         threads=0):
    """Encodes next_state_dict as a delta against prev_state_dict (any safetensors dtype).

    BF16 tensors go through the arc_v3 codec (in `compression_format`), other dtypes
    through XOR + zstd; tensors without a matching base (new name, other dtype or shape)
    are carried whole. Keys that are only in prev_state_dict are recorded as removed (the
    decoded dict has next's keys, in order).

    Returns:
        bytes: a checkpoint delta container (src/checkpoint/FORMAT.md; starts with b"A3DC"),
        as `arc_v3 diff` would write for the two dicts saved as safetensors files.

    Raises:
        TypeError / ValueError: non-str keys, non-tensors, non-CPU tensors, dtypes
            safetensors cannot hold (e.g. complex), unknown compression_format.
        ArcV3Error: the container could not be built (e.g. out of memory).
    """
    from arc_v3 import _format_id  # the package's one table of format names
    fmt = _format_id(compression_format)
    torch = _torch()
    prev = _entries(torch, prev_state_dict, "prev_state_dict", base=True)
    nxt = _entries(torch, next_state_dict, "next_state_dict")
    return _ext.dicts_diff(prev, nxt, fmt, _ext.DEFAULT_EFFORT, int(threads))


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
    prev = _entries(torch, prev_state_dict, "prev_state_dict", base=True)
    made = {}

    def allocate(name, dtype, shape):
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {dtype}, which torch cannot hold")
        made[name] = torch.empty(tuple(shape), dtype=getattr(torch, _TORCH_DTYPES[dtype]))
        return made[name].reshape(-1).view(torch.uint8).numpy()

    result = collections.OrderedDict()
    for name, dtype, shape in _ext.dicts_apply(prev, delta, allocate, int(threads)):
        if name not in made:  # a tensor without bytes has no piece
            if dtype not in _TORCH_DTYPES:
                raise _error("corrupt_header", f"tensor {name!r}: dtype {dtype} torch cannot hold")
            made[name] = torch.empty(tuple(shape), dtype=getattr(torch, _TORCH_DTYPES[dtype]))
        result[name] = made[name]
    return result
