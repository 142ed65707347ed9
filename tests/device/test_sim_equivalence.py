"""One seeded round, twice: real SDK devices over HTTP against a real server process, and the in-process
simulator on the same faces and the same starting model. The simulator claims to run the live rules
(selection, training seed, fp16 wire or int8 downloads, the server's strategy), so the two published models
agree to the precision of the wire."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import default_server, open_round, round_status
from device_sdk.device import FaceDevice
from device_sdk.training import LocalTrainingConfig
from facecore.models.checkpoint import load_backbone
from server_process import ServerProcess
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.engine import CrossDeviceSimulation
from simulator.cross_device.population import Population, SimDevice


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of its own for each run: the simulator's round 1 trains with the seed of the server's round 1."""
    process = default_server(tmp_path / "server")
    yield process
    process.stop()


# The dlib ResNet's owner faces sit at cosine 0.96-0.99 to their template: at the default margin (0.9)
# nothing trains, and equal models would prove nothing.
MARGIN = 0.995


def _download(device: FaceDevice, version: str, dest: Path) -> torch.nn.Module:
    """The fp32 backbone file of `version`, fetched the way a device fetches (signed)."""
    dest.write_bytes(device._request("GET", f"/v1/models/{version}/backbone").content)
    return load_backbone(dest)


def _completed(server, round_id: int, timeout: float = 180) -> dict:  # type: ignore[no-untyped-def,type-arg]
    deadline = time.monotonic() + timeout
    while (current := round_status(server, round_id))["status"] != "completed":
        assert current["status"] not in ("failed", "cancelled") and time.monotonic() < deadline, current
        time.sleep(0.5)
    return current


@pytest.mark.parametrize("download_bits", [None, 8])
def test_a_seeded_round_over_http_publishes_the_simulators_model_to_fp16_precision(  # type: ignore[no-untyped-def]
    server, owners: list[list[Path]], tmp_path: Path, download_bits: int | None,
) -> None:
    # Prepare: three enrolled devices and the server's first round, which takes all three
    devices = []
    for photos in owners:
        device = FaceDevice(server.url, tmp_path / f"device{len(devices)}", retries=2)
        device.register()
        device.enroll(photos)
        devices.append(device)
    opened = open_round(server, target=3, minimum=3, local={"margin": MARGIN, "download_bits": download_bits})
    assert opened["id"] == 1  # the simulator's round 1 trains with the same seed
    base = _download(devices[0], opened["base_version"], tmp_path / "base.pt")
    # Execute: the live round, then the simulated one
    for device in devices:
        device.train_round(wait=30)
    published = _download(devices[0], _completed(server, opened["id"])["result_version"], tmp_path / "published.pt")
    live_W = np.stack([d._request("GET", f"/v1/devices/{d.device_id}/embedding").json()["embedding"] for d in devices])
    population = Population(tuple(SimDevice(i, f"device{i}", d.state.faces()) for i, d in enumerate(devices)), 3, 0)  # type: ignore[arg-type]
    config = CrossDeviceConfig(devices=3, rounds=1, per_round=3, eval_every=1, local=LocalTrainingConfig(margin=MARGIN),
                               download_bits=download_bits)
    simulation = CrossDeviceSimulation(config, population, base, tmp_path / "sim")
    simulated = simulation.run(resume=False)
    # Assert: every weight of the update agrees to within one fp16 step of that tensor's largest change
    base_state, live_state, sim_state = base.state_dict(), published.state_dict(), simulation.model.state_dict()
    moved = 0
    for name, start in base_state.items():
        if not start.is_floating_point():
            continue
        live_delta, sim_delta = live_state[name] - start, sim_state[name] - start
        step = 2.0 ** -10 * float(live_delta.abs().max())
        assert float((live_delta - sim_delta).abs().max()) <= step + 1e-7, name
        moved += int(live_delta.abs().max() > 0)
    assert moved > 0
    # with download_bits 8 the devices trained from the int8 file, and downloaded nothing else to train from
    kinds = {path.name.split(".", 1)[1] for path in devices[0].state.models_dir().glob("*.pt")}
    assert kinds == ({"int8.pt"} if download_bits == 8 else {"fp16.pt"})
    # and the class embeddings after spreadout agree (the devices enrolled through ONNX, the simulator through torch)
    assert simulated.round == 1
    np.testing.assert_allclose(simulated.W, live_W, atol=1e-4)
