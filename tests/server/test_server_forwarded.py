"""Whose X-Forwarded-For a real `fedface server` believes: only the reverse proxies the operator lists
(`--forwarded-allow-ips`, FEDFACE_FORWARDED_ALLOW_IPS), none by default. uvicorn's own default trusts it from
127.0.0.1, so a client on the server's host could choose a new address for each request and never meet the
per-address limit on failed signatures."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedface import cli
from server_process import ServerProcess, free_port
from server_testkit import Device

ADDRESS_BURST = 10
LIMITS = {"FEDFACE_ADDRESS_RATE_PER_S": "0.2", "FEDFACE_ADDRESS_BURST": str(ADDRESS_BURST)}


class ProxiedServer(ServerProcess):
    """A server started with `--forwarded-allow-ips 127.0.0.1`: the tests' loopback client is its proxy."""

    def command(self) -> list[str]:
        return [*super().command(), "--forwarded-allow-ips", "127.0.0.1"]


def _started(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from _started(ServerProcess(tmp_path / "data", **LIMITS))


@pytest.fixture()
def proxied(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from _started(ProxiedServer(tmp_path / "data", **LIMITS))


def _victim_and_forger(http: httpx.Client) -> tuple[Device, Device]:
    """A registered device, and a forger who signs in its name with another key (the registration spends one
    of the loopback address's tokens where X-Forwarded-For is not believed)."""
    victim = Device(http)
    assert victim.register().status_code == 201
    return victim, Device(http, Ed25519PrivateKey.generate())


def _bad_signature(forger: Device, victim: Device, address: str) -> httpx.Response:
    path = f"/v1/devices/{victim.id}"
    return forger.request("GET", path, subject=victim.id, headers={"X-Device-Id": victim.id or "", "X-Forwarded-For": address})


def _until_429(call: Callable[[int], httpx.Response], most: int) -> list[int]:
    """Status codes of call(0), call(1)... up to the first 429, or `most` of them."""
    codes: list[int] = []
    while len(codes) < most and 429 not in codes:
        codes.append(call(len(codes)).status_code)
    return codes


def test_a_loopback_client_cannot_escape_the_address_limit_by_changing_x_forwarded_for(server: ServerProcess) -> None:
    # Prepare: a registered device, and a forger on the server's own host
    with httpx.Client(base_url=server.url, timeout=30) as http:
        victim, forger = _victim_and_forger(http)
        # Execute: bad signatures, each claiming a new client address
        codes = _until_429(lambda i: _bad_signature(forger, victim, f"10.{i // 250}.{i % 250}.1"), most=4 * ADDRESS_BURST)
    # Assert: the burst (less the registration) is spent, then 429 (today: 40 x 401)
    assert codes[-1] == 429 and set(codes[:-1]) == {401} and len(codes) <= ADDRESS_BURST + 2, codes


def test_a_listed_proxy_names_each_client_and_each_keeps_its_own_limit(proxied: ServerProcess) -> None:
    # Prepare: the loopback client is the listed proxy, so its X-Forwarded-For names the client
    with httpx.Client(base_url=proxied.url, timeout=30) as http:
        victim, forger = _victim_and_forger(http)
        # Execute: two bad signatures from each of 2 x burst clients behind the proxy; then one client keeps at it
        spread = [_bad_signature(forger, victim, f"10.1.{i}.1").status_code for i in range(2 * ADDRESS_BURST) for _ in range(2)]
        one_client = _until_429(lambda i: _bad_signature(forger, victim, "10.2.0.1"), most=4 * ADDRESS_BURST)
    # Assert: the clients do not share a budget; one client alone meets the limit; the banner names the proxy
    assert spread == [401] * (4 * ADDRESS_BURST)
    assert one_client[-1] == 429 and set(one_client[:-1]) == {401} and len(one_client) <= ADDRESS_BURST + 2, one_client
    assert "client addresses from X-Forwarded-For of 127.0.0.1" in proxied.log.read_text()


@pytest.mark.parametrize("value", ["*", "10.0.0.300", "proxy.internal", "10.0.0.0/33"])
def test_a_proxy_list_that_is_not_addresses_is_refused_in_one_line(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: `fedface server` exports its flags into this process's environment; monkeypatch puts it back
    for name in ("FEDFACE_FORWARDED_ALLOW_IPS", "FEDFACE_DATA_DIR", "FEDFACE_MODEL", "FEDFACE_DEV"):
        monkeypatch.setenv(name, "")
    args = ["--dev", "--data-dir", str(tmp_path / "d"), "--model", "random", "--port", str(free_port())]
    # Execute
    code = cli.main(["server", *args, "--forwarded-allow-ips", f"127.0.0.1,{value}"])
    # Assert: nothing started (no data folder), one line naming the entry
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("fedface server: error: FEDFACE_FORWARDED_ALLOW_IPS: "), err
    assert f"{value!r} is not an IP address or network" in err[0]
    assert not (tmp_path / "d").exists()
