"""Export facenet-pytorch's MTCNN P/R/O-Nets to ONNX once, so devices detect faces without torch.

Run by `fedface models fetch` (beside the published recognition weights): setup is the one step
that has torch and the facenet-pytorch wheel anyway, and a device then never pays torch's import
(3-4 s, ~0.9 GB) to find a face. The wheel's weight files are checked against the sha256s of
facenet-pytorch 2.6.0 first; each exported net is checked against torch on inputs of other sizes
and batch counts than the export example; the folder is written beside the final one and moved in
whole, manifest (with each file's sha256, which loading checks) included.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from export.detector_folder import install_folder
from facecore.align.detector_files import DetectorCorrupt, DetectorMissing
from facecore.align.onnx_detector import FORMAT, SOURCE, detector_dir, detector_files
from facecore.digest import file_sha256
from facecore.errors import FaceCoreError

OPSET = 17
# facenet_pytorch/data/*.pt of the 2.6.0 wheel
SOURCE_SHA256 = {
    "pnet": "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f",
    "rnet": "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86",
    "onet": "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d",
}
OUTPUTS = {"pnet": ("offsets", "probabilities"), "rnet": ("offsets", "probabilities"),
           "onet": ("offsets", "landmarks", "probabilities")}
PARITY_TOLERANCE = 1e-4


def export_mtcnn_onnx(folder: Path | None = None, force: bool = False) -> Path:
    """The folder holding pnet/rnet/onet.onnx and manifest.json; exported only when missing,
    corrupt or `force`d."""
    folder = folder or detector_dir()
    if not force:
        try:
            detector_files(folder)
            return folder
        except (DetectorMissing, DetectorCorrupt):
            pass
    nets = _load_nets()

    def write(staging: Path) -> dict[str, Path]:
        for name, net in nets.items():
            _export(name, net, staging / f"{name}.onnx")
            _check_parity(name, net, staging / f"{name}.onnx")
        return {name: staging / f"{name}.onnx" for name in nets}

    install_folder(folder, write, {"format": FORMAT, "source": SOURCE, "source_sha256": SOURCE_SHA256, "opset": OPSET,
                                   "input": "image: (N, 3, H, W) float32 RGB, (pixel - 127.5) / 128"})
    detector_files(folder)
    return folder


def _load_nets() -> dict[str, torch.nn.Module]:
    import facenet_pytorch
    from facenet_pytorch.models.mtcnn import ONet, PNet, RNet


    data = Path(facenet_pytorch.__file__).parent / "data"
    for name, expected in SOURCE_SHA256.items():
        if file_sha256(data / f"{name}.pt") != expected:
            raise FaceCoreError(f"{data / name}.pt is not {SOURCE}'s {name} (sha256 differs): "
                                "reinstall facenet-pytorch==2.6.0")
    return {"pnet": PNet().eval(), "rnet": RNet().eval(), "onet": ONet().eval()}


def _example(name: str, batch: int = 1, size: int = 37) -> torch.Tensor:
    side = {"pnet": size, "rnet": 24, "onet": 48}[name]
    return torch.rand(batch, 3, side, side + (3 if name == "pnet" else 0)) * 2 - 1


def _export(name: str, net: torch.nn.Module, path: Path) -> None:
    axes = {"image": {0: "batch", 2: "height", 3: "width"} if name == "pnet" else {0: "batch"}}
    axes |= {output: {0: "batch"} for output in OUTPUTS[name]}
    with torch.no_grad():
        torch.onnx.export(net, (_example(name),), str(path), dynamo=False, opset_version=OPSET,
                          do_constant_folding=True, input_names=["image"], output_names=list(OUTPUTS[name]),
                          dynamic_axes=axes)


def _check_parity(name: str, net: torch.nn.Module, path: Path) -> None:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    torch.manual_seed(0)
    example = _example(name, batch=3, size=61)
    with torch.no_grad():
        expected = [t.numpy() for t in net(example)]
    got = session.run(None, {"image": example.numpy()})
    worst = max(float(np.abs(e - g).max()) for e, g in zip(expected, got))
    if worst > PARITY_TOLERANCE:
        raise FaceCoreError(f"the ONNX {name} differs from torch by {worst:.2e} (> {PARITY_TOLERANCE:g})")
