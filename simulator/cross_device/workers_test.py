"""A worker gets each set of photos or activations once, however many devices share it."""
from __future__ import annotations

import numpy as np

from simulator.cross_device.workers import Assignment, DeviceTask


def _task(index: int, data: int) -> DeviceTask:
    activations = np.full((2, 3), data, np.float32)
    return DeviceTask(index, data, np.ones(4, np.float32), seed=index, n_faces=2, cache=(activations, activations))


def test_devices_sharing_photos_send_them_to_each_worker_once() -> None:
    # Prepare: devices 0-5 on two workers; devices 0, 2 and 4 (worker 0) and 1 (worker 1) share photos 7
    assignment = Assignment(2)
    tasks = [_task(0, 7), _task(1, 7), _task(2, 7), _task(3, 8), _task(4, 7), _task(5, 9)]

    # Execute: two rounds with the same devices
    first = assignment.split(tasks)
    second = assignment.split(tasks)

    # Assert: photos 7 go to worker 0 with device 0 and to worker 1 with device 1, and never again
    assert [(t.index, t.cache is not None) for t in first[0]] == [(0, True), (2, False), (4, False)]
    assert [(t.index, t.cache is not None) for t in first[1]] == [(1, True), (3, True), (5, True)]
    assert all(t.cache is None for share in second for t in share)
    assert [t.data for t in first[0]] == [7, 7, 7]
