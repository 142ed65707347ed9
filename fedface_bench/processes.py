"""Processes and their memory, read from /proc: there is no psutil here, and /proc/<pid>/children is not
available on every kernel, so every lookup scans /proc."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

Process = tuple[int, str, list[str]]  # pid, command name, the stat fields after the name


def status_kb(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 for a process that has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass  # the process ended between listing and reading
    return 0


def processes() -> Iterator[Process]:
    """(pid, command name, the stat fields after the name: state, ppid, pgrp, ...) of every process."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # the process ended between listing and reading
            name, rest = stat.split("(", 1)[1].rsplit(")", 1)
            yield int(entry.name), name, rest.split()


def cpu_ticks(fields: list[str]) -> int:
    """A process's CPU ticks so far (user + system), from its stat fields after the name."""
    return int(fields[11]) + int(fields[12])


def ticks_spent(samples: Sequence[Mapping[int, int]]) -> int:
    """CPU ticks a changing set of processes spent from the first sample to the last (each a pid's ticks so far):
    each pid's last reading less its first, or all of it for a pid started after the first sample. A process that
    ends in between counts up to its last reading; a sum of the totals would lose everything it spent before."""
    first = samples[0] if samples else {}
    latest: dict[int, int] = {}
    for sample in samples:
        latest.update(sample)
    return sum(ticks - first.get(pid, 0) for pid, ticks in latest.items())


def group_pids(pgid: int, running: Iterable[Process] | None = None) -> list[int]:
    """Every process in a process group (a server started in its own session: its whole tree), of `running`
    (one scan of /proc) or of a new scan."""
    return [pid for pid, _, fields in (processes() if running is None else running) if int(fields[2]) == pgid]


def tree_pids(root: int, running: Iterable[Process] | None = None) -> list[int]:
    """`root` and every process descended from it (worker processes, and a local Ray's daemons and actors), of
    `running` (one scan of /proc) or of a new scan."""
    children: dict[int, list[int]] = {}
    for pid, _, fields in processes() if running is None else running:
        children.setdefault(int(fields[1]), []).append(pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


class PeakRss(threading.Thread):
    """Peak summed RSS of a set of processes, and of one of them (`root`) alone, until stop(). Each sample scans
    /proc once and sums the RSS of the processes `members` picks from that scan; `scanned` lets a subclass read
    more from the same scan. Samples every `interval` seconds catch processes that end before stop(); at stop()
    the kernel's high-water mark (VmHWM) of each process still there catches the spikes between samples. Those
    marks are lifetime peaks: the figures are the set's since start() only for processes started after it, and
    for a root that starts it first thing (`fedface bench sim` runs each device count in a process of its own)."""

    def __init__(self, members: Callable[[list[Process]], list[int]], root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.members, self.root, self.interval = members, root, interval
        self.peak_kb = self.root_peak_kb = 0
        self.stopped = threading.Event()

    def _sample(self, field: str) -> list[Process]:
        running = list(processes())
        self.peak_kb = max(self.peak_kb, sum(status_kb(pid, field) for pid in self.members(running)))
        self.root_peak_kb = max(self.root_peak_kb, status_kb(self.root, field))
        return running

    def scanned(self, running: list[Process]) -> None:
        """What a subclass also reads from each sample's scan of /proc."""

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.scanned(self._sample("VmRSS"))

    def stop(self) -> tuple[float, float]:
        """(the set's, the root's) peaks in MiB; call it while the processes still run."""
        self.stopped.set()
        self.join()
        self._sample("VmHWM")
        return self.peak_kb / 1024, self.root_peak_kb / 1024


def tree_peak(root: int | None = None, interval: float = 0.5) -> PeakRss:
    """The peak RSS of `root` (this process by default) and its descendants. A scan of /proc costs a few ms, so
    the default interval is long."""
    pid = os.getpid() if root is None else root
    return PeakRss(lambda running: tree_pids(pid, running), pid, interval)
