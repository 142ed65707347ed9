"""Reader for the generic folder-per-identity layout: <root>/<identity>/<photo>."""
from __future__ import annotations

from pathlib import Path

from facecore.data.records import IMAGE_SUFFIXES, FaceImage
from facecore.errors import DatasetFormatError


def read_identity_folders(root: str | Path, namespace: str = "folder") -> list[FaceImage]:
    root = Path(root)
    if not root.is_dir():
        raise DatasetFormatError(f"{root} is not a folder")
    images = sorted(
        FaceImage(f"{namespace}:{person.name}", path)
        for person in root.iterdir()
        if person.is_dir()
        for path in person.iterdir()
        if path.suffix.lower() in IMAGE_SUFFIXES
    )
    if not images:
        raise DatasetFormatError(f"{root}: no images in <identity>/<photo> sub-folders")
    return images


def list_photos(paths: list[str | Path]) -> list[Path]:
    """A folder or a list of files -> image files, in order; used by device enrollment."""
    photos: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            photos.extend(sorted(p for p in item.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
        elif item.is_file():
            photos.append(item)
        else:
            raise DatasetFormatError(f"{item} does not exist")
    return photos
