"""Domain errors of the shared core.

Every error the core raises on bad input derives from :class:`FaceCoreError`, so
the CLI can print one clear line and the server can map it to an HTTP code at the
route, never inside the core.
"""
from __future__ import annotations

from collections.abc import Sequence


class FaceCoreError(Exception):
    """Base class for errors caused by input the user can fix."""


class DataRootMissing(FaceCoreError):
    def __init__(self, tried: Sequence[str]) -> None:
        self.tried = list(tried)
        super().__init__(
            "face data not found: set FEDFACE_DATA to the folder holding lfw/ and "
            f"celeba_subset/ (tried: {', '.join(self.tried)})"
        )


class DatasetFormatError(FaceCoreError):
    """A data file exists but does not follow its documented layout."""


class UnknownBackbone(FaceCoreError):
    def __init__(self, name: str, valid: Sequence[str]) -> None:
        self.name = name
        self.valid = sorted(valid)
        super().__init__(f"unknown backbone {name!r}; valid names: {', '.join(self.valid)}")


class NoFaceFound(FaceCoreError):
    """Raised when images that must contain a face do not."""

    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)
        shown = ", ".join(self.files[:10]) + (" ..." if len(self.files) > 10 else "")
        super().__init__(f"no face found in {len(self.files)} image(s): {shown}")


class SplitOverlap(FaceCoreError):
    """A split manifest whose identity sets are not disjoint."""


class CheckpointError(FaceCoreError):
    """A checkpoint that is missing, corrupt or of another architecture."""
