"""The torch side of a device's round: the backbone file it downloads, the update file it uploads.

Invariants:
- This is the only module of `FaceDevice` (device_sdk.device) that needs torch, with the training itself
  (device_sdk.training) and the personal verifier's (device_sdk.personal). `FaceDevice` imports them inside
  the methods that train (`train_round`, `personalize`, `_load_backbone`), never at the top, so
  register, enroll, verify, status and unenroll run on numpy and onnxruntime alone.
- A backbone file is read with `weights_only=True` (no pickled code runs) and loaded into the architecture
  it names (`facecore.models.registry`), fp16 entries widened to fp32 and int8 ones multiplied back by their
  scales (`facecore.models.checkpoint.dequantized_state`): training always runs in fp32.
- A plain update file carries, for each entry local training changed (the round's trained entries,
  `facecore.federation.wire.trained_entries`), the trained value minus the base one (`wire.delta`, which the
  simulator uses too) at the wire's precision, and nothing for the frozen prefix; a secure-aggregation one
  masks every float entry (zero for the frozen ones: the masked vector's layout is the whole model's). Both
  add the template as the server may see it; the layout is server_api/README.md's.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from torch import nn

from device_sdk.backbone_check import check_backbone_payload
from device_sdk.errors import BadServerResponse
from device_sdk.secure_round import SecureRound
from device_sdk.training import LocalUpdate
from facecore import tensorfile
from facecore.federation.messages import UpdateMeta
from facecore.federation.protocol import EMBEDDING_KEY, MASKED_KEY, METADATA_KEY
from facecore.federation.quantize import quantized_update
from facecore.federation.wire import Precision, delta, update_tensors, wire_arrays
from facecore.models.checkpoint import dequantized_state
from facecore.models.registry import get_backbone


def load_backbone_file(path: Path, what: str) -> nn.Module:
    """The backbone a round downloaded (fp16, fp32 or int8 torch file), in fp32 and eval mode. Read once,
    mapped rather than copied, and checked against its registry entry (`check_backbone_payload`)
    before a model is built from it; a file torch cannot read, or that fails the check, is a
    BadServerResponse naming `what`."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises many types for a corrupt or hostile pickle
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        raise BadServerResponse(f"the server's {what} is refused: torch cannot read it ({reason})") from None
    check_backbone_payload(payload, what)
    model = get_backbone(payload["backbone"], embedding_dim=payload["embedding_dim"])
    model.load_state_dict(dequantized_state(payload))
    return model.eval()


def update_file(
    backbone: nn.Module, update: LocalUpdate, base_version: str, template: np.ndarray, precision: Precision,
    secure: SecureRound | None = None, bits: int | None = None, residual: dict[str, np.ndarray] | None = None,
) -> tuple[bytes, dict[str, np.ndarray] | None]:
    """The bytes to upload for `update`, trained from `backbone` (the round's base model), and with `bits`
    (the round's `local.upload_bits`) the residual to keep for the next update, `residual` being the last
    one. `template`: the trained class embedding as the server may see it (blurred when the owner asked for noise)."""
    kept = None
    if secure is not None:
        deltas = delta(update.state_dict, backbone.state_dict(), every_entry=True)
        masked = secure.masked(wire_arrays(deltas, "fp32"), update.n_samples).view(np.int32)
        tensors = {MASKED_KEY: masked, EMBEDDING_KEY: template}
    elif bits is not None:
        tensors, _, kept = quantized_update(wire_arrays(delta(update.state_dict, backbone.state_dict()), "fp32"), bits, residual)
        tensors[EMBEDDING_KEY] = np.asarray(template, np.float32)
    else:
        tensors = update_tensors(wire_arrays(delta(update.state_dict, backbone.state_dict()), precision), template, precision)
    meta = UpdateMeta(base_version=base_version, n_samples=update.n_samples,
                      metrics={"loss": update.loss_after, "loss_before": update.loss_before})
    buffer = io.BytesIO()
    tensorfile.write(buffer, tensors, {METADATA_KEY: meta.model_dump_json()})
    return buffer.getvalue(), kept


__all__ = ["load_backbone_file", "update_file"]
