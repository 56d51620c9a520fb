"""The exception raised for every codec error (imported by the C++ extension)."""


class ArcV3Error(Exception):
    """A codec error, carrying the C++ library's stable error code.

    Attributes:
        code: the numeric ``arc_v3::ErrorCode`` (stable, never renumbered).
        name: its stable name, e.g. ``"checksum_mismatch"``.
        message: the human-readable explanation.
    """

    def __init__(self, code, name, message):
        super().__init__(code, name, message)
        self.code = int(code)
        self.name = str(name)
        self.message = str(message)

    def __str__(self):
        return f"{self.name} ({self.code}): {self.message}"
