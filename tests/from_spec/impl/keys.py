"""The monotone key of BF16 bit patterns (codec FORMAT.md, "Modelled chunk", step 2):
key(b) = b & 0x8000 ? 0x7FFF - (b & 0x7FFF) : b | 0x8000."""
import numpy as np


def key(b):
    return 0x7FFF - (b & 0x7FFF) if b & 0x8000 else b | 0x8000


def from_key(k):
    return k & 0x7FFF if k & 0x8000 else 0x8000 | (0x7FFF - k)


def key_array(b):
    b = b.astype(np.uint16)
    return np.where(b & 0x8000, 0x7FFF - (b & 0x7FFF), b | 0x8000).astype(np.uint16)


def from_key_array(k):
    k = k.astype(np.uint16)
    return np.where(k & 0x8000, k & 0x7FFF, 0x8000 | (0x7FFF - k)).astype(np.uint16)
