"""A process tree's peak memory counts the children too, including one that ends before the peak is read."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fedface_bench.processes import ticks_spent, tree_pids

HOLD = "import time; block = bytearray({mb} * 2**20); time.sleep({seconds})"


def test_the_tree_is_the_root_and_its_descendants() -> None:
    # Prepare: a child that starts a grandchild
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(3)'])"])
    try:
        deadline = time.monotonic() + 10
        while len(tree := tree_pids(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)

        # Assert
        assert tree[0] == child.pid and len(tree) == 2
    finally:
        child.kill()
        child.wait()


# In a process of its own, as `fedface bench sim` runs each count: high-water marks are lifetime peaks, so a
# test worker that was bigger before would report its own earlier peak.
PEAK_OF_TWO_CHILDREN = f"""
import subprocess, sys, time
from fedface_bench.processes import tree_peak
peak = tree_peak(interval=0.05)
peak.start()
subprocess.run([sys.executable, "-c", {HOLD.format(mb=400, seconds=1)!r}], check=True)
running = subprocess.Popen([sys.executable, "-c", {HOLD.format(mb=200, seconds=30)!r}])
time.sleep(1.5)
print(*peak.stop())
running.kill()
"""


def test_the_peak_holds_a_child_that_ended_and_one_still_running() -> None:
    # Execute: one child holds 400 MB for a second and ends; another holds 200 MB until the peak is read
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", PEAK_OF_TWO_CHILDREN], cwd=repo, capture_output=True, text=True, check=True, timeout=120)
    tree_mb, root_mb = (float(x) for x in done.stdout.split())

    # Assert: the ended child's 400 MB, seen only by a sample, is the tree's peak; the root's own peak holds neither
    assert tree_mb >= root_mb + 400


def test_ticks_spent_counts_a_process_that_ends_or_starts_mid_window_for_what_it_spent_there() -> None:
    # Prepare: pid 1 runs throughout, pid 2 ends after the second sample, pid 3 starts after the first
    samples = [{1: 10, 2: 100}, {1: 20, 2: 120, 3: 5}, {1: 30, 3: 15}]

    # Execute
    spent = ticks_spent(samples)

    # Assert: 20 + 20 + 15; summing each sample's total instead reads 45 - 110 = -65
    assert spent == 55
    assert ticks_spent([]) == 0


def test_the_server_benchmark_reads_cpu_over_the_samples_nearest_its_window() -> None:
    # Prepare: a sampler fed by hand; a PostgreSQL backend (pid 7) ends in the middle of the window
    import os

    from fedface_bench.server import RssSampler

    sampler = RssSampler(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    sampler.cpu = [(0.0, {1: 0}, {7: 0}), (1.0, {1: tick}, {7: 5 * tick, 8: 0}), (2.0, {1: 3 * tick}, {7: 6 * tick, 8: tick}),
                   (3.0, {1: 4 * tick}, {8: 2 * tick}), (4.0, {1: 9 * tick}, {8: 9 * tick})]

    # Execute
    server_s, postgres_s = sampler.cpu_seconds(0.9, 3.1)

    # Assert: from the sample at 1.0 to the one at 3.0
    assert (server_s, postgres_s) == (3.0, 3.0)
