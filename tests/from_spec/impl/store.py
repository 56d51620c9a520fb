"""Pulling a step from a protocol-2 local store (src/sync/PROTOCOL.md, "Pulling",
"Documents", "Signed steps") into the files a region's directory holds.

`pull(store_dir, step=None, trust=(), tensors=None, rows=None)` returns {path: bytes}, the
files outside .arc_v3/, or raises ArcError with a name of PROTOCOL.md "Errors"."""
import hashlib
import re

from . import apply, container as ctr, docs
from .errors import ArcError, fail
from .hashing import hex16, tensor_list_checksum, xxh3
from .localstore import LocalStore
from .trust import load_trust_file, verify_envelope

PROBE = 16  # "HEADing up to 16 following roots"
_UNTRUSTED_UNDER_KEYS = ("corrupt_chunk", "corrupt_header", "truncated", "unsupported_version")


def _sha(b):
    return hashlib.sha256(b).hexdigest()


class Puller:
    def __init__(self, store_dir, keys, regex, rows):
        self.store = LocalStore(store_dir)
        self.keys = keys            # trusted keys (empty: no trust)
        self.regex = regex          # compiled, or None
        self.partial = regex is not None or rows is not None
        self.sel_lo = rows[0] if rows else 0
        self.sel_hi = rows[1] if rows else None
        self.layouts = {}           # layout xxh3 -> parsed layout (each once per pull)

    # ------------------------------------------------------------ named documents

    def named(self, key, ref, what):
        """Fetch a named document: exactly its size and XXH3 (`corrupt_chunk`), its SHA-256
        where named (`untrusted`); trusting: SHA-256 first, and required ("Named
        document", "Trusting readers" 2)."""
        h, size, sha = ref
        raw = self.store.get(key)
        if self.keys:
            if sha is None:
                fail("untrusted", "%s named without a SHA-256" % what)
            if _sha(raw) != sha:
                fail("untrusted", "%s differs from its SHA-256" % what)
        if len(raw) != size or xxh3(raw) != h:
            fail("corrupt_chunk", "%s is not the document its namer names" % what)
        if sha is not None and _sha(raw) != sha:
            fail("untrusted", "%s passes its XXH3 but not its SHA-256" % what)
        return raw

    # ------------------------------------------------------------ roots and the route

    def root(self, n):
        raw = self.store.get(docs.root_key(n))
        r = docs.parse_root(raw, "root of step %d" % n)
        if r.step != n:
            fail("corrupt_header", "root of step %d names step %d" % (n, r.step))
        if self.keys:  # "Trusting readers" 1: signed by a trusted key
            if not r.signed:
                fail("untrusted", "root of step %d is not signed" % n)
            if not verify_envelope(r.envelope, self.keys):
                fail("untrusted", "root of step %d is signed by no trusted key" % n)
        return r

    def target(self, step):
        """Step T: the given one, or `latest` then up to 16 following roots ("Pulling")."""
        if step is not None:
            if not self.store.exists(docs.root_key(step)):
                # tell a version-1 store from a step not committed yet
                try:
                    raw = self.store.get("latest")
                except ArcError:
                    raw = None
                if raw is not None:
                    try:
                        docs.parse_latest(raw)
                    except ArcError as e:
                        if e.code == "unsupported_version":
                            raise
                fail("not_found", "no root for step %d" % step)
            return step
        raw = self.store.get("latest")
        t = docs.parse_latest(raw).step
        if not self.store.exists(docs.root_key(t)):
            fail("not_found", "latest names step %d, which has no root" % t)
        last = t
        for k in range(1, PROBE + 1):
            if t + k > docs.MAX_STEP or not self.store.exists(docs.root_key(t + k)):
                break
            last = t + k
        return last

    def route(self, t):
        """The anchor route: T's roots back through base_step to its anchor_step A; returns
        the roots from A to T ("Route")."""
        rt = self.root(t)
        a = rt.anchor_step
        chain = [rt]
        cur = rt
        while cur.step != a:
            if cur.base_step is None or cur.base_step < a:
                fail("corrupt_header", "step %d has no base leading to anchor step %d" % (cur.step, a))
            try:
                b = self.root(cur.base_step)
            except ArcError as e:
                if e.code == "not_found":
                    fail("not_found", "no route: root of step %d is gone" % cur.base_step)
                raise
            self.check_link(cur, b)
            chain.append(b)
            cur = b
        if not cur.is_anchor:
            fail("corrupt_header", "step %d is not an anchor step" % a)
        return chain[::-1]

    def check_link(self, later, base):
        """A later root names its base root by base_root_xxh3 (and signed, base_root_sha256)."""
        if self.keys and _sha(base.raw) != later.base_root_sha256:
            fail("untrusted", "root of step %d is not the one step %d names" % (base.step, later.step))
        # "Reading a route": base_root_xxh3 pins the base root's bytes, as a named document.
        if later.base_root_xxh3 is not None and xxh3(base.raw) != later.base_root_xxh3:
            fail("corrupt_chunk", "root of step %d is not the one step %d names" % (base.step, later.step))
        if base.count != later.count:
            fail("corrupt_header", "step %d has %d shards, its base %d" % (later.step, later.count, base.count))
        if not later.is_anchor and later.anchor_step != base.anchor_step:
            fail("corrupt_header", "step %d's anchor_step is not its base's" % later.step)

    # ------------------------------------------------------------ reading a step

    def layout(self, r, g):
        idx_ref, lay_ref = r.groups[g]
        h = lay_ref[0]
        if h not in self.layouts:
            raw = self.named(docs.layout_key(hex16(h)), lay_ref, "layout %s" % hex16(h))
            self.layouts[h] = docs.parse_layout(raw)
        lay = self.layouts[h]
        if self.keys and _sha(lay.raw) != lay_ref[2]:
            fail("untrusted", "layout %s differs from its SHA-256" % hex16(h))
        if len(lay.shards) != docs.members_of(r.count, g):  # rule 2
            fail("corrupt_header", "layout of group %d lists %d shards" % (g, len(lay.shards)))
        return lay

    def group_index(self, r, g):
        idx_ref, lay_ref = r.groups[g]
        key = docs.group_key(r.step, r.count, r.incarnation, g)
        gi = docs.parse_group(self.named(key, idx_ref, "group index %d of step %d" % (g, r.step)))
        # rule 1
        if (gi.step, gi.count, gi.incarnation, gi.group) != (r.step, r.count, r.incarnation, g):
            fail("corrupt_header", "group index %d is not the one of its key" % g)
        if gi.layout[:2] != lay_ref[:2] or (
                gi.layout[2] and lay_ref[2] and gi.layout[2] != lay_ref[2]):
            fail("corrupt_header", "group index %d names another layout than the root" % g)
        if gi.base_step is not None and (r.base_step is not None or not gi.anchors) \
                and gi.base_step != r.base_step:
            fail("corrupt_header", "group index %d names another base step" % g)
        if r.is_anchor and not gi.anchors:
            fail("corrupt_header", "anchor step with a group without anchors")
        return gi

    def record(self, r, gi, k):
        g = k // docs.FAN_IN
        key = docs.record_key(r.step, r.count, r.incarnation, k)
        raw = self.named(key, gi.records[k - docs.FAN_IN * g], "record of shard %d of step %d" % (k, r.step))
        rec = docs.parse_record(raw, "record of shard %d of step %d" % (k, r.step))
        # rule 4
        if (rec.step, rec.shard, rec.count, rec.incarnation) != (r.step, k, r.count, r.incarnation):
            fail("corrupt_header", "record of shard %d is not the one of its key" % k)
        if r.is_anchor and rec.anchor is None:
            fail("corrupt_header", "record of shard %d of an anchor step has no anchor" % k)
        if rec.delta is not None and (r.base_step is not None or not r.is_anchor) and (
                rec.base_step != r.base_step or rec.base_incarnation != gi.base_incarnation):
            fail("corrupt_header", "record of shard %d continues another base" % k)
        if self.keys and not rec.signed:
            fail("untrusted", "record of shard %d is not signed" % k)
        return rec

    def read_full(self, r):
        """A full read: every group index and record, rules 1, 3, 4, 6."""
        gis = [self.group_index(r, g) for g in range(len(r.groups))]
        if sum(gi.chain_bytes for gi in gis) != r.chain_bytes:  # rule 3
            fail("corrupt_header", "group chain_bytes do not sum to the root's")
        if any(gi.anchors != r.is_anchor for gi in gis):
            fail("corrupt_header", "group anchors disagree with the root")
        if r.is_anchor and sum(gi.anchor_bytes for gi in gis) != r.anchor_bytes:
            fail("corrupt_header", "group anchor_bytes do not sum to the root's")
        recs = [self.record(r, gis[k // docs.FAN_IN], k) for k in range(r.count)]
        files = [rec.file for rec in recs]
        if len(set(files)) != len(files):  # rule 6
            fail("corrupt_header", "shard file names repeat")
        return recs

    # ------------------------------------------------------------ objects

    def container_whole(self, ref, what, rec):
        """A whole download: its ObjectRef size and xxh3 (and sha256 under trust)."""
        raw = self.store.get(ref.key)
        if self.keys and _sha(raw) != ref.sha256:
            fail("untrusted", "%s differs from its SHA-256" % what)
        if len(raw) < ref.size:
            fail("truncated", "%s is shorter than its ObjectRef" % what)
        if len(raw) != ref.size or xxh3(raw) != ref.xxh3:
            fail("corrupt_chunk", "%s differs from its ObjectRef" % what)
        head = raw[:ref.head_size]
        if xxh3(head) != ref.head_xxh3:
            fail("corrupt_chunk", "%s head differs from its ObjectRef" % what)
        if ref.head_sha256 is not None and _sha(head) != ref.head_sha256:
            fail("untrusted", "%s head passes its XXH3 but not its SHA-256" % what)
        c = self.open_container(head, ref, what, rec)
        base = c.head_size
        return c, lambda off, size: raw[base + off:base + off + size]

    def container_head(self, ref, what, rec):
        """A partial read: bytes [0, head_size) by head_xxh3 (head_sha256 under trust)."""
        head = self.store.get_range(ref.key, 0, ref.head_size)
        if self.keys and _sha(head) != ref.head_sha256:
            fail("untrusted", "%s head differs from its SHA-256" % what)
        if len(head) < ref.head_size:
            fail("truncated", "%s is shorter than its ObjectRef" % what)
        if xxh3(head) != ref.head_xxh3:
            fail("corrupt_chunk", "%s head differs from its ObjectRef" % what)
        if ref.head_sha256 is not None and _sha(head) != ref.head_sha256:
            fail("untrusted", "%s head passes its XXH3 but not its SHA-256" % what)
        c = self.open_container(head, ref, what, rec)
        digests = self.sums(ref, c, what, rec) if self.keys else None
        key = ref.key

        def fetch(off, size):
            b = self.store.get_range(key, c.head_size + off, size)
            if len(b) < size:
                fail("truncated", "%s is shorter than its ObjectRef" % what)
            if digests is not None and _sha(b) != digests.get((off, size)):
                fail("untrusted", "%s range %d+%d differs from its digest" % (what, off, size))
            return b
        return c, fetch

    def check_onto(self, route, si, rec, ref, what):
        """"Reading a route": a delta applied onto the previous step of the route continues
        that step's root's incarnation (its count was checked with the link)."""
        if ref.kind == "delta" and si > 0 and rec.base_incarnation != route[si - 1].incarnation:
            fail("corrupt_header", "%s continues incarnation %s, not %s" % (
                what, rec.base_incarnation, route[si - 1].incarnation))

    def open_container(self, head, ref, what, rec):
        """Exactly one File, the record's `file` and `file_size` ("Reading a step")."""
        c = ctr.read_head(head, ref.size)
        if c.head_size != ref.head_size:
            fail("corrupt_header", "%s: head_size is not 40 + M" % what)
        if c.layout != "file" or len(c.files) != 1:
            fail("corrupt_header", "%s is not a one-file container" % what)
        f = c.files[0]
        if f.name != rec.file or f.size != rec.file_size:
            fail("corrupt_header", "%s is not the record's file" % what)
        return c

    def sums(self, ref, c, what, rec):
        """Piece digests ("Piece digests"): SHA-256 of every non-empty range the manifest
        names, by offset; checked by the record's `sums`."""
        key = docs.object_key(rec.step, rec.count, rec.shard, ref.kind + ".sha256", hex16(ref.xxh3))
        raw = self.store.get(key)
        if len(raw) != ref.sums[0] or _sha(raw) != ref.sums[1]:
            fail("untrusted", "%s piece digests differ from the record's sums" % what)
        f = c.files[0]
        ranges = [(f.header.offset, f.header.size)]
        if f.fill is not None:
            ranges.append((f.fill.offset, f.fill.size))
        for t in f.tensors:
            ranges += [(p.offset, p.size) for p in t.pieces]
        ranges += [(g.offset, g.size) for g in f.groups]
        ranges = sorted(set(r for r in ranges if r[1] > 0))
        if len(raw) != 32 * len(ranges):
            fail("untrusted", "%s piece digests do not match its ranges" % what)
        return {r: raw[32 * i:32 * i + 32].hex() for i, r in enumerate(ranges)}

    # ------------------------------------------------------------ pulls

    def pull(self, step):
        t = self.target(step)
        route = self.route(t)
        if self.partial:
            return self.pull_partial(route)
        return self.pull_full(route)

    def pull_full(self, route):
        recs = [self.read_full(r) for r in route]
        count = route[-1].count
        held = [dict() for _ in range(count)]
        files = {}
        for si, r in enumerate(route):
            for k in range(count):
                rec = recs[si][k]
                ref = rec.anchor if si == 0 or rec.delta is None else rec.delta
                what = "%s of shard %d of step %d" % (ref.kind, k, r.step)
                self.check_onto(route, si, rec, ref, what)
                c, fetch = self.container_whole(ref, what, rec)
                f = c.files[0]
                held[k], files[k] = apply.apply_file(f, fetch, held[k] if ref.kind == "delta" else {})
                if si == len(route) - 1:
                    self.check_results(f, held[k], files[k], rec, what)
        out = {}
        last = recs[-1]
        for k in range(count):
            out[last[k].file] = files[k]
        for rec in last:  # the lowest shard's index file
            if rec.index is not None:
                raw = self.store.get(rec.index.key)
                if self.keys and _sha(raw) != rec.index.sha256:
                    fail("untrusted", "index file differs from its SHA-256")
                if len(raw) != rec.index.size or xxh3(raw) != rec.index.xxh3:
                    fail("corrupt_header", "index file differs from its record")
                if rec.index.sha256 is not None and _sha(raw) != rec.index.sha256:
                    fail("untrusted", "index file passes its XXH3 but not its SHA-256")
                out[docs.INDEX_NAME] = raw
                break
        return out

    def check_results(self, f, held, data, rec, what):
        """The tensor-list checksum of T's results against the record's `tensors_xxh3`
        (`corrupt_header`)."""
        # data-section order: ascending offset, then name bytewise ("Shard record")
        ts = _data_order(f.tensors)
        got = []
        for t in ts:
            if t.group is None:
                got.append((t.name, t.target_xxh3))
            else:
                got.append((t.name, apply.result_checksum(t.shape, t.esize, held[t.name].data)))
        if tensor_list_checksum(got) != rec.tensors_xxh3:
            fail("corrupt_header", "%s: results differ from the record's tensors_xxh3" % what)

    def matches(self, name):
        return self.regex is None or self.regex.fullmatch(name) is not None

    def pull_partial(self, route):
        count = route[-1].count
        # every step's layouts first; a shard is touched if a layout lists a match
        lays = [[self.layout(r, g) for g in range(len(r.groups))] for r in route]
        touched = set()
        for r, ls in zip(route, lays):
            for g, lay in enumerate(ls):
                for i, (fname, names) in enumerate(lay.shards):
                    if any(self.matches(n) for n in names):
                        touched.add(docs.FAN_IN * g + i)
        # then per step the group indexes holding a touched shard, the touched records
        recs = []
        for r, ls in zip(route, lays):
            gis = {}
            step_recs = {}
            for k in sorted(touched):
                g = k // docs.FAN_IN
                if g not in gis:
                    gis[g] = self.group_index(r, g)
                rec = self.record(r, gis[g], k)
                fname, names = ls[g].shards[k - docs.FAN_IN * g]
                if rec.file != fname:  # rule 5
                    fail("corrupt_header", "record of shard %d differs from its layout" % k)
                step_recs[k] = rec
            files = [lay_f for ls_g in ls for lay_f, _ in ls_g.shards]
            if len(set(files)) != len(files):  # rule 6
                fail("corrupt_header", "shard file names repeat")
            recs.append(step_recs)
        # heads of every container of the route, for the touched shards
        heads = []
        for si, r in enumerate(route):
            step_heads = {}
            for k in sorted(touched):
                rec = recs[si][k]
                ref = rec.anchor if si == 0 or rec.delta is None else rec.delta
                what = "%s of shard %d of step %d" % (ref.kind, k, r.step)
                self.check_onto(route, si, rec, ref, what)
                c, fetch = self.container_head(ref, what, rec)
                lay = lays[si][k // docs.FAN_IN].shards[k % docs.FAN_IN]
                if [t.name for t in _data_order(c.files[0].tensors)] != lay[1]:
                    fail("corrupt_header", "%s: its tensors are not its layout's" % what)
                step_heads[k] = (ref, c.files[0], fetch, what)
            heads.append(step_heads)
        # what each container needs ("Partial pulls")
        grp_match = {k: any(apply.groupable(t) and self.matches(t.name)
                            for sh in heads for t in sh[k][1].tensors) for k in touched}
        out = {}
        for k in range(count):
            held = {}
            if k in touched:
                for si in range(len(route)):
                    ref, f, fetch, what = heads[si][k]
                    rec = recs[si][k]
                    need = self._need_fn(grp_match[k])
                    held, _ = apply.apply_file(f, fetch, held if ref.kind == "delta" else {}, need)
                    if si == len(route) - 1:
                        fname = rec.file
                        chosen = [t for t in f.tensors if self.matches(t.name)]  # manifest order
            else:
                g = k // docs.FAN_IN
                fname = lays[-1][g].shards[k - docs.FAN_IN * g][0]
                chosen = []
            out[fname] = apply.partial_file(chosen, held, self.sel_lo, self.sel_hi)
        return out

    def _need_fn(self, shard_groupable_match):
        a, b = self.sel_lo, self.sel_hi

        def need(t):
            if t.nbytes == 0:
                return (0, t.rows) if self.matches(t.name) else None
            if apply.groupable(t) and shard_groupable_match:
                return (0, t.rows)
            if not self.matches(t.name):
                return None
            if t.group is not None or not t.shape:  # grouped: all rows; rank 0: its row
                return (0, t.rows)
            r0 = min(a, t.rows)
            r1 = t.rows if b is None else min(b, t.rows)
            if r1 <= r0:
                return None
            lo = hi = None
            for p in t.pieces:  # round out to whole pieces
                if p.r1 > r0 and p.r0 < r1:
                    lo = p.r0 if lo is None else lo
                    hi = p.r1
            return (lo, hi)
        return need


def _data_order(tensors):
    """Data-section order ("Tensor-list checksum"): ascending offset, then name bytewise."""
    return sorted(tensors, key=lambda t: (t.data_offset, t.name.encode()))


def pull(store_dir, step=None, trust=(), tensors=None, rows=None):
    keys = []
    for path in trust or ():
        keys += load_trust_file(path)
    regex = None
    if tensors is not None:
        try:
            regex = re.compile(tensors)
        except re.error as e:
            fail("invalid_argument", "tensor regex: %s" % e)
    p = Puller(store_dir, keys, regex, rows)
    try:
        return p.pull(step)
    except ArcError as e:
        if keys and e.code in _UNTRUSTED_UNDER_KEYS:
            raise ArcError("untrusted", "%s (%s under trust)" % (e.message, e.code))
        raise
