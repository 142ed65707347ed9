"""Reader for the standard LFW layout: lfw-deepfunneled/<Name>/<Name>_NNNN.jpg, people.txt, pairs.txt.

View 2 (`people.txt`, `pairs.txt`) has 10 identity-disjoint folds; View 1 (`*Dev*`) is for model
selection. Every malformed line is reported with its file and line number.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from facecore.data.records import FaceImage
from facecore.errors import DatasetFormatError

IMAGE_DIRS = ("lfw-deepfunneled", "lfw", "lfw_funneled")


@dataclass(frozen=True)
class LFWPair:
    a: FaceImage
    b: FaceImage
    same: bool
    fold: int  # 1-based, as in the LFW documentation


class LFW:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        for name in IMAGE_DIRS:
            if (self.root / name).is_dir():
                self.images_dir = self.root / name
                break
        else:
            raise DatasetFormatError(f"{self.root}: no LFW image folder (looked for {', '.join(IMAGE_DIRS)})")

    def image(self, name: str, number: int) -> FaceImage:
        return FaceImage(f"lfw:{name}", self.images_dir / name / f"{name}_{number:04d}.jpg")

    def images_of(self, name: str, count: int) -> list[FaceImage]:
        return [self.image(name, k) for k in range(1, count + 1)]

    def all_images(self) -> list[FaceImage]:
        return sorted(
            FaceImage(f"lfw:{person.name}", path)
            for person in self.images_dir.iterdir()
            if person.is_dir()
            for path in person.glob("*.jpg")
        )

    def people_folds(self, filename: str = "people.txt") -> list[dict[str, int]]:
        """Folds of {name: image count}. `peopleDev*.txt` files come back as a single fold."""
        lines = _read_lines(self.root / filename)
        if filename.startswith("peopleDev"):
            return [dict(_parse_person(lines, 1, int(_field(lines, 0, 0)), filename))]
        folds: list[dict[str, int]] = []
        n_folds = _int(lines, 0, _field(lines, 0, 0), filename)
        row = 1
        for _ in range(n_folds):
            count = _int(lines, row, _field(lines, row, 0), filename)
            folds.append(dict(_parse_person(lines, row + 1, count, filename)))
            row += 1 + count
        return folds

    def pairs(self, filename: str = "pairs.txt") -> list[LFWPair]:
        lines = _read_lines(self.root / filename)
        header = lines[0].split()
        if len(header) == 2:
            n_folds, per_kind = (_int(lines, 0, v, filename) for v in header)
        else:  # View 1 files carry a single count of matched pairs
            n_folds, per_kind = 1, _int(lines, 0, header[0], filename)
        pairs: list[LFWPair] = []
        row = 1
        for fold in range(1, n_folds + 1):
            for same in (True, False):
                for _ in range(per_kind):
                    pairs.append(self._parse_pair(lines, row, same, fold, filename))
                    row += 1
        if row != len(lines):
            raise DatasetFormatError(f"{filename}: expected {row - 1} pairs, found {len(lines) - 1} lines")
        return pairs

    def _parse_pair(self, lines: list[str], row: int, same: bool, fold: int, filename: str) -> LFWPair:
        fields = lines[row].split("\t") if row < len(lines) else []
        if same and len(fields) == 3:
            name, i, j = fields
            return LFWPair(self.image(name, _int(lines, row, i, filename)), self.image(name, _int(lines, row, j, filename)), True, fold)
        if not same and len(fields) == 4:
            a, i, b, j = fields
            return LFWPair(self.image(a, _int(lines, row, i, filename)), self.image(b, _int(lines, row, j, filename)), False, fold)
        kind = "matched (name, n, m)" if same else "mismatched (name, n, name, m)"
        raise DatasetFormatError(f"{filename}:{row + 1}: expected a {kind} pair, got {lines[row] if row < len(lines) else 'end of file'!r}")


def parse_folds(spec: str, n_folds: int = 10) -> tuple[int, ...]:
    """'6-10' or '1,3,5' or 'all' -> sorted 1-based fold numbers."""
    if spec in ("all", ""):
        return tuple(range(1, n_folds + 1))
    folds: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        try:
            start, stop = int(lo), int(hi or lo)
        except ValueError:
            raise DatasetFormatError(f"bad fold spec {spec!r}: use e.g. 6-10 or 1,3,5") from None
        folds.update(range(start, stop + 1))
    if not folds or min(folds) < 1 or max(folds) > n_folds:
        raise DatasetFormatError(f"bad fold spec {spec!r}: folds are 1..{n_folds}")
    return tuple(sorted(folds))


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DatasetFormatError(f"{path} is missing")
    return [line.rstrip("\r") for line in path.read_text().split("\n") if line.strip()]


def _field(lines: list[str], row: int, col: int) -> str:
    return lines[row].split("\t")[col].split()[0]


def _int(lines: list[str], row: int, value: str, filename: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DatasetFormatError(f"{filename}:{row + 1}: expected a number, got {value!r}") from None


def _parse_person(lines: list[str], start: int, count: int, filename: str) -> Iterable[tuple[str, int]]:
    for row in range(start, start + count):
        if row >= len(lines):
            raise DatasetFormatError(f"{filename}: ends before its {count} people are listed")
        fields = lines[row].split("\t")
        if len(fields) != 2:
            raise DatasetFormatError(f"{filename}:{row + 1}: expected 'name<TAB>count', got {lines[row]!r}")
        yield fields[0], _int(lines, row, fields[1], filename)
