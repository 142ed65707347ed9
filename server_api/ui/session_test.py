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
