"""Cross-region sync from and into memory: a trainer's ranks publish their tensors to an
object store after each optimizer step; rollout engines follow the store and update their
tensors in place (src/sync/PROTOCOL.md: the same protocol as ``arc_v3 publish`` /
``arc_v3 pull``, so both sides mix freely with the command line).

    # each trainer rank (its FSDP/TP slice: whatever tensors it holds)
    publisher = arc_v3.sync.Publisher("s3://bucket/run7", shard=rank, count=world)
    publisher.publish(step, model.state_dict())

    # each rollout engine
    follower = arc_v3.sync.Follower("s3://bucket/run7")
    step = follower.pull()            # the newest step
    weights = follower.state_dict     # name -> tensor; later pulls update these in place

Stores: ``s3://BUCKET/PREFIX`` (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``), a directory, or for
followers a read-only ``http(s)://`` URL in front of the bucket.

Tensors are CPU ``torch.Tensor``s (bfloat16, float16/32/64, int8/16/32/64, uint8, bool) or
NumPy arrays (uint16 arrays are BF16 bit patterns, as everywhere in arc_v3). The GIL is
released while data moves. Errors raise :class:`arc_v3.ArcV3Error` with the cause
(``checksum_mismatch``: wrong base; ``corrupt_chunk``: a damaged piece; ``not_found``: no
such step; ``unavailable`` / ``permission_denied``: the store).

Memory: a Publisher keeps a copy of the tensors it published last (the base of its next
delta): as many bytes as its tensors. A Follower holds its tensors, and while a step is
applied the step's changes (about 10 bytes per changed value) and one decoded piece (at
most 2^21 values) per thread; an anchor is read piece by piece.
"""

import os
import sys

import numpy as np

from arc_v3 import _arc_v3 as _ext

__all__ = ["Follower", "Publisher", "keygen", "mirror"]

# safetensors dtype <-> torch dtype name / numpy dtype.
_TORCH = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8",
          "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "BOOL": "bool"}
_FROM_TORCH = {name: st for st, name in _TORCH.items()}
_NUMPY = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
          "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_,
          "U16": np.uint16, "U32": np.uint32, "U64": np.uint64}
_FROM_NUMPY = {np.dtype(np.uint16): "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
               np.dtype(np.float64): "F64", np.dtype(np.int8): "I8", np.dtype(np.int16): "I16",
               np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8",
               np.dtype(np.bool_): "BOOL", np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64"}


def _torch():
    return sys.modules.get("torch")


def _entry(name, value):
    """(name, safetensors dtype, shape, C-contiguous buffer) of a tensor or an array."""
    if not isinstance(name, str):
        raise TypeError(f"state dict keys must be str, got {type(name).__name__}")
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"{name!r} is on {value.device}; move it to the CPU first")
        dtype = _FROM_TORCH.get(str(value.dtype).replace("torch.", ""))
        if dtype is None:
            raise TypeError(f"{name!r} has dtype {value.dtype}; supported: {', '.join(_FROM_TORCH)}")
        t = value.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return name, dtype, list(value.shape), t.reshape(-1).view(torch.uint8).numpy()
    if isinstance(value, np.ndarray):
        dtype = _FROM_NUMPY.get(value.dtype.newbyteorder("=") if value.dtype.byteorder == ">" else value.dtype)
        if dtype is None:
            raise TypeError(f"{name!r} has numpy dtype {value.dtype}, which safetensors cannot hold")
        a = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        return name, dtype, list(value.shape), a.reshape(-1).view(np.uint8)
    raise TypeError(f"{name!r} is a {type(value).__name__}, not a torch.Tensor or numpy array")


def keygen(path):
    """Writes a new Ed25519 key pair for signed steps: ``path`` (the private key, mode 0600,
    for ``Publisher(sign_key=)``) and ``path + ".pub"`` (for ``Follower(trusted_keys=)``),
    PEM files as ``openssl genpkey -algorithm ed25519`` writes; neither may exist. Returns
    the key id that signatures name."""
    return _ext.keygen(str(path))


def mirror(src, dst, *, step=None, trusted_keys=None, follow=False, interval=2.0, until=None,
           max_failures=10, on_step=None, on_wait=None, work_dir=None, parallel=8, retries=5,
           connections=8, events=None):
    """Copies the trainer's committed steps from store ``src`` into store ``dst`` in a
    region, byte for byte, as ``arc_v3 mirror`` does (src/sync/MIRRORING.md, "Mirroring"):
    hosts then pull and follow ``dst`` as they would ``src``, signed steps included. ``dst``
    is a valid store at every moment; a mirror stopped anywhere resumes; prune ``dst`` on
    its own. ``src`` may be a read-only ``http(s)://`` URL; a local ``dst`` is created.

    Once (``follow=False``): copies up to ``step`` (None: the newest) and returns a dict:
    ``from_step`` and ``step`` (``dst``'s latest before and after), ``up_to_date``,
    ``steps_copied``, ``copied_objects`` / ``copied_bytes``, ``skipped_objects`` /
    ``skipped_bytes`` (already in ``dst``), ``fetched_bytes`` (read from ``src``) and
    ``seconds``.

    ``follow=True``: mirrors each new step in the loop ``Follower.follow`` runs and returns
    ``dst``'s step once it is ``until`` or later, or when ``on_step(step, result)`` returns
    False; ``on_wait(kind, message)`` as for ``Follower.follow``. ``events="HOST:PORT"``
    also listens there for ``src``'s bucket notifications, as ``Follower.follow`` does.

    ``trusted_keys``: PEM public key files; with any, only steps signed by one of them
    whose every document and byte has its signed SHA-256 are copied (``untrusted``
    otherwise; following, such a step is reported to ``on_wait`` as ``"refused"``)."""
    keys = [str(k) for k in (trusted_keys or [])]
    args = (str(src), str(dst))
    tail = (str(work_dir or ""), int(parallel), int(retries), int(connections))
    if not follow:
        if events is not None:
            raise ValueError("events wakes a following mirror: give follow=True too")
        return _ext.mirror(*args, None if step is None else int(step), keys, *tail)
    held = [None]

    def on_event(kind, result, message, failures):
        if kind != "pulled":
            return on_wait is None or on_wait(kind, message) is not False
        held[0] = result["step"]
        return on_step is None or on_step(result["step"], result) is not False

    _ext.mirror_follow(*args, keys, *tail, float(interval), None if until is None else int(until),
                       int(max_failures), "" if events is None else str(events), on_event)
    return held[0]


class Publisher:
    """A trainer rank's publisher: ``publish(step, state_dict)`` after each step.

    Args:
        store: the store URL (see the module's docstring).
        shard, count: this rank publishes shard ``shard`` of ``count`` (its rank and the
            world size, for a rank per shard); the rank that completes a step commits it.
        anchor_every: every this many steps (and at a rank's first step) the tensors also
            travel whole, so that a region that fell behind or starts fresh needs no chain.
        effort: codec effort 0..3 (None: the library default); threads: 0 = all cores; file_name: the shard's file name
            in a region's directory (default ``model-KKKKK-of-NNNNN.safetensors``).
        incarnation: which start of the trainer this is (default ``$ARC_V3_INCARNATION``,
            else torchrun's ``restart-$TORCHELASTIC_RESTART_COUNT``, else ``"0"``): a trainer
            restarted mid-step publishes under a new one, whose records supersede the old
            ones' until the step is committed; every rank of one start must name the same.
        sign_key: a PEM Ed25519 private key file (``arc_v3 keygen``; default
            ``$ARC_V3_SIGN_KEY``, else none): the rank signs its record, and the group index or
            step it completes once the records it read are signed by the same key.
    """

    def __init__(self, store, shard=0, count=1, *, anchor_every=10, effort=None, threads=0,
                 file_name=None, retries=5, connections=8, incarnation=None, sign_key=None):
        if sign_key is None:
            sign_key = os.environ.get("ARC_V3_SIGN_KEY", "")
        self._ext = _ext.Publisher(str(store), int(shard), int(count), int(anchor_every),
                                   _ext.DEFAULT_EFFORT if effort is None else int(effort), int(threads), file_name or "", int(retries),
                                   int(connections), incarnation or "", str(sign_key))

    def publish(self, step, state_dict):
        """Publishes ``state_dict`` (this rank's tensors) as ``step``; returns a dict with
        ``committed``, ``pending``, ``delta_bytes``, ``anchor_bytes``, ``uploaded_bytes`` and
        ``seconds`` per phase. The same step again with the same tensors is a no-op."""
        entries = [_entry(name, value) for name, value in state_dict.items()]
        return self._ext.publish(int(step), entries)

    @property
    def last_step(self):
        """The last step published, or None."""
        return self._ext.last_step

    @property
    def held_bytes(self):
        """Bytes of the copy kept of the last step (the next delta's base)."""
        return self._ext.held_bytes


class Follower:
    """A rollout engine's follower: ``pull()`` makes ``state_dict`` the newest step.

    Args:
        store: the store URL (see the module's docstring).
        tensors: only tensors whose whole name matches this regex (ECMAScript);
        rows: ``(begin, end)``: only these rows of their first dimension (a tensor-parallel
            rank's slice); ``state_dict`` then holds the slices.
        into: a dict of the caller's own tensors to update (same names; full rows): pulls
            write into them in place (a full pull), or copy the slices into them (with
            ``rows``).
        torch: build torch tensors (default: if torch is imported), else NumPy arrays.
        trusted_keys: PEM public key files (several: a key rotated mid-run). With any, ``pull``
            takes only steps signed by one of them, every byte checked against its signed
            SHA-256, never an older step or another run than the one held (``ArcV3Error``
            ``untrusted``, before any byte is decoded). None: steps are not authenticated.
    """

    def __init__(self, store, *, tensors=None, rows=None, into=None, threads=0, retries=5,
                 connections=8, torch=None, trusted_keys=None):
        begin, end = (0, None) if rows is None else rows
        self._rows = None if rows is None else (int(begin or 0), None if end is None else int(end))
        self._into = into
        self._torch = (_torch() is not None) if torch is None else bool(torch)
        if self._torch:
            import torch as _t  # noqa: F401 - the tensors are torch tensors
        self._storage = {}  # name -> (held tensor of rows [row_begin, row_end), row_begin)
        self._state = {}
        self._ext = _ext.Follower(str(store), tensors or "", int(begin or 0),
                                  2**64 - 1 if end is None else int(end), int(threads),
                                  int(retries), int(connections),
                                  [str(k) for k in (trusted_keys or [])], self._allocate)
        self.last_result = None

    def _allocate(self, name, dtype, shape, row_begin, row_end):
        rows = [row_end - row_begin] + list(shape[1:]) if shape else []
        target = None
        if self._into is not None and self._rows is None and name in self._into:
            target = self._into[name]
            if tuple(target.shape) != tuple(shape) or self._dtype_of(target) != dtype:
                target = None  # not the same tensor: the follower holds its own
        if target is None:
            if self._torch:
                import torch
                target = torch.empty(rows, dtype=getattr(torch, _TORCH[dtype]))
            else:
                target = np.empty(rows, dtype=_NUMPY[dtype])
        self._storage[name] = (target, row_begin)
        return self._bytes_of(target)

    def _dtype_of(self, value):
        torch = _torch()
        if torch is not None and isinstance(value, torch.Tensor):
            return _FROM_TORCH.get(str(value.dtype).replace("torch.", ""))
        return _FROM_NUMPY.get(value.dtype)

    @staticmethod
    def _bytes_of(value):
        torch = _torch()
        if torch is not None and isinstance(value, torch.Tensor):
            if not value.is_contiguous() or value.device.type != "cpu":
                raise ValueError("tensors to pull into must be contiguous CPU tensors")
            return value.reshape(-1).view(torch.uint8).numpy()
        return value.reshape(-1).view(np.uint8)

    def pull(self, step=None):
        """Makes the tensors ``step`` (default: the newest); returns the step held. Every
        step is fetched, decoded and verified whole before any tensor changes; the details
        (route, bytes, seconds per phase) are in ``last_result``."""
        try:
            self.last_result = self._ext.pull(step)
        finally:
            self._refresh()  # a long route that failed half-way holds the last complete step
        return self.last_result["step"]

    def follow(self, *, interval=2.0, until=None, max_failures=10, on_step=None, on_wait=None,
               events=None):
        """Pulls each newer step as it is committed, in the loop ``arc_v3 follow`` runs: a
        conditional poll of the store's ``latest`` pointer every ``interval`` seconds; a
        store or step not there yet is waited for; a store failing ``max_failures`` polls
        in a row raises ``ArcV3Error`` (``unavailable``). ``events="HOST:PORT"`` also
        listens there for the store's bucket notifications (``follow --events``,
        docs/regions.md): one naming ``latest`` or a step root polls at once.

        Returns the step held once it is ``until`` or later, or when ``on_step(step, result)``
        (called after each pull, ``state_dict`` already updated; ``result`` as
        ``last_result`` plus ``steps_behind`` and ``lag_seconds``) returns False.
        ``on_wait(kind, message)`` hears of waits (``"waiting"``), retried polls
        (``"retrying"``) and, with ``trusted_keys``, steps that fail verification
        (``"refused"``: the tensors held are kept, and the loop goes on to the next step
        that verifies); it too ends the loop by returning False. Ctrl-C ends the wait between
        polls with ``KeyboardInterrupt``."""

        def on_event(kind, result, message, failures):
            if kind != "pulled":
                return on_wait is None or on_wait(kind, message) is not False
            self.last_result = result
            self._refresh()
            return on_step is None or on_step(result["step"], result) is not False

        try:
            self._ext.follow(float(interval), None if until is None else int(until),
                             int(max_failures), "" if events is None else str(events), on_event)
        finally:
            self._refresh()
        return self.step

    def _refresh(self):
        held = {}
        for name, _dtype, shape, row_begin, row_end in self._ext.tensors():
            tensor, begin = self._storage[name]
            if self._rows is not None and shape:
                a = min(self._rows[0], shape[0])
                b = shape[0] if self._rows[1] is None else min(self._rows[1], shape[0])
                tensor = tensor[a - begin:b - begin]
            held[name] = tensor
        for name in list(self._storage):  # the follower's own reference keeps what it holds
            if name not in held:
                del self._storage[name]
        if self._into is not None and self._rows is not None:
            for name, value in held.items():
                if name in self._into and tuple(self._into[name].shape) == tuple(value.shape):
                    self._into[name][...] = value
        self._state = held

    @property
    def step(self):
        """The step the tensors hold, or None before the first pull."""
        return self._ext.step

    @property
    def state_dict(self):
        """name -> tensor (or array) of the step held; the same objects after later pulls,
        updated in place, unless a step adds, reshapes or drops a tensor."""
        return dict(self._state)
