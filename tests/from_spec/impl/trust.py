"""Signed steps (SIGNED_STEPS.md, "Signed steps"): trusted public keys and DSSE envelopes."""
import base64
import binascii
import hashlib
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import fail
from .jsonstrict import Obj

PAYLOAD_TYPE = "application/vnd.arc-v3.sync+json"
_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)


class TrustedKey:
    def __init__(self, der):
        self.der = der
        self.id = hashlib.sha256(der).hexdigest()  # "A key's id is the SHA-256 of its SPKI DER"
        key = serialization.load_der_public_key(der)
        if not isinstance(key, Ed25519PublicKey):
            fail("invalid_argument", "trusted key is not Ed25519")
        self.key = key


def load_trust_file(path):
    """One or more PUBLIC KEY blocks (RFC 7468), nothing but whitespace around them
    ("Key files")."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        fail("invalid_argument", "trust file is not PEM text")
    keys = []
    at = 0
    for m in _BLOCK.finditer(text):
        if text[at:m.start()].strip():
            fail("invalid_argument", "text outside a PEM block")
        at = m.end()
        if m.group(1) != "PUBLIC KEY":
            fail("invalid_argument", "a %s block given for trust" % m.group(1))
        body = "".join(m.group(2).split())
        try:
            der = base64.b64decode(body, validate=True)
        except binascii.Error:
            fail("invalid_argument", "PEM block is not base64")
        try:
            keys.append(TrustedKey(der))
        except ValueError as e:
            fail("invalid_argument", "not a public key: %s" % e)
    if text[at:].strip() or not keys:
        fail("invalid_argument", "trust file holds no complete PUBLIC KEY block")
    return keys


def strict_b64(s):
    """Standard padded base64 (RFC 4648 §4); any other text is refused."""
    if not isinstance(s, str) or len(s) % 4:
        return None
    try:
        b = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(b).decode("ascii") != s:
        return None  # non-zero padding bits
    return b


def is_envelope(doc):
    """An envelope opens with `payload` or `payloadType`; documents with `format`."""
    return isinstance(doc, dict) and bool(doc) and next(iter(doc)) in ("payload", "payloadType")


class Envelope:
    pass


def parse_envelope(doc, code, what):
    """The DSSE envelope ("Envelope"); failures are `code`."""
    o = Obj(doc, what + " envelope", code)
    env = Envelope()
    env.payload = strict_b64(o.get("payload"))
    if env.payload is None:
        o.bad("payload is not standard padded base64")
    ptype = o.get("payloadType")
    if ptype != PAYLOAD_TYPE:
        o.bad("payloadType %r" % (ptype,))
    sigs = o.get("signatures")
    if not isinstance(sigs, list) or not 1 <= len(sigs) <= 16:
        o.bad("1 to 16 signatures")
    env.sigs = []
    for s in sigs:
        so = Obj(s, what + " signature", code)
        keyid = so.get("keyid", optional=True)
        if keyid is not None and not isinstance(keyid, str):
            so.bad("keyid is not a string")
        sig = strict_b64(so.get("sig"))
        if sig is None:
            so.bad("sig is not standard padded base64")
        so.done()
        env.sigs.append((keyid, sig))
    o.done()
    return env


def pae(payload_type, payload):
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def verify_envelope(env, keys):
    """True if a signature verifies with a trusted key (a `keyid` names its key; without
    one, every trusted key is tried)."""
    msg = pae(PAYLOAD_TYPE, env.payload)
    for keyid, sig in env.sigs:
        for k in keys:
            if keyid is not None and keyid != k.id:
                continue
            try:
                k.key.verify(sig, msg)
                return True
            except InvalidSignature:
                continue
    return False
