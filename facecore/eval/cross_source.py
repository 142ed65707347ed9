"""The second figure beside every LFW one: owner against others on CelebA photos.

The published dlib model was trained on web photos that may include LFW people, so each LFW
figure is paired with one on faces from another source: the split's device identities' CelebA
photos (118 identities, about 2,600 in-the-wild photos at seed 0). Neither pretraining nor
distillation uses them. Scored exactly as `fedface eval folder` scores a user's folder (all
genuine and impostor pairs, the model's own crop), through a folder of links, one per photo.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from facecore.data.split import SplitManifest
from facecore.errors import FaceCoreError
from facecore.eval.folder import FolderReport, evaluate_folder

SOURCE_PREFIX = "celeba:"


def celeba_owner_check(model: torch.nn.Module, root: Path, manifest: SplitManifest, progress: bool = True) -> FolderReport:
    """All-pairs verification among the device identities' CelebA photos."""
    owners = {identity: paths for identity, paths in manifest.sets["devices"].items() if identity.startswith(SOURCE_PREFIX)}
    if len(owners) < 2:
        raise FaceCoreError(f"the split has {len(owners)} CelebA device identities; the cross-source check needs 2 or more")
    with tempfile.TemporaryDirectory(prefix="fedface-celeba-owners-") as scratch:
        for identity, paths in owners.items():
            person = Path(scratch) / identity.removeprefix(SOURCE_PREFIX)
            person.mkdir()
            for relative in paths:
                (person / Path(relative).name).symlink_to(root / relative)
        return evaluate_folder(scratch, model, progress=progress)
