"""The smaller-evaluation options that `fedface demo` and `fedface sim cross-device` share.

`--folds` picks LFW people folds; `--eval-photos N` scores on a seeded subset of at most N of their
photos (`facecore.eval.lfw.subset_pairs`), which is also all a first run aligns. Each bad value is a
one-line usage error naming the flag. Imports nothing heavy: `--help` must not load numpy or torch.
"""
from __future__ import annotations

import argparse

EVAL_PHOTOS_HELP = ("score on a seeded subset of at most N of the folds' photos (their View-2 pairs, balanced over folds and "
                    "matched/mismatched) instead of all of them (7,068 on folds 6-10); a first run aligns only these; "
                    "reports say it is a subset and of how many pairs (default: every photo)")


def add_eval_photos(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval-photos", type=int, default=None, metavar="N", help=EVAL_PHOTOS_HELP)


def evaluation_choice(folds_spec: str, eval_photos: int | None, tuning: bool = False) -> tuple[tuple[int, ...], int | None]:
    """(folds, eval_photos) from the flags, or a UsageError. Folds are the test folds 6-10, or with
    `tuning` all of them within the tuning folds 1-5 (never a mix: a figure is one or the other)."""
    from facecore.data.lfw import parse_folds
    from facecore.errors import DatasetFormatError
    from facecore.eval.lfw import MIN_SUBSET_PHOTOS_PER_FOLD, TEST_FOLDS
    from fedface.cli import UsageError

    try:
        folds = parse_folds(folds_spec)
    except DatasetFormatError as error:
        raise UsageError(f"--folds {folds_spec}: {error}") from None
    tests = sorted(TEST_FOLDS & set(folds))
    if not tuning and len(tests) < len(folds):
        raise UsageError(f"--folds {folds_spec}: scores come from the test folds 6-10 only (folds 1-5 hold people "
                         "that trained the models)")
    if tuning and tests and len(tests) < len(folds):
        raise UsageError(f"--folds {folds_spec} mixes tuning folds 1-5 with test folds 6-10: choose folds on one side")
    if len(folds) < 2:
        raise UsageError(f"--folds {folds_spec}: accuracy sets each fold's threshold on the other folds: name at least 2")
    least = MIN_SUBSET_PHOTOS_PER_FOLD * len(folds)
    if eval_photos is not None and eval_photos < least:
        raise UsageError(f"--eval-photos {eval_photos}: at least {least} for {len(folds)} folds (a matched and a mismatched "
                         "pair in each)")
    return folds, eval_photos


def subset_line(subset: dict[str, int] | None) -> str:
    """How a report says its figure is on a subset ('' when it is on every photo of the folds)."""
    if subset is None:
        return ""
    return (f"on a seeded subset: {subset['photos']:,} of {subset['of_photos']:,} photos, {subset['pairs']:,} of "
            f"{subset['of_pairs']:,} View-2 pairs (--eval-photos)")


__all__ = ["EVAL_PHOTOS_HELP", "add_eval_photos", "evaluation_choice", "subset_line"]
