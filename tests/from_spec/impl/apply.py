"""Applying containers to a shard's tensors (src/checkpoint/FORMAT.md, "Applying a
container", "Partial apply"), the result checksum (PROTOCOL.md, "Documents"), and the
files a pull writes (PROTOCOL.md, "What DIR holds")."""
import json
import struct

from . import container as ctr
from .errors import fail
from .hashing import xxh3

GROUPABLE_MAX = 1 << 20  # "BF16 with 1 to 2^20 - 1 elements" (PROTOCOL.md, Partial pulls)


class Held:
    """What a region holds of one tensor: rows [lo, hi) of dtype/shape, as bytes."""

    def __init__(self, dtype, shape, lo, hi, data, row_bytes):
        self.dtype, self.shape, self.lo, self.hi = dtype, list(shape), lo, hi
        self.data, self.row_bytes = data, row_bytes

    def rows(self, r0, r1):
        return self.data[(r0 - self.lo) * self.row_bytes:(r1 - self.lo) * self.row_bytes]


def result_checksum(shape, esize, data):
    """checkpoint::TensorChecksum: blocks of max(1, floor(2^21 / E)) rows, XXH3 of the
    blocks' XXH3s (PROTOCOL.md, "Documents", Result checksum)."""
    if not data:
        return xxh3(b"")
    rows = shape[0] if shape else 1
    e = 1
    for x in shape[1:]:
        e *= x
    per = max(1, (1 << 21) // e)
    row_bytes = e * esize
    hs = []
    for r in range(0, rows, per):
        hs.append(xxh3(data[r * row_bytes:min(r + per, rows) * row_bytes]))
    return xxh3(struct.pack("<%dQ" % len(hs), *hs))


def groupable(t):
    """Grouped in this container, or BF16 with 1 to 2^20 - 1 elements."""
    return t.group is not None or (t.dtype == "BF16" and 1 <= t.elements < GROUPABLE_MAX)


def _base(prev, t, r0, r1):
    """Base rows [r0, r1) of delta tensor t: the held tensor of its name, same dtype and
    shape, holding those rows; else a wrong base (`checksum_mismatch`)."""
    h = prev.get(t.name)
    if h is None:
        fail("checksum_mismatch", "no base tensor %r" % t.name)
    if h.dtype != t.dtype or h.shape != t.shape:
        fail("checksum_mismatch", "base tensor %r has another dtype or shape" % t.name)
    if not (h.lo <= r0 and r1 <= h.hi):
        fail("checksum_mismatch", "base rows of %r do not suffice" % t.name)
    return h.rows(r0, r1)


def apply_file(f, fetch, prev, need=None):
    """Decode File `f` of a container onto `prev` (name -> Held).  `fetch(offset, size)`
    returns stored bytes of the data section.  `need(t)`: None for a full apply, else per
    tensor None (nothing) or rows (r0, r1), already rounded to whole pieces.  Returns
    (name -> Held, file bytes or None)."""
    out = {}
    groups_done = set()
    for t in f.tensors:
        rng = (0, t.rows) if need is None else need(t)
        if rng is None:
            continue
        if t.nbytes == 0:
            out[t.name] = Held(t.dtype, t.shape, 0, t.rows, b"", t.row_bytes)
            continue
        if t.group is not None:
            if t.group in groups_done:
                continue
            groups_done.add(t.group)
            g = f.groups[t.group]
            bases = [_base(prev, m, 0, m.rows) for m in g.members]
            what = "group %d of %s" % (t.group, f.name)
            datas = ctr.decode_group(g, fetch(g.offset, g.size), bases, what)
            for m, d in zip(g.members, datas):
                out[m.name] = Held(m.dtype, m.shape, 0, m.rows, d, m.row_bytes)
            continue
        r0, r1 = rng
        parts = []
        lo = hi = None
        for p in t.pieces:
            if p.r1 <= r0 or p.r0 >= r1:
                continue
            base = _base(prev, t, p.r0, p.r1) if t.kind == "delta" else None
            what = "%s rows %d:%d" % (t.name, p.r0, p.r1)
            parts.append(ctr.decode_piece(p, fetch(p.offset, p.size), base, t.esize, what))
            lo = p.r0 if lo is None else lo
            hi = p.r1
        if lo is not None:
            out[t.name] = Held(t.dtype, t.shape, lo, hi, b"".join(parts), t.row_bytes)
    if need is not None:
        return out, None
    # the whole file: header piece, tensors at data_start + data_offset, fills ("File")
    buf = bytearray(f.size)
    buf[0:f.data_start] = ctr.decode_piece(f.header, fetch(f.header.offset, f.header.size),
                                           None, 1, "%s header" % f.name)
    for t in f.tensors:
        if t.nbytes:
            at = f.data_start + t.data_offset
            buf[at:at + t.nbytes] = out[t.name].data
    if f.fills:
        fill = ctr.decode_piece(f.fill, fetch(f.fill.offset, f.fill.size), None, 1,
                                "%s fill" % f.name)
        at = 0
        for off, ln in f.fills:
            buf[off:off + ln] = fill[at:at + ln]
            at += ln
    return out, bytes(buf)


def partial_file(tensors, held, lo_sel, hi_sel):
    """A partial pull's file ("What DIR holds"): the matching tensors `tensors` (container
    Tensor entries, in data-section order) cut to rows [min(A, rows), min(B, rows)) (a
    rank-0 tensor whole), safetensors metadata arc_v3_rows = "A:B" ("A:" without B).
    The bytes: compact JSON, this key order, spaces to a multiple of 8 ("What DIR holds")."""
    header = {"__metadata__": {"arc_v3_rows": "%d:%s" % (lo_sel, "" if hi_sel is None else hi_sel)}}
    blobs = []
    at = 0
    for t in tensors:
        if not t.shape:
            a, b = 0, 1
            shape = []
        else:
            a = min(lo_sel, t.rows)
            b = t.rows if hi_sel is None else min(hi_sel, t.rows)
            b = max(a, b)
            shape = [b - a] + list(t.shape[1:])
        data = b""
        if b > a and t.nbytes:
            data = held[t.name].rows(a, b)
        header[t.name] = {"dtype": t.dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)
