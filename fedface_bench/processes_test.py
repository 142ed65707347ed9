"""A process tree's peak memory counts the children too, including one that ends before the peak is read."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fedface_bench.processes import tree_pids

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
