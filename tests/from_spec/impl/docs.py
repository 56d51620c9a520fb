"""The store's documents (PROTOCOL.md, "Documents"): shard record, layout, group index,
step root, latest pointer; keys ("Object layout").  Every rule that fails is
`corrupt_header` (a version other than 2: `unsupported_version`)."""
import re

from .errors import fail
from .hashing import hex16, xxh3_u64s
from .jsonstrict import Obj, check_u64, is_hex16, is_sha256, is_u64, loads
from .trust import is_envelope, parse_envelope

MAX_DOC = 64 << 20
MAX_STEP = 999_999_999_999
FAN_IN = 32  # kFanIn
INDEX_NAME = "model.safetensors.index.json"
_INCARNATION = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


# ---------------------------------------------------------------- keys ("Object layout")

def groups_of(count):
    return (count + FAN_IN - 1) // FAN_IN


def members_of(count, group):
    return min(FAN_IN, count - FAN_IN * group)


def root_key(step):
    return "steps/%012d.json" % step


def group_key(step, count, inc, group):
    return "groups/%012d/%05d/%s/%05d.json" % (step, count, inc, group)


def record_key(step, count, inc, shard):
    group = shard // FAN_IN
    hh = hex16(xxh3_u64s(step, (count << 32) | group))[:2]
    return "r/%s/%012d-%05d-%05d/%s/%05d.json" % (hh, step, count, group, inc, shard)


def object_key(step, count, shard, kind, h16):
    """kind: "delta", "anchor" (.a3d), "index" (.json), or "delta.sha256"/"anchor.sha256"."""
    hh = hex16(xxh3_u64s(step, (count << 32) | shard))[:2]
    ext = {"delta": ".a3d", "anchor": ".a3d", "index": ".json"}.get(kind)
    if ext is None:  # the sums object: {delta,anchor}-H16.sha256
        kind, ext = kind.split(".")[0], ".sha256"
    return "o/%s/%012d-%05d-%05d/%s-%s%s" % (hh, step, count, shard, kind, h16, ext)


def layout_key(h16):
    return "l/%s/%s.json" % (h16[:2], h16)


# ---------------------------------------------------------------- envelope and types

def valid_incarnation(v):
    return isinstance(v, str) and v not in (".", "..") and bool(_INCARNATION.match(v))


class Doc:
    """A parsed document: its fields as attributes, `signed` when stored as an envelope."""


def open_document(raw, kind, what, signable=True):
    """Unwrap an envelope if any, then check format, version and kind, in that order."""
    if len(raw) > MAX_DOC:
        fail("corrupt_header", "%s over 64 MiB" % what)
    doc = loads(raw, what=what)
    env = None
    if is_envelope(doc):
        if not signable:
            fail("corrupt_header", "%s is never signed" % what)
        env = parse_envelope(doc, "corrupt_header", what)
        doc = loads(env.payload, what=what + " payload")
        if is_envelope(doc):
            fail("corrupt_header", "%s: an envelope inside an envelope" % what)
    o = Obj(doc, what)
    if o.get("format") != "arc_v3-sync":
        o.bad("format is not \"arc_v3-sync\"")
    version = o.get("version")
    if not is_u64(version):
        o.bad("version is not a u64")
    if version != 2:
        fail("unsupported_version", "%s of version %d" % (what, version))
    if o.get("kind") != kind:
        o.bad("kind is not %r" % kind)
    d = Doc()
    d.envelope = env
    d.signed = env is not None
    return o, d


def _step(o, k, nullable=False):
    v = o.get(k)
    if v is None and nullable:
        return None
    return check_u64(v, o, k, MAX_STEP)


def _incarnation(o, k, nullable=False):
    v = o.get(k)
    if v is None and nullable:
        return None
    if not valid_incarnation(v):
        o.bad("%r is not an incarnation" % k)
    return v


def _count(o, k="count"):
    v = o.u64(k)
    if not 1 <= v <= 99_999:
        o.bad("count %d not in 1..99,999" % v)
    return v


def _named(o, v, signed, what):
    """A named document: [hex, u64], signed [hex, u64, sha256] ("Named document")."""
    n = 3 if signed else 2
    if not isinstance(v, list) or len(v) != n or not is_hex16(v[0]) or not is_u64(v[1]):
        o.bad("%s is not a [hex, u64%s]" % (what, ", sha256" if signed else ""))
    if signed and not is_sha256(v[2]):
        o.bad("%s: not a SHA-256" % what)
    return (int(v[0], 16), v[1], v[2] if signed else None)


def valid_file_name(v):
    """Record `file`: 1 to 255 bytes, no `/` or NUL, not starting with `.`, not the index."""
    return (isinstance(v, str) and 1 <= len(v.encode()) <= 255 and "/" not in v and "\0" not in v
            and not v.startswith(".") and v != INDEX_NAME)


# ---------------------------------------------------------------- shard record

class ObjectRef:
    pass


def _object_ref(o, k, rec, signed):
    v = o.get(k)
    if v is None:
        return None
    r = Obj(v, "%s %s" % (o.what, k))
    ref = ObjectRef()
    ref.kind = k
    ref.key = r.str_("key")
    ref.size = r.u64("size")
    ref.xxh3 = r.hex("xxh3")
    ref.head_size = r.u64("head_size")
    ref.head_xxh3 = r.hex("head_xxh3")
    ref.sha256 = ref.head_sha256 = ref.sums = None
    if signed:
        ref.sha256 = r.sha("sha256")
        ref.head_sha256 = r.sha("head_sha256")
        so = Obj(r.get("sums"), "%s %s sums" % (o.what, k))
        ref.sums = (so.u64("size"), so.sha("sha256"))
        so.done()
        if ref.sums[0] % 32 or ref.sums[0] > 64 << 20:
            r.bad("sums size is not a multiple of 32 up to 64 MiB")
    r.done()
    if not 40 <= ref.head_size <= ref.size:
        r.bad("head_size not in [40, size]")
    if ref.key != object_key(rec.step, rec.count, rec.shard, k, hex16(ref.xxh3)):
        r.bad("key is not the object key of its step, shard, count and xxh3")
    return ref


def parse_record(raw, what="shard record"):
    o, d = open_document(raw, "shard", what)
    d.raw = raw
    d.step = _step(o, "step")
    d.base_step = _step(o, "base_step", nullable=True)
    d.shard = o.u64("shard")
    d.count = _count(o)
    if d.shard >= d.count:
        o.bad("shard >= count")
    d.incarnation = _incarnation(o, "incarnation")
    d.base_incarnation = _incarnation(o, "base_incarnation", nullable=True)
    d.file = o.get("file")
    if not valid_file_name(d.file):
        o.bad("file %r" % (d.file,))
    d.file_size = o.u64("file_size")
    d.delta = _object_ref(o, "delta", d, d.signed)
    d.anchor = _object_ref(o, "anchor", d, d.signed)
    d.tensors_xxh3 = o.hex("tensors_xxh3")
    d.layout = _named(o, o.get("layout"), d.signed, "layout")  # the shard layout; readers need not read it
    o.time("published_at")
    d.index = None
    iv = o.get("index", optional=True)
    if "index" in o.v:
        io = Obj(iv, what + " index")
        idx = Doc()
        idx.key = io.str_("key")
        idx.size = io.u64("size")
        idx.xxh3 = io.hex("xxh3")
        idx.sha256 = io.sha("sha256") if d.signed else None
        io.done()
        if idx.size > 64 << 20:
            io.bad("index over 64 MiB")
        if idx.key != object_key(d.step, d.count, d.shard, "index", hex16(idx.xxh3)):
            io.bad("key is not the index key of its step, shard, count and xxh3")
        d.index = idx
    o.done()
    if d.base_step is not None and d.base_step >= d.step:
        o.bad("base_step >= step")
    if (d.base_step is None) != (d.delta is None):
        o.bad("base_step null iff delta null")
    if (d.base_incarnation is None) != (d.base_step is None):
        o.bad("base_incarnation null iff base_step null")
    if d.delta is None and d.anchor is None:
        o.bad("neither delta nor anchor")
    return d


# ---------------------------------------------------------------- layout

def parse_layout(raw, what="layout"):
    o, d = open_document(raw, "layout", what, signable=False)
    d.raw = raw
    shards = o.list_("shards")
    o.done()
    if not 1 <= len(shards) <= FAN_IN:
        o.bad("1 to 32 shards")
    d.shards = []
    for s in shards:
        so = Obj(s, what + " shard")
        f = so.get("file")
        if not valid_file_name(f):
            so.bad("file %r" % (f,))
        t = so.list_("tensors")
        so.done()
        if not all(isinstance(x, str) and x for x in t) or len(set(t)) != len(t):
            so.bad("tensor names are not non-empty unique strings")  # Layout: each name non-empty, none twice
        d.shards.append((f, list(t)))
    return d


# ---------------------------------------------------------------- group index

def parse_group(raw, what="group index"):
    o, d = open_document(raw, "group", what)
    d.raw = raw
    d.step = _step(o, "step")
    d.count = _count(o)
    d.incarnation = _incarnation(o, "incarnation")
    d.group = o.u64("group")
    if d.group >= groups_of(d.count):
        o.bad("group >= ceil(count / 32)")
    d.base_step = _step(o, "base_step", nullable=True)
    d.base_incarnation = _incarnation(o, "base_incarnation", nullable=True)
    d.anchors = o.bool_("anchors")
    d.chain_bytes = o.u64("chain_bytes")
    d.anchor_bytes = o.u64("anchor_bytes")
    o.time("published_at")
    d.layout = _named(o, o.get("layout"), d.signed, "layout")
    recs = o.list_("records")
    d.records = [_named(o, r, d.signed, "records entry") for r in recs]
    o.done()
    if d.base_step is not None and d.base_step >= d.step:
        o.bad("base_step >= step")
    if d.base_step is None and not d.anchors:
        o.bad("no base_step, and anchors is false")
    if (d.base_incarnation is None) != (d.base_step is None):
        o.bad("base_incarnation null iff base_step null")
    if not d.anchors and d.anchor_bytes:
        o.bad("anchor_bytes without anchors")
    if len(d.records) != members_of(d.count, d.group):
        o.bad("records entries are not the group's members")
    return d


# ---------------------------------------------------------------- step root

def parse_root(raw, what="step root"):
    o, d = open_document(raw, "step", what)
    d.raw = raw
    d.step = _step(o, "step")
    d.count = _count(o)
    d.incarnation = _incarnation(o, "incarnation")
    d.run = o.hex("run")
    if d.run == 0:
        o.bad("run 0000000000000000")
    d.base_step = _step(o, "base_step", nullable=True)
    d.base_root_xxh3 = o.hex("base_root_xxh3", nullable=True)
    d.anchor_step = _step(o, "anchor_step")
    d.chain_bytes = o.u64("chain_bytes")
    d.anchor_bytes = o.u64("anchor_bytes")
    o.time("published_at")
    o.time("committed_at")
    groups = o.list_("groups")
    d.groups = []
    for e in groups:
        n = 6 if d.signed else 4
        if not isinstance(e, list) or len(e) != n:
            o.bad("groups entry of %d values" % (len(e) if isinstance(e, list) else -1))
        if d.signed:
            d.groups.append((_named(o, e[0:3], True, "group index"), _named(o, e[3:6], True, "layout")))
        else:
            d.groups.append((_named(o, e[0:2], False, "group index"), _named(o, e[2:4], False, "layout")))
    d.base_root_sha256 = None
    if d.signed:
        d.base_root_sha256 = o.sha("base_root_sha256", nullable=True)
    o.done()
    if d.base_step is not None and d.base_step >= d.step:
        o.bad("base_step >= step")
    if (d.base_root_xxh3 is None) != (d.base_step is None):
        o.bad("base_root_xxh3 non-null iff base_step")
    if d.base_root_xxh3 == 0:
        o.bad("base_root_xxh3 0000000000000000")
    if d.signed and (d.base_root_sha256 is None) != (d.base_step is None):
        o.bad("base_root_sha256 non-null iff base_step")
    if d.anchor_step > d.step:
        o.bad("anchor_step > step")
    if d.base_step is None and d.anchor_step != d.step:
        o.bad("a step without base is an anchor step")
    if d.anchor_step != d.step and d.base_step is not None and d.anchor_step > d.base_step:
        o.bad("anchor_step > base_step")
    d.is_anchor = d.anchor_step == d.step
    if bool(d.anchor_bytes) != d.is_anchor:
        o.bad("anchor_bytes non-zero iff anchor step")
    if len(d.groups) != groups_of(d.count):
        o.bad("groups entries are not ceil(count / 32)")
    return d


def parse_latest(raw, what="latest"):
    o, d = open_document(raw, "latest", what, signable=False)
    d.step = _step(o, "step")
    o.done()
    return d
