"""XXH3-64 (seed 0) and SHA-256 helpers (codec FORMAT.md "Integrity"; PROTOCOL.md "Notices")."""
import hashlib
import struct

import xxhash


def xxh3(data):
    """XXH3-64 with seed 0 of bytes (or anything exposing the buffer protocol)."""
    return xxhash.xxh3_64_intdigest(data)


def xxh3_u64s(*values):
    """XXH3 of u64 values, each as 8 little-endian bytes, concatenated (PROTOCOL.md, Notices)."""
    return xxh3(struct.pack("<%dQ" % len(values), *values))


def hex16(value):
    """A checksum as 16 lowercase hexadecimal digits (container FORMAT.md, Notices)."""
    return "%016x" % value


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def tensor_list_checksum(tensors):
    """A file's tensor-list checksum (PROTOCOL.md, Documents): XXH3 of each (name,
    result checksum) in data-section order as u64 LE name length, name bytes, u64 LE sum."""
    out = bytearray()
    for name, sum_ in tensors:
        b = name.encode()
        out += struct.pack("<Q", len(b)) + b + struct.pack("<Q", sum_)
    return xxh3(bytes(out))
