"""Checkpoint delta containers, versions 1 and 2 (src/checkpoint/FORMAT.md).

`read_head(head, object_size)` validates the header and manifest; `decode_piece` and
`decode_group` turn stored bytes into target bytes; `rebuild_file` writes a whole file."""
import struct

import numpy as np
import zstandard

from . import payload as arc_payload
from .errors import ArcError, fail
from .hashing import xxh3
from .jsonstrict import Obj, is_u64, loads

MAGIC = b"A3DC"
HEADER_SIZE = 40
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
CODERS = ("stored", "zstd", "zstd-planes", "arc_v3")
U64_MAX = (1 << 64) - 1


class Piece:
    """A Piece ("Piece"): rows [r0, r1), stored bytes at data-section [offset, offset+size)."""


class Tensor:
    """A Tensor ("Tensor")."""


class Group:
    """A Group ("Group (version 2)")."""


class File:
    """A File ("File")."""


class Container:
    pass


def plain_name(name):
    """File `name`: non-empty, no `/`, no NUL, not `.` or `..` ("File")."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


# ---------------------------------------------------------------- header ("Header")

def parse_header(head, object_size):
    """The 40-byte header, checked in the order "Header" gives; returns (version, M, D)."""
    if object_size < HEADER_SIZE or len(head) < HEADER_SIZE:
        fail("truncated", "container shorter than its header")
    if bytes(head[:4]) != MAGIC:
        fail("bad_magic", "container magic")
    version, flags, m, mx, d, hx = struct.unpack_from("<HHQQQQ", head, 4)
    if version not in (1, 2):
        fail("unsupported_version", "container version %d" % version)
    if xxh3(bytes(head[:32])) != hx:
        fail("corrupt_header", "Header_XXH3")  # "Errors"
    if flags:
        fail("reserved_bits_set", "container Flags")
    total = HEADER_SIZE + m + d
    if object_size < total:
        fail("truncated", "container shorter than 40 + M + D")
    if object_size > total:
        fail("corrupt_header", "bytes after the data section")
    return version, m, d, mx


def _decode_manifest(stored):
    """One zstd frame with Frame_Content_Size, bounded ("Manifest")."""
    m = len(stored)
    try:
        params = zstandard.get_frame_parameters(stored)
    except zstandard.ZstdError as e:
        fail("corrupt_header", "manifest is not a zstd frame: %s" % e)
    size = params.content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN or size == zstandard.CONTENTSIZE_ERROR:
        fail("corrupt_header", "manifest frame without Frame_Content_Size")
    if params.window_size > 1 << 23:
        fail("corrupt_header", "manifest window above 2^23")
    if size > 1 << 30 or (size > 1 << 24 and size > 256 * m):
        fail("corrupt_header", "manifest too large")
    try:
        d = zstandard.ZstdDecompressor(max_window_size=1 << 23).decompressobj()
        out = d.decompress(stored)
        ok = d.eof and not d.unused_data
    except zstandard.ZstdError as e:
        fail("corrupt_header", "manifest does not decode: %s" % e)
    if not ok or len(out) != size:
        fail("corrupt_header", "manifest does not decode to its content size")
    return out


def read_head(head, object_size):
    """Header and manifest from `head` (at least bytes [0, 40 + M) of the object)."""
    version, m, d, mx = parse_header(head, object_size)
    if len(head) < HEADER_SIZE + m:
        fail("truncated", "head shorter than 40 + M")
    stored = bytes(head[HEADER_SIZE:HEADER_SIZE + m])
    if xxh3(stored) != mx:
        fail("corrupt_header", "Manifest_XXH3")  # "Errors"
    c = Container()
    c.version = version
    c.manifest_size = m
    c.data_size = d
    c.head_size = HEADER_SIZE + m
    _parse_manifest(c, loads(_decode_manifest(stored), what="manifest"))
    return c


# ---------------------------------------------------------------- manifest ("Manifest")

def _u64(o, k):
    return o.u64(k)


def _pair(o, k, v):
    if not isinstance(v, list) or len(v) != 2 or not all(is_u64(x) for x in v):
        o.bad("%r is not a pair of u64" % k)
    return v


def _piece(c, value, what, out_bytes, row_bytes, tensor=None):
    """A Piece object; `out_bytes(r0, r1)` is what its rows produce."""
    o = Obj(value, what)
    p = Piece()
    p.r0, p.r1 = _pair(o, "rows", o.get("rows"))
    p.offset = _u64(o, "offset")
    p.size = _u64(o, "size")
    if p.offset + p.size > c.data_size:
        o.bad("stored bytes past the data section")
    p.coder = o.str_("coder")
    if p.coder not in CODERS:
        o.bad("unknown coder %r" % p.coder)
    p.xxh3 = o.hex("xxh3")
    is_delta = tensor is not None and tensor.kind == "delta"
    p.base_xxh3 = o.hex("base_xxh3") if is_delta else None
    p.target_xxh3 = o.hex("target_xxh3")
    p.changed = None
    if p.coder != "arc_v3":
        p.changed = _u64(o, "changed")
    o.done()
    if p.r0 >= p.r1:
        o.bad("empty rows")
    n = out_bytes(p.r0, p.r1)
    p.nbytes = n
    if p.coder == "arc_v3":
        if not is_delta or tensor.dtype != "BF16":
            o.bad("arc_v3 piece outside a BF16 delta tensor")
    elif p.coder == "stored":
        if p.size != n:
            o.bad("stored piece of %d bytes for %d" % (p.size, n))
    else:
        if p.size * 32768 < n:
            o.bad("zstd piece too small to produce its rows")
    return p


def _tensor(c, value, what):
    o = Obj(value, what)
    t = Tensor()
    t.name = o.str_("name")
    t.kind = o.str_("kind")
    if t.kind not in ("delta", "added", "reshaped"):
        o.bad("kind %r" % t.kind)
    t.dtype = o.str_("dtype")
    if t.dtype not in DTYPE_SIZES:
        o.bad("dtype %r" % t.dtype)
    t.esize = DTYPE_SIZES[t.dtype]
    shape = o.list_("shape")
    if not all(is_u64(x) for x in shape):
        o.bad("shape is not u64s")
    t.shape = list(shape)
    elems = 1
    for x in shape:
        elems *= x
    t.elements = elems
    t.nbytes = elems * t.esize
    if t.nbytes > U64_MAX:
        o.bad("tensor size overflows 64 bits")
    t.rows = shape[0] if shape else 1
    t.row_bytes = (t.nbytes // t.rows) if t.rows else 0
    if t.rows == 0:
        per = t.esize
        for x in shape[1:]:
            per *= x
        t.row_bytes = per
    t.data_offset = _u64(o, "data_offset")
    t.base_xxh3 = o.hex("base_xxh3") if t.kind == "delta" else None
    t.group = None
    if c.version == 2 and o.has("group"):
        t.group = _u64(o, "group")
        t.target_xxh3 = None
        t.pieces = []
        if t.kind != "delta" or t.dtype != "BF16" or t.elements < 1:
            o.bad("only BF16 delta tensors with elements are grouped")
    else:
        t.target_xxh3 = o.hex("target_xxh3")
        plist = o.list_("pieces")
        t.pieces = [_piece(c, v, "%s piece %d" % (what, i),
                           lambda a, b, rb=t.row_bytes: (b - a) * rb, t.row_bytes, t)
                    for i, v in enumerate(plist)]
        # pieces: non-empty, increasing, contiguous, from 0 to the row count ("Tensor")
        if t.nbytes == 0:
            if t.pieces:
                o.bad("a tensor without bytes has pieces")
        else:
            at = 0
            for p in t.pieces:
                if p.r0 != at:
                    o.bad("pieces are not contiguous")
                at = p.r1
            if at != t.rows:
                o.bad("pieces do not end at the row count")
        # tensor checksums recomputed from the pieces
        if xxh3(struct.pack("<%dQ" % len(t.pieces), *[p.target_xxh3 for p in t.pieces])) != t.target_xxh3:
            o.bad("target_xxh3 is not the pieces'")
        if t.kind == "delta" and xxh3(struct.pack("<%dQ" % len(t.pieces),
                                                 *[p.base_xxh3 for p in t.pieces])) != t.base_xxh3:
            o.bad("base_xxh3 is not the pieces'")
    o.done()
    return t


def _group(c, value, what):
    o = Obj(value, what)
    g = Group()
    g.offset = _u64(o, "offset")
    g.size = _u64(o, "size")
    if g.offset + g.size > c.data_size:
        o.bad("stored bytes past the data section")
    g.xxh3 = o.hex("xxh3")
    g.target_xxh3 = o.hex("target_xxh3")
    o.done()
    g.members = []
    return g


def _file(c, value, what):
    o = Obj(value, what)
    f = File()
    f.name = o.get("name")
    if not plain_name(f.name):
        o.bad("file name %r" % (f.name,))
    f.size = _u64(o, "size")
    f.header = _piece(c, o.get("header"), what + " header", lambda a, b: b - a, 1)
    if f.header.r0 != 0:
        o.bad("header rows do not start at 0")
    f.data_start = f.header.r1
    fills = o.list_("fills")
    f.fills = []
    for v in fills:
        off, ln = _pair(o, "fills", v)
        if ln == 0:
            o.bad("empty fill")
        f.fills.append((off, ln))
    total_fill = sum(ln for _, ln in f.fills)
    f.fill = None
    if f.fills:
        f.fill = _piece(c, o.get("fill"), what + " fill", lambda a, b: b - a, 1)
        if f.fill.r0 != 0 or f.fill.r1 != total_fill:
            o.bad("fill rows are not [0, total fill length]")
    elif o.has("fill"):
        o.bad("fill without fills")
    f.tensors = [_tensor(c, v, "tensor %r" % (v.get("name") if isinstance(v, dict) else i))
                 for i, v in enumerate(o.list_("tensors"))]
    f.groups = []
    if c.version == 2:
        f.groups = [_group(c, v, "%s group %d" % (what, i)) for i, v in enumerate(o.list_("groups"))]
    o.done()
    for t in f.tensors:
        if t.group is not None:
            if t.group >= len(f.groups):
                o.bad("tensor %r names a missing group" % t.name)
            f.groups[t.group].members.append(t)
    for i, g in enumerate(f.groups):
        if not g.members:
            o.bad("group %d has no member" % i)
    # header, tensors and fills cover [0, size) exactly once ("File")
    spans = [(0, f.data_start)]
    for t in f.tensors:
        start = f.data_start + t.data_offset
        spans.append((start, start + t.nbytes))
    spans += [(off, off + ln) for off, ln in f.fills]
    spans = sorted(s for s in spans if s[1] > s[0])
    at = 0
    for a, b in spans:
        if a != at:
            o.bad("file bytes overlap or leave a hole at %d" % min(a, at))
        at = b
    if at != f.size:
        o.bad("file bytes do not end at its size")
    return f


def _parse_manifest(c, value):
    o = Obj(value, "manifest")
    c.layout = o.str_("layout")
    if c.layout not in ("file", "directory"):
        o.bad("layout %r" % c.layout)
    files = o.list_("files")
    if not files:
        o.bad("no file")
    c.files = [_file(c, v, "file %d" % i) for i, v in enumerate(files)]
    c.removed_files = o.list_("removed_files")
    c.removed_tensors = o.list_("removed_tensors")
    o.done()
    names = [f.name for f in c.files]
    if len(set(names)) != len(names):
        o.bad("file names repeat")
    for r in c.removed_files:
        if not plain_name(r) or r in names:
            o.bad("removed file %r" % (r,))
    if not all(isinstance(r, str) for r in c.removed_tensors):
        o.bad("removed_tensors are not strings")
    if c.layout == "file" and (len(c.files) != 1 or c.removed_files):
        o.bad("a file layout has one file and removes none")
    tnames = [t.name for f in c.files for t in f.tensors]
    if len(set(tnames)) != len(tnames):
        o.bad("tensor names repeat")


# ---------------------------------------------------------------- coders ("Coders")

def _zstd_exact(stored, n):
    """A zstd frame of content size n ("Errors": another content size is corrupt_chunk, a
    frame that does not decode codec_failure)."""
    try:
        params = zstandard.get_frame_parameters(stored)
    except zstandard.ZstdError as e:
        fail("corrupt_chunk", "zstd piece: %s" % e)
    if params.content_size != n:
        fail("corrupt_chunk", "zstd piece: content size %d, not %d" % (params.content_size, n))
    try:
        d = zstandard.ZstdDecompressor().decompressobj()
        out = d.decompress(stored)
    except zstandard.ZstdError as e:
        fail("codec_failure", "zstd piece: %s" % e)
    if not d.eof or d.unused_data or len(out) != n:
        fail("codec_failure", "zstd piece does not decode to exactly %d bytes" % n)
    return out


def _xor(a, b):
    return (np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).tobytes()


def decode_piece(p, stored, base, esize, what):
    """Target bytes of piece `p` from its stored bytes; `base` the base rows (None: zeros).
    The stored bytes' xxh3 first, then decoding, then target_xxh3; a piece that fails is
    checked against its base_xxh3 to name a wrong base ("Applying a container", 2-3)."""
    if xxh3(stored) != p.xxh3:
        fail("corrupt_chunk", "%s fails its xxh3" % what)
    n = p.nbytes

    def base_wrong():
        return base is not None and p.base_xxh3 is not None and xxh3(base) != p.base_xxh3

    try:
        if p.coder == "arc_v3":
            if n % 2:
                fail("corrupt_header", "arc_v3 piece of an odd byte count")
            src = np.frombuffer(base, dtype="<u2") if base is not None else np.zeros(n // 2, np.uint16)
            try:
                out = arc_payload.decode(stored, src, None, p.target_xxh3).astype("<u2").tobytes()
            except ArcError as e:  # "Errors": the payload's own error, but its checksum's
                if e.code == "checksum_mismatch":
                    fail("corrupt_chunk", "%s fails its target_xxh3" % what)
                raise
        else:
            if p.coder == "stored":
                x = bytes(stored)
            elif p.coder == "zstd":
                x = _zstd_exact(stored, n)
            else:  # zstd-planes: plane k holds byte k of every element
                if n % esize:
                    fail("corrupt_chunk", "zstd-planes piece not a multiple of its element size")
                planes = np.frombuffer(_zstd_exact(stored, n), np.uint8).reshape(esize, n // esize)
                x = planes.T.tobytes()
            out = _xor(x, base) if base is not None else x
            if xxh3(out) != p.target_xxh3:
                fail("corrupt_chunk", "%s fails its target_xxh3" % what)  # "Errors"
    except ArcError:
        if base_wrong():
            fail("checksum_mismatch", "wrong base: %s" % what)
        raise
    return out


def decode_group(g, stored, bases, what):
    """Members' target bytes of group `g`; `bases` the members' base bytes, checked first
    ("Group (version 2)")."""
    if xxh3(stored) != g.xxh3:
        fail("corrupt_chunk", "%s fails its xxh3" % what)
    for t, b in zip(g.members, bases):
        if xxh3(b) != t.base_xxh3:
            fail("checksum_mismatch", "wrong base of grouped tensor %r" % t.name)
    counts = [t.elements for t in g.members]
    src = np.frombuffer(b"".join(bases), dtype="<u2")
    try:
        dst = arc_payload.decode(stored, src, counts, g.target_xxh3)
    except ArcError as e:
        if e.code in ("size_mismatch", "checksum_mismatch"):
            fail("corrupt_chunk", "%s: %s" % (what, e.message or e.code))
        raise
    out = []
    at = 0
    raw = dst.astype("<u2").tobytes()
    for t in g.members:
        out.append(raw[at:at + t.nbytes])
        at += t.nbytes
    return out
