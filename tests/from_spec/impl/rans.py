"""rANS chunks (codec FORMAT.md, "rANS chunk"): Chunk_Mode 3, and Chunk_Mode 4 with the
session history classes."""
import bisect
import struct

import numpy as np

from .bits import Reader
from .errors import fail
from .keys import from_key_array, key_array

# "Integer functions": K[j] = round(65536 * 2^(j/16))
_K = (65536, 68438, 71468, 74632, 77936, 81386, 84990, 88752,
      92682, 96785, 101070, 105545, 110218, 115098, 120194, 125515)


def pow2s(t):
    """Pow2S(t) = 2^(t/16) in units of 2^-16: K[j] shifted by o = floor(t/16) octaves, a
    right shift rounding half up ("Integer functions")."""
    o, j = divmod(t, 16)
    if o >= 0:
        return _K[j] << o
    return (_K[j] + (1 << (-o - 1))) >> -o


def prob_of_q(q):
    """ProbOfQ(q) = 2^(-q/16) in units of 2^-16, clamped to [1, 65535]."""
    return min(max(pow2s(-q), 1), 65535)


def prob_of_log(t):
    """ProbOfLog(t) = floor(2^16 x / (x + 2^16)), x = 2^(clamp(t,-256,256)/16), in [1, 65535]."""
    x = pow2s(min(max(t, -256), 256))
    return min(max((x << 16) // (x + 65536), 1), 65535)


def _element_intervals(p, e, v0, s0):
    """a for the pair's p and the class exponent e ("Element symbols")."""
    pl = prob_of_log(v0 - s0 * e)
    return min(max((p * pl + 32768) >> 16, 1), p - 2)


def _escape_cumulative(e, v1, s1):
    """Cumulative starts of the log2 classes j = 1..15 of an escape ("Escape classes")."""
    f = []
    reach = 1 << 32
    for k in range(1, 16):
        nxt = (reach * prob_of_log(v1 - s1 * (e + k))) >> 16 if k < 15 else 0
        f.append(max((reach - nxt) >> 16, 1))
        reach = nxt
    top = f.index(max(f))
    f[top] += 65536 - sum(f)
    cum = [0]
    for fk in f:
        cum.append(cum[-1] + fk)
    return cum  # class j has [cum[j-1], cum[j])


def decode_rans_chunk(chunk, length, src, history):
    """Decode the bytes after Chunk_Mode 3 (history None) or 4 (history: the chunk's slice
    of the session history bytes).  Returns the chunk's dst slice."""
    r = Reader(chunk, bad="corrupt_chunk")
    e0 = r.u8()
    change_q = r.take(16)
    v0, v1 = struct.unpack("<HH", r.take(4))  # unsigned; V - S*z is signed
    s0, s1 = r.u8(), r.u8()
    if history is not None:
        hist_q = r.take(32)
        hist_u = r.take(32)
    words_n = r.varint()
    states = list(struct.unpack("<16I", r.take(64)))
    words = r.take(2 * words_n)
    tail = r.take(r.left())
    if len(tail) & 1:
        fail("corrupt_chunk", "odd escape tail")
    for x in states:
        if x < 65536:
            fail("corrupt_chunk", "element state below 2^16")
    words = struct.unpack("<%dH" % words_n, words)

    # Per-table intervals: table t = class c (+16 * history class).  Entries (a, b, p).
    A, B, P = [], [], []
    for c in range(16):
        p = max(prob_of_q(change_q[c]), 3)
        a = _element_intervals(p, e0 + c, v0, s0)
        A.append(a), B.append(a + (p - a + 1) // 2), P.append(p)
    if history is not None:
        for hc in range(2):
            for c in range(16):
                p = max(prob_of_q(hist_q[16 * hc + c]), 3)
                a = _element_intervals(p, e0 + c, v0, s0)  # its own a from its own p
                u = hist_u[16 * hc + c]
                b = a + min(max(((p - a) * (2 * u + 1) + 256) >> 9, 1), p - a - 1)
                A.append(a), B.append(b), P.append(p)

    exps = (src >> 7) & 0xFF
    cls = np.clip(exps.astype(np.int32) - e0, 0, 15)
    if history is not None:
        h = history
        hcls = np.where((h & 7) == 0, 0, np.where((h & 8) != 0, 1, 2))
        tab = cls + 16 * hcls
    else:
        tab = cls
    tab = tab.tolist()

    # Elements: element i on state i mod 16, words shared in element order.
    changes = []  # (i, kind) kind 0 escape, 1 plus, 2 minus
    wi = 0
    nw = words_n
    for i in range(length):
        lane = i & 15
        x = states[lane]
        t = tab[i]
        slot = x & 0xFFFF
        p = P[t]
        if slot >= p:
            x = (65536 - p) * (x >> 16) + slot - p
        else:
            a = A[t]
            if slot < a:
                x = a * (x >> 16) + slot
                changes.append((i, 0))
            else:
                b = B[t]
                if slot < b:
                    x = (b - a) * (x >> 16) + slot - a
                    changes.append((i, 1))
                else:
                    x = (p - b) * (x >> 16) + slot - b
                    changes.append((i, 2))
        if x < 65536:
            if wi >= nw:
                fail("corrupt_chunk", "element stream runs out of words")
            x = (x << 16) | words[wi]
            wi += 1
        states[lane] = x
    if wi != nw:
        fail("corrupt_chunk", "element words left unread")
    if not changes:
        fail("corrupt_chunk", "rANS chunk without a change")
    for x in states:
        if not 65536 <= x < 131072:
            fail("corrupt_chunk", "element state does not end in [2^16, 2^17)")

    # Escape stream: the 16 units the element states end on, then the tail.
    units = [x - 65536 for x in states] + list(struct.unpack("<%dH" % (len(tail) // 2), tail))
    es = [units[0] | units[1] << 16, units[2] | units[3] << 16]
    for x in es:
        if x < 65536:
            fail("corrupt_chunk", "escape state below 2^16")
    ui = 4
    nu = len(units)
    d = np.zeros(length, dtype=np.int32)
    cum_cache = {}
    k = 0
    src_list = None
    for i, kind in changes:
        if kind == 1:
            d[i] = 1
            continue
        if kind == 2:
            d[i] = -1
            continue
        if src_list is None:
            src_list = cls.tolist()
        c = src_list[i]
        cum = cum_cache.get(c)
        if cum is None:
            cum = cum_cache[c] = _escape_cumulative(e0 + c, v1, s1)
        lane = k & 1
        k += 1
        x = es[lane]
        slot = x & 0xFFFF
        j = bisect.bisect_right(cum, slot)  # cum[j-1] <= slot < cum[j]
        x = (cum[j] - cum[j - 1]) * (x >> 16) + slot - cum[j - 1]
        if x < 65536:
            if ui >= nu:
                fail("corrupt_chunk", "escape stream runs out of units")
            x = (x << 16) | units[ui]
            ui += 1
        nb = j + 1  # j + 1 uniform bits
        slot = x & 0xFFFF
        sh = 16 - nb
        u = slot >> sh
        x = (1 << sh) * (x >> 16) + slot - (u << sh)
        if x < 65536:
            if ui >= nu:
                fail("corrupt_chunk", "escape stream runs out of units")
            x = (x << 16) | units[ui]
            ui += 1
        es[lane] = x
        mag = (1 << j) + (u >> 1)
        if mag > 32768 or (mag == 32768 and not u & 1):
            fail("corrupt_chunk", "escape magnitude out of range")
        d[i] = -mag if u & 1 else mag
    if es[0] != 65536 or es[1] != 65536:
        fail("corrupt_chunk", "escape states do not end at 2^16")
    if len(tail):
        if ui != nu:
            fail("corrupt_chunk", "escape units left unread")
    elif any(units[ui:16]):
        fail("corrupt_chunk", "nonzero escape padding")
    keys = key_array(src).astype(np.int32)
    return from_key_array(((keys + d) & 0xFFFF).astype(np.uint16))
