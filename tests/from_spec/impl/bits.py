"""Byte readers: little-endian integers and minimal LEB128 varints (codec FORMAT.md,
"Conventions")."""
from .errors import fail


class Reader:
    """Reads fields from data[pos:end]; a field that runs past `end` is `truncated`
    (codec FORMAT.md, "Errors": "truncated when the bytes end inside a field")."""

    __slots__ = ("data", "pos", "end", "bad")

    def __init__(self, data, pos=0, end=None, bad="corrupt_header"):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end
        self.bad = bad  # the error of an inconsistent field in this part (header / chunk)

    def left(self):
        return self.end - self.pos

    def take(self, n):
        if n < 0 or self.pos + n > self.end:
            fail("truncated", "field runs past the end (%d of %d bytes)" % (n, self.left()))
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self):
        if self.pos >= self.end:
            fail("truncated", "byte field past the end")
        v = self.data[self.pos]
        self.pos += 1
        return v

    def uint(self, size):
        return int.from_bytes(self.take(size), "little")

    def varint(self):
        """Unsigned LEB128, at most 10 bytes / 64 bits, minimal (no final 0x00 after a
        continuation byte)."""
        data, pos, end = self.data, self.pos, self.end
        value = 0
        shift = 0
        for i in range(10):
            if pos >= end:
                fail("truncated", "varint runs past the end")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and i > 0:
                    fail(self.bad, "non-minimal varint")
                if value >> 64:
                    fail(self.bad, "varint above 64 bits")
                self.pos = pos
                return value
            shift += 7
        fail(self.bad, "varint longer than 10 bytes")
