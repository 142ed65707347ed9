"""Reader for CelebA-style data: an image folder plus lines of `<file> <identity id>`."""
from __future__ import annotations

from pathlib import Path

from facecore.data.records import FaceImage
from facecore.errors import DatasetFormatError


def read_celeba(root: str | Path, identity_file: str = "identity.txt", image_dir: str = "img") -> list[FaceImage]:
    root = Path(root)
    listing = root / identity_file
    if not listing.is_file():
        raise DatasetFormatError(f"{listing} is missing")
    images: list[FaceImage] = []
    for number, line in enumerate(listing.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise DatasetFormatError(f"{listing}:{number}: expected '<file> <identity>', got {line!r}")
        path = root / image_dir / fields[0]
        if not path.is_file():
            raise DatasetFormatError(f"{listing}:{number}: {path} does not exist")
        images.append(FaceImage(f"celeba:{fields[1]}", path))
    return sorted(images)
