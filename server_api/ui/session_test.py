"""The login cookie proves the admin token without containing it, and expires."""

from server_api.ui import session

TOKEN = "operator-token-" + "x" * 30


def test_a_fresh_cookie_is_valid_and_does_not_contain_the_token() -> None:
    # Execute
    value = session.issue(TOKEN, now=1_000)
    # Assert
    assert session.is_valid(value, TOKEN, now=1_000 + session.LIFETIME_S - 1)
    assert TOKEN not in value


def test_expired_forged_or_other_token_cookies_are_refused() -> None:
    # Prepare
    value = session.issue(TOKEN, now=1_000)
    expires, mac = value.split(".")
    # Execute / Assert
    assert not session.is_valid(value, TOKEN, now=1_000 + session.LIFETIME_S + 1)
    assert not session.is_valid(f"{int(expires) + 3600}.{mac}", TOKEN, now=1_000)
    assert not session.is_valid(value, TOKEN + "y", now=1_000)
    for garbage in (None, "", ".", "abc.def", "-5.00", "1" * 40 + ".ab"):
        assert not session.is_valid(garbage, TOKEN, now=1_000)


def test_an_expiry_in_anything_but_ascii_digits_is_refused_not_a_crash() -> None:
    # Prepare: a real cookie, its expiry respelled in Arabic-Indic digits (int() reads it, and its MAC still holds);
    # a superscript digit, which str.isdigit() takes and int() refuses
    value = session.issue(TOKEN, now=1_000)
    expires, mac = value.split(".")
    arabic = "".join(chr(0x0660 + int(d)) for d in expires)
    # Execute / Assert
    assert session.is_valid(value, TOKEN, now=1_000)
    assert not session.is_valid(f"{arabic}.{mac}", TOKEN, now=1_000)
    assert not session.is_valid(f"+{expires}.{mac}", TOKEN, now=1_000)
    assert not session.is_valid("\u00b2.ab", TOKEN, now=1_000)
