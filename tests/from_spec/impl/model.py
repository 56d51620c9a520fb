"""Modelled chunks (codec FORMAT.md, "Modelled chunk"): an adaptive binary range coder
whose contexts come from src (and, in a session, the history and the carried model)."""
import numpy as np

from .errors import fail
from .keys import from_key, key

# ---------------------------------------------------------------- "Definitions"

_Q = (65536, 77936, 92682, 110218)


def log2q4(x):
    """Log2Q4(x), x >= 1: 4*t + the two bits below the top bit."""
    t = x.bit_length() - 1
    f = (x >> (t - 2)) & 3 if t >= 2 else (x << (2 - t)) & 3
    return 4 * t + f


def pow2q4(q):
    """Pow2Q4(q) = 2^(q/4) in units of 2^-16."""
    o, m = q >> 2, q & 3
    if o >= 32:
        return 1 << 48
    if o >= 0:
        return _Q[m] << o
    if o <= -34:
        return 1
    return max(_Q[m] >> -o, 1)


def clamp_prob(p):
    return min(max(p, 48), 65488)


def prob_from_log(q):
    x = pow2q4(q)
    return clamp_prob((x * 65536) // (x + 65536))


# ---------------------------------------------------------------- contexts

# "Contexts and their initial values": offsets of each family in one flat array
BLOCK = 0                      # block[u], u = 0..191
SPLIT = BLOCK + 192            # split[v][t], v = 0..15, t = 0..63
ALSO = SPLIT + 16 * 64         # also[t], t = 0..95
UNARY = ALSO + 96              # unary[a][j], a = 0..32, j = 0..14
BITS = UNARY + 33 * 15         # bits[k][b], k = 0..15, b = 0..15
SIGN = BITS + 16 * 16          # sign[g][s][a], g = 0..2, s = 0..1, a = 0..32
COLUMN = SIGN + 3 * 2 * 33     # column_sign[g][w], g = 0..2, w = 0..3
RECENT = COLUMN + 3 * 4        # recent[e][a], e = 0..1, a = 0..32
N_CONTEXTS = RECENT + 2 * 33


def initial_model(rate_prior, value_priors):
    """The contexts' initial (p, n, s_max), as three lists."""
    L = rate_prior
    p = [0] * N_CONTEXTS
    n = [0] * N_CONTEXTS
    s = [7] * N_CONTEXTS
    for u in range(192):
        p[BLOCK + u], n[BLOCK + u] = prob_from_log(u - L), 14
    for t in range(64):
        w = pow2q4(-(31 - t if t < 32 else t - 32))
        pt = clamp_prob(w if t < 32 else 65536 - w)
        for v in range(16):
            p[SPLIT + 64 * v + t], n[SPLIT + 64 * v + t] = pt, 126
    for t in range(96):
        p[ALSO + t], n[ALSO + t] = prob_from_log(t - 64), 14
    for a in range(33):
        for j in range(15):
            if value_priors:
                pu = prob_from_log(4 * (a - j) - L)
            else:
                pu = 7000 if j == 0 else 24000
            p[UNARY + 15 * a + j], n[UNARY + 15 * a + j] = pu, 2
    for i in range(256):
        p[BITS + i], n[BITS + i] = 32768, 2
    for g in range(3):
        for sb in range(2):
            for a in range(33):
                c = SIGN + 66 * g + 33 * sb + a
                if value_priors:
                    p[c], n[c] = ((32768, 30), (4000, 4), (61536, 4))[g]
                else:
                    p[c], n[c] = 32768, 2
        for w in range(4):
            p[COLUMN + 4 * g + w], n[COLUMN + 4 * g + w] = 32768, 2
    for e in range(2):
        for a in range(33):
            p[RECENT + 33 * e + a], n[RECENT + 33 * e + a] = max(prob_from_log(4 * a - L), 655), 2
    return p, n, s


# floor(log2(n + 2)) for n = 0..255 ("Adaptive contexts")
_LOG2N2 = [(k + 2).bit_length() - 1 for k in range(256)]


class RangeDecoder:
    """LZMA's binary range decoder with 16-bit probabilities ("Range decoder"); the
    contexts live in the lists p, n, smax."""

    def __init__(self, stream, model):
        self.stream = stream
        self.end = len(stream)
        self.pos = 4
        b = bytes(stream[:4]) + b"\0" * max(0, 4 - len(stream))
        self.code = int.from_bytes(b, "big")
        self.range = 0xFFFFFFFF
        self.p, self.n, self.smax = model

    def bit(self, c):
        p = self.p
        pc = p[c]
        rng = self.range
        code = self.code
        bound = (rng >> 16) * pc
        n = self.n[c]
        s = _LOG2N2[n]
        sm = self.smax[c]
        if s > sm:
            s = sm
        if code < bound:
            rng = bound
            p[c] = pc + ((65504 - pc) >> s)
            bit = 1
        else:
            code -= bound
            rng -= bound
            p[c] = pc + ((32 - pc) >> s)
            bit = 0
        if n < 255:
            self.n[c] = n + 1
        while rng < 0x1000000:
            rng = (rng << 8) & 0xFFFFFFFF
            pos = self.pos
            nb = self.stream[pos] if pos < self.end else 0
            self.pos = pos + 1
            code = ((code << 8) | nb) & 0xFFFFFFFF
        self.range = rng
        self.code = code
        return bit


def decode_modelled_chunk(body, length, src, history, carried):
    """Decode the bytes after Chunk_Mode 2.  `history` is the chunk's slice of the session
    history (None: stateless), `carried` the session's carried model of this chunk (or
    None).  Returns (dst slice, the model after the last decision)."""
    # "Checks, in order"
    if len(body) < 1:
        fail("corrupt_chunk", "modelled chunk without a Layout byte")
    layout = body[0]
    if layout & 7 == 7:
        fail("corrupt_chunk", "block size code 7")
    block = 4 << (layout & 7)
    use_history = bool(layout & 8)
    value_priors = bool(layout & 16)
    use_carried = bool(layout & 32)
    columns = bool(layout & 64)
    capped = bool(layout & 128)
    if use_carried and carried is None:
        fail("corrupt_chunk", "Carried without a carried model")
    need = 2 + use_history + 2 * columns + capped
    if len(body) < need:
        fail("truncated", "modelled chunk header")
    at = 1
    L = body[at]
    at += 1
    b3 = 0
    if use_history:
        b3 = body[at]
        at += 1
    period = 0
    if columns:
        period = body[at] | body[at + 1] << 8
        at += 2
    cap = 32
    if capped:
        cap = body[at]
        at += 1
        if cap > 32:
            fail("corrupt_chunk", "Rate_Cap above 32")
    if columns and period == 0:
        fail("corrupt_chunk", "Sign_Period 0")
    if use_history and history is None:
        fail("corrupt_chunk", "History without a history")
    if b3 > 15:
        fail("corrupt_chunk", "History_Boost above 15")
    stream = body[at:]

    # "Rates" and "Definitions"
    src = np.asarray(src, dtype=np.uint16)
    ratelog = np.clip(134 - ((src >> 7) & 0xFF).astype(np.int32), 0, 32)
    a = np.minimum(ratelog, cap)
    if use_history:
        h = np.asarray(history, dtype=np.uint8)
        hclass = np.minimum(h & 7, 3)
        boost = np.array([0, -32, -32, b3], dtype=np.int32)[hclass]
        a = np.clip(a + boost, 0, cap)
        age = (h & 7).astype(np.int32)
        hint = np.where(age == 0, 0, np.where(h & 8, 1, 2)).astype(np.int32)
        recent_idx = np.flatnonzero((age == 1) | (age == 2)).tolist()
        age_l = age.tolist()
        hint_l = hint.tolist()
    else:
        recent_idx = []
        age_l = None
        hint_l = None
    prefix = [0]
    acc = 0
    for r in (np.int64(1) << a.astype(np.int64)).tolist():
        acc += r
        prefix.append(acc)
    ratelog_l = ratelog.tolist()
    src_l = src.tolist()

    if use_carried:
        model = (list(carried[0]), list(carried[1]), list(carried[2]))
    else:
        model = initial_model(L, value_priors)
    rd = RangeDecoder(stream, model)
    bit = rd.bit
    counters = [0] * period if columns else None
    changes = {}

    def value(i):
        """"Value of a change at element i"."""
        ra = ratelog_l[i]
        g = hint_l[i] if hint_l is not None else 0
        k = 0
        base = UNARY + 15 * ra
        while k < 15 and bit(base + k):
            k += 1
        m = 1
        base = BITS + 16 * k
        for b in range(k - 1, -1, -1):
            m = 2 * m + bit(base + b)
        s = src_l[i]
        if counters is not None:
            col = i % period
            w = counters[col]
        else:
            w = 0
        if w:
            neg = bit(COLUMN + 4 * g + (w + (2 if w < 0 else 1)))
        else:
            neg = bit(SIGN + 66 * g + 33 * (s >> 15) + ra)
        if counters is not None:
            w += 1 if neg else -1
            counters[col] = -2 if w < -2 else (2 if w > 2 else w)
        changes[i] = from_key((key(s) + (-m if neg else m)) & 0xFFFF)

    # walk step 1: recent elements
    for i in recent_idx:
        if bit(RECENT + 33 * (age_l[i] - 1) + ratelog_l[i]):
            value(i)
    recent_set = set(recent_idx)
    on_recent = False

    # walk step 2: blocks and bisection
    def bisect(lo, hi):
        nonlocal on_recent
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            left = prefix[mid] - prefix[lo]
            right = prefix[hi] - prefix[mid]
            whole = log2q4(left + right)
            level = (whole - L + 48) >> 2
            level = 0 if level < 0 else (15 if level > 15 else level)
            if left <= right:
                t = 31 - min(whole - log2q4(left), 31)
            else:
                t = 32 + min(whole - log2q4(right), 31)
            if not bit(SPLIT + 64 * level + t):
                lo = mid
                continue
            ai = log2q4(right) - L + 64
            if not bit(ALSO + (0 if ai < 0 else (95 if ai > 95 else ai))):
                hi = mid
                continue
            bisect(lo, mid)
            lo = mid
        if lo in recent_set:
            on_recent = True
        value(lo)

    for u in range(0, length, block):
        v = min(u + block, length)
        if bit(BLOCK + min(log2q4(prefix[v] - prefix[u]), 191)):
            bisect(u, v)

    # walk step 3: checks
    if not rd.code < rd.range:
        fail("corrupt_chunk", "range coder ends with code >= range")
    if rd.pos < len(stream):
        fail("corrupt_chunk", "range stream bytes left unread")
    if len(stream) and stream[-1] == 0:
        fail("corrupt_chunk", "range stream ends in a 0 byte")
    if on_recent:
        fail("corrupt_chunk", "bisection placed a change on a recent element")
    if not changes:
        fail("corrupt_chunk", "modelled chunk without a change")
    dst = src.copy()
    idx = np.fromiter(changes.keys(), dtype=np.int64, count=len(changes))
    dst[idx] = np.fromiter(changes.values(), dtype=np.uint16, count=len(changes))
    return dst, model
