"""arc_v3 payloads (codec FORMAT.md): the frame, its chunks, sessions.

`decode(payload, src, counts, checksum, session=None)` rebuilds dst or raises ArcError with
one of the names of FORMAT.md "Errors"."""
import struct

import numpy as np

from . import model, rans, streams
from .bits import Reader
from .errors import fail
from .hashing import xxh3, xxh3_u64s
from .keys import key_array

MAGIC = b"ARC3"
SESSION, TENSORS, CONTINUES = 1, 2, 4


class Session:
    """What both sides of a session keep ("Sessions"): the per-element history, its
    History_Id, the carried model of each chunk index, and the last step."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.history = None      # np.uint8 per element; None = fresh (all zeros)
        self.history_id = 0      # 0 for a fresh session
        self.models = {}         # chunk index -> carried model (model.Model)
        self.last = None         # (checksum, listed, counts) of the last step
        self.n = None            # the element count the first successful step fixed


class Frame:
    pass


def _parse_header(payload):
    """Frame_Header ("Frame_Header")."""
    if len(payload) < 4:
        fail("truncated", "shorter than the magic")  # "Errors" 2.1
    if bytes(payload[:4]) != MAGIC:
        fail("bad_magic")
    r = Reader(payload, 4, bad="corrupt_header")
    f = Frame()
    f.version = r.u8()
    if f.version not in (1, 16):
        fail("unsupported_version", "Version %d" % f.version)
    f.flags = r.u8()
    if f.version == 1 and f.flags:
        fail("reserved_bits_set", "version-1 Flags")
    if f.flags & 0xF8:
        fail("reserved_bits_set", "Flags bits 3-7")
    if f.flags & CONTINUES and not f.flags & SESSION:
        fail("corrupt_header", "Continues without Session")
    f.session = bool(f.flags & SESSION)
    f.tensors = bool(f.flags & TENSORS)
    f.continues = bool(f.flags & CONTINUES)
    f.n = r.varint()
    if f.n > 1 << 62:
        fail("corrupt_header", "Element_Count above 2^62")
    f.chunk_log = r.u8()
    if not 10 <= f.chunk_log <= 24:
        fail("corrupt_header", "Chunk_Log %d" % f.chunk_log)
    f.base_checksum = None
    f.history_id = None
    if f.session and not f.continues:
        f.base_checksum = r.uint(8)
    if f.session:
        f.history_id = r.uint(8)
    f.tensor_count = f.tensor_check = None
    if f.tensors and not f.continues:
        f.tensor_count = r.varint()
        f.tensor_check = r.uint(4)
    f.reader = r
    return f


def _tensor_list_check(counts):
    return xxh3(struct.pack("<%dQ" % len(counts), *counts)) & 0xFFFFFFFF


def _chunk_table(f, payload):
    """Chunk_Table, checked as "Errors", step 3 says; returns [(start, end)] per chunk."""
    r = f.reader
    size = 1 << f.chunk_log
    count = (f.n + size - 1) // size
    if count == 0:
        entries = 0
    else:
        entries = count if f.version == 1 else count - 1
    # 3.1: each chunk needs a byte, each stored size a byte
    if count + entries > len(payload) - r.pos:
        fail("truncated", "payload too short for %d chunks" % count)
    sizes = []
    total = 0
    for _ in range(entries):  # 3.2, entry by entry
        s = r.varint()
        if s == 0:
            fail("corrupt_header", "chunk size 0")
        if s > len(payload):
            fail("corrupt_header", "chunk size %d above the payload's length" % s)
        total += s
        if total > len(payload) - r.pos:
            fail("truncated", "chunks run past the payload")
        sizes.append(s)
    after = len(payload) - r.pos
    if f.version == 16 and count >= 1:
        if total == after:  # 3.3: the last chunk would be empty
            fail("truncated", "the last chunk holds no byte")
    elif total < after:  # 3.4: version 1, or n = 0
        fail("corrupt_header", "bytes after the last chunk")
    pos = r.pos
    spans = []
    for s in sizes:
        spans.append((pos, pos + s))
        pos += s
    if f.version == 16 and count >= 1:
        spans.append((pos, len(payload)))
    return spans


def _check_continues(f, session):
    """"Errors" step 4: Continues resolved from the session's last step."""
    if not f.continues:
        return None
    if session is None or session.last is None:
        fail("history_mismatch", "Continues without a last step")
    _, listed, last_counts = session.last
    if listed != f.tensors:
        fail("history_mismatch", "Tensors flag differs from the last step's")
    if f.tensors and sum(last_counts) != f.n:
        fail("corrupt_header", "the last step's tensors do not add up to Element_Count")
    f.base_checksum = session.last[0]
    return last_counts if f.tensors else None


def _check_tensor_list(f, counts, continued):
    """"Errors" step 5: the call's tensor list against the frame's."""
    if counts is None:
        if f.tensors:
            fail("size_mismatch", "a one-tensor call refuses a Tensors frame")
        return
    if f.tensors and not f.continues:
        if len(counts) != f.tensor_count:
            fail("size_mismatch", "Tensor_Count %d, call %d" % (f.tensor_count, len(counts)))
        if sum(counts) != f.n:
            fail("size_mismatch", "Element_Count %d, call total %d" % (f.n, sum(counts)))
        if _tensor_list_check(counts) != f.tensor_check:
            fail("size_mismatch", "Tensor_List_Check differs")
        return
    frame_list = list(continued) if continued is not None else [f.n]
    if len(counts) != len(frame_list):
        fail("size_mismatch", "the frame has %d tensors, the call %d" % (len(frame_list), len(counts)))
    for i, (a, b) in enumerate(zip(counts, frame_list)):
        if a != b:
            fail("size_mismatch", "tensor %d: %d elements, the frame's %d" % (i, a, b))


def _check_call(f, call_n, src, session):
    """"Errors" step 6: the call's element count, the session flag, the base, History_Id."""
    if f.n != call_n:
        fail("size_mismatch", "Element_Count %d, call %d" % (f.n, call_n))
    if len(src) != call_n:
        fail("size_mismatch", "src holds %d elements" % len(src))
    if f.session and session is None:
        fail("history_mismatch", "a stateless decoder refuses session payloads")
    if not f.session and session is not None:
        fail("history_mismatch", "a session refuses a payload without the Session flag")
    if f.session:
        if xxh3(src.tobytes()) != f.base_checksum:
            fail("wrong_base", "src is not the payload's base")
        if f.history_id != session.history_id:
            fail("history_mismatch", "History_Id %016x, own %016x" % (f.history_id, session.history_id))


def advance_history(history, src, dst):
    """ref::AdvanceHistory as "Sessions" describes it."""
    h = history
    changed = src != dst
    diff = (key_array(dst).astype(np.int32) - key_array(src).astype(np.int32)) & 0xFFFF
    up = (diff < 0x8000).astype(np.uint8)  # "up": key difference mod 2^16 below 2^15
    age = h & 7
    aged = np.where((age >= 1) & (age <= 6), (h & 8) | (age + 1), h)
    return np.where(changed, 1 | (up << 3), aged).astype(np.uint8)


def decode(payload, src, counts, checksum, session=None):
    """Rebuild dst (np.uint16) from `payload` and `src` (np.uint16, the concatenation of
    the caller's tensors); `counts` None for a one-tensor call, else the caller's element
    counts; `checksum` the XXH3-64 the caller verifies.  On success a session advances."""
    payload = bytes(payload)
    src = np.ascontiguousarray(src, dtype=np.uint16)
    call_n = len(src) if counts is None else sum(counts)
    if session is not None and session.n is not None and call_n != session.n:
        fail("size_mismatch", "the session holds %d elements, the call %d" % (session.n, call_n))
    f = _parse_header(payload)                    # step 2
    spans = _chunk_table(f, payload)              # step 3
    continued = _check_continues(f, session)      # step 4
    _check_tensor_list(f, counts, continued)      # step 5
    _check_call(f, call_n, src, session)          # step 6

    size = 1 << f.chunk_log
    history = None
    if f.session:
        history = session.history if session.history is not None else np.zeros(f.n, np.uint8)
    dst = np.empty_like(src)
    new_models = {}
    for k, (a, b) in enumerate(spans):
        lo = k * size
        hi = min(lo + size, f.n)
        s = src[lo:hi]
        if f.version == 1:
            dst[lo:hi] = streams.decode_xor_chunk(payload[a:b], hi - lo, s, 1)
            continue
        mode = payload[a]
        body = payload[a + 1:b]
        if mode == 0:
            if body:
                fail("corrupt_chunk", "bytes after an unchanged chunk")
            dst[lo:hi] = s
        elif mode == 1:
            dst[lo:hi] = streams.decode_xor_chunk(body, hi - lo, s, 16)
        elif mode == 2:
            carried = session.models.get(k) if f.session else None
            out, m = model.decode_modelled_chunk(
                body, hi - lo, s, history[lo:hi] if f.session else None, carried)
            dst[lo:hi] = out
            new_models[k] = m
        elif mode == 3:
            dst[lo:hi] = rans.decode_rans_chunk(body, hi - lo, s, None)
        elif mode == 4:
            if not f.session:
                fail("corrupt_chunk", "rANS with the history outside a session")
            dst[lo:hi] = rans.decode_rans_chunk(body, hi - lo, s, history[lo:hi])
        else:
            fail("reserved_bits_set", "reserved Chunk_Mode %d" % mode)  # 5..255 reserved

    if xxh3(dst.tobytes()) != checksum:
        fail("checksum_mismatch", "rebuilt tensor fails its checksum")

    if f.session:  # commit the step ("Sessions": only after success)
        session.history = advance_history(history, src, dst)
        session.history_id = xxh3_u64s(f.history_id, f.base_checksum, checksum)
        session.models.update(new_models)
        listed_counts = None
        if f.tensors:
            listed_counts = tuple(counts)
        session.last = (checksum, f.tensors, listed_counts)
        session.n = len(src)
    return dst
