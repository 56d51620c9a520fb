"""XOR-stream chunks (codec FORMAT.md, "XOR-stream chunk"): version 1's only chunk and
version 16's Chunk_Mode 1."""
import lz4.block
import numpy as np
import zstandard

from .bits import Reader
from .errors import fail

# Window_Size at most 2^27 (zstd's default limit), "Stream"
_ZSTD_MAGICLESS = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS,
                                             max_window_size=1 << 27)
LZ4_MAX_INPUT = 0x7E000000
_BIT_WEIGHTS7 = (1 << np.arange(7, dtype=np.uint16)).astype(np.uint16)


def read_stream(r, raw_ok):
    """One Stream record ("Stream"), checked in the order of "Errors", stream checks:
    Codec, Raw_Size (`raw_ok(raw)`: the stream's bounds), Stored_Size, Data present,
    the codec's size ratio, then decoding."""
    codec = r.u8()
    if codec > 2:
        fail("reserved_bits_set", "reserved stream codec %d" % codec)
    raw = r.varint()
    if not raw_ok(raw):
        fail("corrupt_chunk", "stream Raw_Size %d not allowed" % raw)
    if codec == 0:
        return bytes(r.take(raw))
    stored = r.varint()
    data = bytes(r.take(stored))
    if codec == 1 and raw > 256 * stored:
        fail("codec_failure", "LZ4 Raw_Size above 256 * Stored_Size")
    if codec == 2 and raw > 32768 * stored:
        fail("codec_failure", "zstd Raw_Size above 32768 * Stored_Size")
    if codec == 1 and stored > LZ4_MAX_INPUT:
        fail("corrupt_chunk", "LZ4 block above LZ4's input limit")
    if codec == 1:  # one LZ4 block, no frame, decoding to exactly Raw_Size bytes
        try:
            out = lz4.block.decompress(data, uncompressed_size=raw) if raw else None
        except Exception as e:  # noqa: BLE001 - any LZ4 failure is the codec's
            fail("codec_failure", "LZ4 block: %s" % e)
        if raw == 0:
            # An empty block is the single token byte 0x00.
            if data != b"\x00":
                fail("codec_failure", "LZ4 block of an empty stream")
            return b""
        if len(out) != raw:
            fail("codec_failure", "LZ4 block decodes to %d bytes, not %d" % (len(out), raw))
        return out
    # codec 2: one magicless zstd frame using all Stored_Size bytes, exactly Raw_Size out
    try:
        d = _ZSTD_MAGICLESS.decompressobj()
        out = d.decompress(data)
        ok = d.eof and not d.unused_data
    except Exception as e:  # noqa: BLE001
        fail("codec_failure", "zstd frame: %s" % e)
    if not ok or len(out) != raw:
        fail("codec_failure", "zstd frame does not decode to exactly %d bytes" % raw)
    return out


def _gaps_to_positions(content, count, length):
    """Position_Mode 1: `count` minimal varints using `content` exactly; returns p[r]."""
    b = np.frombuffer(content, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if len(ends) != count or ends[-1] != len(b) - 1:
        fail("corrupt_chunk", "gap varints do not use the stream exactly")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max() > 4:  # any value of 5+ bytes is >= 2^28 > L
        fail("corrupt_chunk", "gap out of the chunk")
    if np.any((b[ends] == 0) & (lens > 1)):
        fail("corrupt_chunk", "non-minimal gap varint")
    vals = np.zeros(count, dtype=np.int64)
    for k in range(int(lens.max())):
        sel = lens > k
        vals[sel] |= (b[starts[sel] + k].astype(np.int64) & 0x7F) << (7 * k)
    pos = np.cumsum(vals + 1) - 1
    if pos[-1] >= length:
        fail("corrupt_chunk", "gap position past the chunk")
    return pos


def decode_xor_chunk(chunk, length, src, version):
    """Decode one XOR-stream body (for version 16, the bytes after Chunk_Mode 1).  `chunk`
    is the body, `src` the chunk's slice of src; returns the chunk's dst slice."""
    r = Reader(chunk, bad="corrupt_chunk")
    changed = r.varint()
    if changed > length:
        fail("corrupt_chunk", "Changed_Count %d > L %d" % (changed, length))
    if changed == 0:
        if version != 1:
            fail("corrupt_chunk", "XOR-stream chunk with no change")
        if r.left():
            fail("corrupt_chunk", "bytes after an empty chunk")
        return src.copy()
    high = r.varint()
    if high > changed:
        fail("corrupt_chunk", "High_Count > Changed_Count")
    layout = r.u8()
    if layout & 0xFC:
        fail("reserved_bits_set", "Layout bits 2-7")
    mode = layout & 3
    if mode > 1:
        fail("reserved_bits_set", "reserved Position_Mode %d" % mode)

    # Positions ("Positions, Position_Mode 0/1")
    if mode == 0:
        nbytes = (length + 7) // 8
        content = read_stream(r, lambda raw: raw == nbytes)
        bits = np.unpackbits(np.frombuffer(content, dtype=np.uint8), bitorder="little")
        if bits[length:].any():
            fail("corrupt_chunk", "bitmap bits past the chunk")
        pos = np.flatnonzero(bits[:length])
        if len(pos) != changed:
            fail("corrupt_chunk", "bitmap holds %d changes, not %d" % (len(pos), changed))
    else:
        content = read_stream(r, lambda raw: changed <= raw <= 4 * changed)
        pos = _gaps_to_positions(content, changed, length)

    # Mantissas ("Mantissas"): 7-bit fields, LSB first
    mbytes = (7 * changed + 7) // 8
    content = read_stream(r, lambda raw: raw == mbytes)
    bits = np.unpackbits(np.frombuffer(content, dtype=np.uint8), bitorder="little")
    if bits[7 * changed:].any():
        fail("corrupt_chunk", "mantissa bits past the last field")
    x = bits[:7 * changed].reshape(changed, 7).astype(np.uint16) @ _BIT_WEIGHTS7
    x = x.astype(np.uint16)

    # High_Records ("High_Records")
    if high:
        content = read_stream(r, lambda raw: 3 * high <= raw <= 6 * high)
        hr = Reader(content, bad="corrupt_chunk")
        rank = -1
        ranks = np.empty(high, dtype=np.int64)
        his = np.empty(high, dtype=np.uint16)
        try:
            for k in range(high):
                rank += hr.varint() + 1
                hb = hr.uint(2)
                if rank >= changed or not 1 <= hb <= 0x1FF:
                    fail("corrupt_chunk", "high record out of range")
                ranks[k] = rank
                his[k] = hb
        except Exception as e:  # a record running past the stream is inconsistent
            if getattr(e, "code", None) == "truncated":
                fail("corrupt_chunk", "high records run past their stream")
            raise
        if hr.left():
            fail("corrupt_chunk", "bytes left in the high records")
        x[ranks] |= his << 7

    # Rebuilding dst: x nonzero, then no byte left ("Errors", XOR-stream checks 7, 8)
    if not x.all():
        fail("corrupt_chunk", "a listed change changes nothing")
    if r.left():
        fail("corrupt_chunk", "bytes after the last stream")
    dst = src.copy()
    dst[pos] ^= x
    return dst
