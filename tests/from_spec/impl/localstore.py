"""A directory store (PROTOCOL.md, "Roles and stores"): key K is the file path/K."""
import os
import re
import stat

from .errors import fail

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+\Z")


def valid_key(key):
    """1 to 1024 bytes of `/`-separated components, each non-empty, not `.` or `..`, of
    [A-Za-z0-9._-]."""
    if not isinstance(key, str) or not 1 <= len(key.encode()) <= 1024:
        return False
    return all(c not in (".", "..") and _COMPONENT.match(c) for c in key.split("/"))


class LocalStore:
    def __init__(self, path):
        self.root = path
        if not os.path.isdir(path):
            fail("not_found", "store directory %s is missing" % path)

    def _open(self, key):
        if not valid_key(key):
            fail("invalid_argument", "not a key: %r" % (key,))
        if not os.path.isdir(self.root):
            fail("unavailable", "store directory went away")
        p = os.path.join(self.root, key)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            fail("not_found", "no object %s" % key)
        except NotADirectoryError:
            fail("not_found", "no object %s" % key)
        if stat.S_ISDIR(st.st_mode):
            fail("not_found", "%s is a directory" % key)
        if not stat.S_ISREG(st.st_mode):
            fail("corrupt_header", "%s is not a regular file" % key)
        return p

    def get(self, key):
        with open(self._open(key), "rb") as f:
            return f.read()

    def get_range(self, key, offset, size):
        """Bytes [offset, offset + size) (fewer where the object ends first)."""
        with open(self._open(key), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def exists(self, key):
        try:
            self._open(key)
            return True
        except Exception:  # noqa: BLE001
            return False
