"""The error names of the specifications.

Payload errors: src/codec/FORMAT.md, "Errors".  Container errors: src/checkpoint/FORMAT.md
(uses the same names).  Store errors: src/sync/PROTOCOL.md, "Errors".
"""

PAYLOAD_ERRORS = (
    "truncated", "bad_magic", "unsupported_version", "reserved_bits_set",
    "corrupt_header", "corrupt_chunk", "codec_failure", "size_mismatch",
    "checksum_mismatch", "wrong_base", "history_mismatch",
)

STORE_ERRORS = (
    "not_found", "already_exists", "unavailable", "permission_denied",
    "checksum_mismatch", "corrupt_chunk", "corrupt_header", "unsupported_version",
    "truncated", "untrusted", "io_error", "invalid_argument", "internal",
)


class ArcError(Exception):
    """An error with one of the specifications' stable names (`code`)."""

    def __init__(self, code, message=""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


def fail(code, message=""):
    raise ArcError(code, message)
