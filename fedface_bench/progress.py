"""Progress of a `fedface bench` run, on stderr, so a run that takes minutes says what it is doing.

Invariants:
- Progress goes to stderr only. stdout holds the result alone (with --json exactly one JSON line), so a
  script reading stdout sees what it always saw.
- A step line names the bench and the seconds since it began: `fedface bench export [   12 s] exporting mobile ...`;
  a long loop shows a tqdm bar instead of a line per pass.
- The benchmark functions take `progress=QUIET` by default: called as a library (tests) they print nothing.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import TextIO, TypeVar

T = TypeVar("T")


class Progress:
    """Step lines and bars for the bench `name` (None: silent) on `stream` (default: stderr at the time of each write)."""

    def __init__(self, name: str | None = None, stream: TextIO | None = None) -> None:
        self.name, self.stream, self.started = name, stream, time.perf_counter()

    def __call__(self, text: str) -> None:
        if self.name is not None:
            seconds = time.perf_counter() - self.started
            print(f"fedface bench {self.name} [{seconds:5.0f} s] {text}", file=self.stream or sys.stderr, flush=True)

    def bar(self, items: Iterable[T], description: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
        """`items`, with a bar on stderr while they are consumed."""
        if self.name is None:
            return items
        from tqdm import tqdm

        return tqdm(items, desc=f"fedface bench {self.name}: {description}", total=total, unit=unit, file=self.stream or sys.stderr,
                    leave=False, mininterval=1.0)


QUIET = Progress()
