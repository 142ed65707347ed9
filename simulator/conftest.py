"""One intra-op thread for the simulator's tests: they use tiny models, and on a busy 2-core
machine two spinning OpenMP threads made them ~30x slower (a cross-silo run: 1.6 s vs 46 s wall;
a 2-second fusion test took two minutes)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
