"""Strict JSON reading shared by the container manifest and the store's documents:
RFC 8259 only (no NaN/Infinity), an object naming a member twice is refused
(PROTOCOL.md, "Notices"), and typed field accessors."""
import json
import re

from .errors import fail

_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


class _Dup(Exception):
    pass


def _pairs(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise _Dup(k)
        obj[k] = v
    return obj


def _no_constant(name):
    raise ValueError("not JSON: %s" % name)


def loads(data, code="corrupt_header", what="document"):
    """Parse UTF-8 JSON bytes; any failure is `code`."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        fail(code, "%s is not UTF-8" % what)
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except _Dup as e:
        fail(code, "%s names member %r twice" % (what, e.args[0]))
    except (ValueError, RecursionError) as e:
        fail(code, "%s is not JSON: %s" % (what, e))


class Obj:
    """Typed access to one JSON object's fields; every failure is `code` (default
    corrupt_header).  `done()` refuses fields that were not asked for."""

    def __init__(self, value, what, code="corrupt_header"):
        if not isinstance(value, dict):
            fail(code, "%s is not an object" % what)
        self.v = value
        self.what = what
        self.code = code
        self.seen = set()

    def bad(self, msg):
        fail(self.code, "%s: %s" % (self.what, msg))

    def has(self, k):
        return k in self.v

    def get(self, k, optional=False):
        self.seen.add(k)
        if k not in self.v:
            if optional:
                return None
            self.bad("missing field %r" % k)
        return self.v[k]

    def done(self):
        extra = set(self.v) - self.seen
        if extra:
            self.bad("unknown field(s) %s" % sorted(extra))

    # typed accessors
    def u64(self, k, nullable=False, optional=False, maximum=(1 << 64) - 1):
        v = self.get(k, optional)
        if v is None and (nullable or (optional and k not in self.v)):
            return None
        return check_u64(v, self, k, maximum)

    def str_(self, k, nullable=False):
        v = self.get(k)
        if v is None and nullable:
            return None
        if not isinstance(v, str):
            self.bad("%r is not a string" % k)
        return v

    def hex(self, k, nullable=False, optional=False):
        v = self.get(k, optional)
        if v is None and (nullable or (optional and k not in self.v)):
            return None
        return check_hex(v, self, k)

    def sha(self, k, nullable=False, optional=False):
        v = self.get(k, optional)
        if v is None and (nullable or (optional and k not in self.v)):
            return None
        if not isinstance(v, str) or not _SHA256.match(v):
            self.bad("%r is not a SHA-256" % k)
        return v

    def list_(self, k):
        v = self.get(k)
        if not isinstance(v, list):
            self.bad("%r is not an array" % k)
        return v

    def bool_(self, k):
        v = self.get(k)
        if not isinstance(v, bool):
            self.bad("%r is not a bool" % k)
        return v

    def time(self, k):
        v = self.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            self.bad("%r is not a time" % k)
        return v


def is_u64(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def check_u64(v, obj, k, maximum=(1 << 64) - 1):
    if not is_u64(v) or v > maximum:
        obj.bad("%r is not a u64 (<= %d)" % (k, maximum))
    return v


def is_hex16(v):
    return isinstance(v, str) and bool(_HEX16.match(v))


def is_sha256(v):
    return isinstance(v, str) and bool(_SHA256.match(v))


def check_hex(v, obj, k):
    if not is_hex16(v):
        obj.bad("%r is not 16 lowercase hex digits" % k)
    return int(v, 16)
