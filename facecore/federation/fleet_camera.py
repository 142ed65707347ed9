"""The round settings that adapt a strong pretrained model to a fleet's camera.

A fleet camera (a night door camera, a near-infrared face-unlock sensor) shows faces the web photos
never did. Each device enrolled its owner from ordinary photos, and its own camera adds photos of the
same owner (`FaceDevice.add_photos`). These rounds teach the shared backbone to map the camera's view
of each owner onto the template the pretrained model made from the ordinary photos.

Invariants, each of which the recipe needs (simulator/REPORT.md, section 8, measured on tuning people,
never on LFW folds 6-10):
- templates stay as enrolled (`train_embedding` false, no spreadout): moving them lets the rounds
  chase their own targets;
- the positive loss runs on features and template less `feature_center`, a fixed unit mean feature of
  public faces under the pretrained model: the features all lean one way, so uncentred cosines sit
  above the margin and the loss is zero;
- the target is the enrolment photos' mean feature less the centre: the template at the length the device
  kept at enrolment (`train_local`'s `template_length`). The unit template less the centre leans towards
  the centre, and a loss towards it pulls every face that way: on the tuning people it gains less than
  half as much (simulator/REPORT.md, section 10);
- one small step a round, every device counted once, and server momentum: the loss is sharp, and a
  larger device step raises it.
- the last 8 blocks and the head train (5.34M of the default model's 5.61M weights). A device trains on its
  clean enrolment photos as well as its camera's, which holds the clean faces but halves the camera photos'
  share of each step; with 4 blocks that path gained too little under the camera, and with 8 it gains as
  much as camera-only training did, real side light included (simulator/REPORT.md, section 10).
- Plain uploads cross in 4 bits a weight with a scale a row, each device carrying what the codes miss to its
  next update (facecore.federation.quantize): a quarter of fp16's bytes, and the rounds lose nothing to it
  (simulator/REPORT.md, section 11). Secure aggregation keeps its own fixed point instead.
- Secure aggregation's bound on each delta (devices clip to it, and the server checks the unmasked sum
  against it) sits above every honest delta: a delta's length grows with the device's photos, and a bound
  that clips the largest devices moves the photo-weighted sum they dominate (SECURITY.md, *Bounded inputs*).
  Its fixed point takes 22 bits, so that the small deltas of devices with few photos do not round to zero.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from facecore.federation.config import is_unit_vector

LOCAL_LR = 0.002
TRAINABLE_BLOCKS = 8
SERVER_MOMENTUM = 0.9
SECURE_SCALE_BITS = 22
SECURE_MAX_UPDATE_NORM = 0.25
UPLOAD_BITS = 4


def fleet_camera_settings(feature_center: Sequence[float], secure_aggregation: bool = False) -> dict[str, dict[str, Any]]:
    """The `local`, `spreadout` and `aggregation` sections of a round config, and with
    `secure_aggregation` its fixed point and bound instead of 4-bit uploads. Secure aggregation sums
    updates weighted by their photos, so it keeps that weighting instead of one per device."""
    center = [float(x) for x in feature_center]
    if not is_unit_vector(center):
        raise ValueError("the feature centre must be a unit vector (the normalised mean feature of public faces)")
    settings: dict[str, dict[str, Any]] = {
        "local": {"epochs": 1, "lr": LOCAL_LR, "trainable_blocks": TRAINABLE_BLOCKS, "train_embedding": False, "feature_center": center},
        "spreadout": {"steps": 0},
        "aggregation": {"weighting": "samples" if secure_aggregation else "devices", "server_momentum": SERVER_MOMENTUM},
    }
    if secure_aggregation:
        settings["secure_aggregation"] = {"scale_bits": SECURE_SCALE_BITS, "max_update_norm": SECURE_MAX_UPDATE_NORM}
    else:
        settings["local"]["upload_bits"] = UPLOAD_BITS
    return settings


__all__ = ["fleet_camera_settings"]
