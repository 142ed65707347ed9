"""One torch thread per test: these tests use tiny tensors, and on a shared, niced machine two
threads spend their time waiting for each other (a 2-second test took two minutes)."""
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
