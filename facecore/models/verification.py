"""A model's verification threshold as one typed record, wherever it travels.

Two places hold one, and they mean different things:
- A published version's database row (`server_api.tables.ModelVersion.verification`) is the truth: what
  devices are told (`/v1/models/current`), what the operator recalibrates
  (`PUT /v1/admin/models/{version}/verification`) and what the next round's version inherits.
- A backbone file's meta holds only the threshold the model shipped with, under `SHIPPED_KEY`. The file's
  bytes name the version, so a recalibration never rewrites it; it is the starting value of a version the
  server creates from the file, and the default of tools that load a file without a server (`fedface eval`,
  the simulator). A named model ships its card's (`facecore/weights/<name>.json`, key "verification").

Invariants:
- Importing this module loads neither torch nor numpy (`fedface models list` reads the cards without them).
- `to_json` writes the keys stored before this record existed ("threshold", "far", "calibration",
  `FAR_10_KEY`, "calibrated_for"; the optional ones only when set), and `from_json` reads them back, so
  database rows and files written before it read unchanged. A file's meta written before `SHIPPED_KEY` holds
  the record under `LEGACY_KEY`, and sometimes as a bare number; `shipped_in` reads both.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A model's FAR 10% point: the cosine above which 10% of the impostor pairs score, calibrated as its
# threshold is. The server refuses a published threshold below it unless forced.
FAR_10_KEY = "threshold_far_0.1"
# Where a backbone file's meta keeps the record the model shipped with; files written before used LEGACY_KEY.
SHIPPED_KEY = "shipped_verification"
LEGACY_KEY = "verification"


def _number(value: Any) -> float | None:
    """A finite JSON number as a float, else None (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Verification:
    """A cosine threshold at or above which a device accepts a face as its owner's."""

    threshold: float
    far: float | None = None  # the false-accept rate it was calibrated for
    calibration: str | None = None  # on which faces, e.g. "all 796,147 impostor pairs of ..."
    far_10_point: float | None = None  # the model's FAR 10% point (FAR_10_KEY), kept through recalibrations
    calibrated_for: str | None = None  # the ancestor version it was calibrated on, when a round's version inherited it

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in a database row, a backbone file's meta or a model card."""
        values = {"threshold": self.threshold, "far": self.far, "calibration": self.calibration,
                  FAR_10_KEY: self.far_10_point, "calibrated_for": self.calibrated_for}
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_json(cls, value: Any) -> Verification | None:
        """The record `to_json` wrote, or a bare threshold; None for None or an object without a threshold.
        A FAR 10% point that is not a finite number reads as none (only a number can refuse a threshold)."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            threshold = _number(value)
            if threshold is None:
                raise ValueError(f"a verification record is an object or a threshold, got {str(value)[:40]!r}")
            return cls(threshold)
        threshold = value.get("threshold")
        if threshold is None:
            return None
        if _number(threshold) is None:
            raise ValueError(f"a verification threshold is a finite number, got {str(threshold)[:40]!r}")
        calibration, calibrated_for = value.get("calibration"), value.get("calibrated_for")
        return cls(
            float(threshold), _number(value.get("far")), None if calibration is None else str(calibration),
            _number(value.get(FAR_10_KEY)), None if calibrated_for is None else str(calibrated_for),
        )

    def inherited(self, parent: str) -> Verification:
        """This record on a round's version trained from `parent`: unchanged, except that it names the version it
        was calibrated on (`parent`, or the ancestor `parent` inherited it from)."""
        return dataclasses.replace(self, calibrated_for=self.calibrated_for or parent)


def shipped_in(meta: Mapping[str, Any]) -> Verification | None:
    """The record a backbone file's meta says its model shipped with, or None."""
    return Verification.from_json(meta[SHIPPED_KEY] if SHIPPED_KEY in meta else meta.get(LEGACY_KEY))


def shipping(meta: Mapping[str, Any], verification: Verification | None) -> dict[str, Any]:
    """`meta` saying its model ships with `verification`, under SHIPPED_KEY only."""
    kept = {key: value for key, value in meta.items() if key not in (SHIPPED_KEY, LEGACY_KEY)}
    return kept | {SHIPPED_KEY: None if verification is None else verification.to_json()}
