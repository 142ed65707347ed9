"""The `/ui` login cookie.

Its value is ``<expiry unix seconds>.<hex HMAC-SHA256 of the expiry, keyed by the admin token>``:
it proves the holder knew the token without being the token, it expires by itself, and changing
the admin token invalidates every cookie. It is only ever accepted by the read-only `/ui` pages.
"""

from __future__ import annotations

import hashlib
import hmac

# The expiry is unix seconds in ASCII digits, as a signed timestamp: str.isdigit() also takes "²" (which int()
# refuses: a 500) and other scripts' digits.
from server_api.core.security import UNIX_SECONDS

COOKIE_NAME = "fedface_ui"
LIFETIME_S = 12 * 3600


def _mac(admin_token: str, expires: int) -> str:
    return hmac.new(admin_token.encode(), f"fedface-ui:{expires}".encode(), hashlib.sha256).hexdigest()


def issue(admin_token: str, now: float) -> str:
    expires = int(now) + LIFETIME_S
    return f"{expires}.{_mac(admin_token, expires)}"


def is_valid(value: str | None, admin_token: str, now: float) -> bool:
    expires_text, _, mac = (value or "").partition(".")
    if not UNIX_SECONDS.fullmatch(expires_text) or int(expires_text) < now:
        return False
    return hmac.compare_digest(mac.encode(), _mac(admin_token, int(expires_text)).encode())
