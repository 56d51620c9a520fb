"""An independent reader of arc_v3 payloads, checkpoint delta containers and protocol-2
stores, written from src/codec/FORMAT.md, src/checkpoint/FORMAT.md and
src/sync/PROTOCOL.md alone (see tests/from_spec/README.md)."""

from .errors import ArcError  # noqa: F401
