"""Request signing (Ed25519), admin token check and template encryption (AES-GCM).

Device request signature: headers and signed message are the wire protocol
(:mod:`facecore.federation.protocol`); this module checks them: the timestamp within the
window, the nonce's form (16-64 url-safe chars; never reused is the caller's check), the
base64 Ed25519 signature.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server_api.errors import AuthenticationFailed, Forbidden, InvalidInput

NONCE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
# ASCII digits only: int() also takes a sign, "_" separators, surrounding spaces and non-ASCII digits, so one
# signed instant would have many spellings. 12 digits reach the year 33658.
UNIX_SECONDS = re.compile(r"[0-9]{1,12}")


def parse_public_key(text: str) -> bytes:
    """Raw 32-byte Ed25519 public key from base64 (standard or url-safe)."""
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_" if ("-" in text or "_" in text) else None, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("public_key is not valid base64") from None
    if len(raw) != 32:
        raise InvalidInput(f"public_key must be a raw 32-byte Ed25519 key, got {len(raw)} bytes")
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise InvalidInput("public_key is not a valid Ed25519 key") from None
    return raw


def check_timestamp(timestamp: str, now: float, window_s: int) -> None:
    if not UNIX_SECONDS.fullmatch(timestamp):
        raise AuthenticationFailed("X-Timestamp must be integer unix seconds, in ASCII digits only")
    if abs(now - int(timestamp)) > window_s:
        raise AuthenticationFailed(f"X-Timestamp is more than {window_s} s away from server time")


def check_nonce_format(nonce: str) -> None:
    if not NONCE_PATTERN.match(nonce):
        raise AuthenticationFailed("X-Nonce must be 16-64 url-safe characters")


def verify_signature(public_key: bytes, signature_b64: str, message: bytes) -> None:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (binascii.Error, ValueError, InvalidSignature):
        raise AuthenticationFailed("bad request signature") from None


def check_admin_token(presented: str | None, expected: str) -> None:
    # compare_digest over bytes keeps the comparison time independent of where they differ.
    if not presented or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise AuthenticationFailed("missing or wrong admin token")


def check_same_origin(fetch_site: str | None, origin: str | None, host: str | None) -> None:
    """A form post that changes the `/ui` session (log in, log out) must come from the server's own pages.

    A browser's `Sec-Fetch-Site` decides when it sends one: only "same-origin" passes. Older browsers send
    only `Origin` with a POST: its host and port must be the request's `Host` (the scheme is left out, so a
    TLS proxy that forwards plain HTTP still passes; behind a proxy, forward the Host header). A request with
    neither comes from no browser (curl, a script), which no other site can make a user's browser send.
    """
    if fetch_site is not None:
        if fetch_site.strip().lower() != "same-origin":
            raise Forbidden(f"cross-site request refused (Sec-Fetch-Site: {fetch_site[:20]})")
        return
    if origin is not None and (not host or _netloc(origin) != host.strip().lower()):
        raise Forbidden("cross-site request refused (Origin is not this server)")


def _netloc(origin: str) -> str | None:
    try:
        return urlsplit(origin.strip()).netloc.lower() or None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


class TemplateCipher:
    """AES-256-GCM for class embeddings at rest.

    The associated data binds a ciphertext to its device and purpose, so copying
    one device's row onto another device's record fails to decrypt instead of
    silently handing out someone else's template.
    """

    NONCE_BYTES = 12

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("template key must be 32 bytes")
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "TemplateCipher(<key redacted>)"

    def encrypt(self, plaintext: bytes, device_id: str, purpose: str) -> bytes:
        nonce = os.urandom(self.NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, f"{purpose}:{device_id}".encode())

    def decrypt(self, blob: bytes, device_id: str, purpose: str) -> bytes:
        try:
            return self._aead.decrypt(blob[: self.NONCE_BYTES], blob[self.NONCE_BYTES :], f"{purpose}:{device_id}".encode())
        except InvalidTag:
            # Wrong key or tampered row: an operator problem, not a client one.
            raise RuntimeError(f"stored template of device {device_id} does not decrypt (wrong template key?)") from None
