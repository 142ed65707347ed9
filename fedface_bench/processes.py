"""Processes and their memory, read from /proc: there is no psutil here, and /proc/<pid>/children is not
available on every kernel, so every lookup scans /proc."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path


def status_kb(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 for a process that has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass  # the process ended between listing and reading
    return 0


def processes() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, command name, the stat fields after the name: state, ppid, pgrp, ...) of every process."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # the process ended between listing and reading
            name, rest = stat.split("(", 1)[1].rsplit(")", 1)
            yield int(entry.name), name, rest.split()


def group_pids(pgid: int) -> list[int]:
    """Every process in a process group (a server started in its own session: its whole tree)."""
    return [pid for pid, _, fields in processes() if int(fields[2]) == pgid]


def tree_pids(root: int) -> list[int]:
    """`root` and every process descended from it (worker processes, and a local Ray's daemons and actors)."""
    children: dict[int, list[int]] = {}
    for pid, _, fields in processes():
        children.setdefault(int(fields[1]), []).append(pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


class TreePeak(threading.Thread):
    """Peak summed RSS of a process tree, and of its root alone, until stop(). Samples every `interval` seconds
    catch processes that end before stop() (a scan of /proc costs a few ms, so the interval is long); at stop() the
    kernel's high-water mark (VmHWM) of each process still there catches the spikes between samples. Those marks
    are lifetime peaks: the figures are the tree's since start() only for processes started after it, and for a
    root that starts it first thing (`fedface bench sim` runs each device count in a process of its own)."""

    def __init__(self, root: int | None = None, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.peak_kb = self.root_peak_kb = 0
        self._stopped = threading.Event()

    def _sample(self, field: str) -> None:
        self.peak_kb = max(self.peak_kb, sum(status_kb(pid, field) for pid in tree_pids(self.root)))
        self.root_peak_kb = max(self.root_peak_kb, status_kb(self.root, field))

    def run(self) -> None:
        while not self._stopped.wait(self.interval):
            self._sample("VmRSS")

    def stop(self) -> tuple[float, float]:
        """(tree, root) peaks in MiB; call it while the tree's processes still run."""
        self._stopped.set()
        self.join()
        self._sample("VmHWM")
        return self.peak_kb / 1024, self.root_peak_kb / 1024
