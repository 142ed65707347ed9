"""The capture lab: arms that adapt the default model to a fleet camera, measured fast on the tuning people.

`python -m simulator.cross_device.capture_lab --capture lowlight-ir --arm fedface --rounds 30 ...`

It trains only the last `--blocks` blocks of the default model, on frozen-prefix activations computed
once (device_sdk.training.split_backbone), so a round of every device takes seconds, not minutes. It
is where settings are searched; the chosen one then runs in `fedface sim cross-device`, the live path.

Invariants:
- The photos are the simulator's: the split's device identities with the owner holdout (0.3), taken
  by the capture model with `captured` (the run's seed); LFW folds 1-5 less the devices' people, taken
  with the LFW evaluation's fixed draws; the CelebA people of the split's public role, whom the
  default model never trained on and no device holds. LFW folds 6-10 are never loaded.
- Every TAR is over all genuine and impostor pairs, with the same figure per people fold (LFW folds;
  CelebA people hashed into five groups) for the noise over people.
- The owners' held-out photos (the holdout's 30%, as the camera takes them) are never trained on.
  Each is scored against every owner's template of its clean photos, as SDK devices enroll, at the
  threshold a version publishes (FAR 1e-3 on the clean LFW people) and at the owners' own 1% and 0.1%
  impostor accept, which is chosen on them and only compares arms (`owner_figures`).
- The features a loss sees are centred on a fixed mean (the pretrained model's mean feature of the
  clean public CelebA or LFW photos, or of the devices' templates: `--center-on`) when `--center` is
  given; what is scored is always the model's own feature.
- Cached prefix activations are named by the capture model, the detector and the crop they were
  computed with: a new detector or geometry computes them again.
- FedFace's server step is FedAvg of every device once, with `--server-momentum` FedAvgM; devices
  start from the model as the wire sends it (`--wire`).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from device_sdk.training import split_backbone
from facecore.align.detectors import detector_version
from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.capture import CAPTURES, get_capture
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.eval.calibration import CALIBRATION_FAR, CALIBRATION_FOLDS
from facecore.eval.lfw import load_lfw_faces
from facecore.eval.metrics import all_pairs_scores, tar_at_far, threshold_at_far
from facecore.eval.owners import owner_scores
from facecore.eval.plots import save_line_plot
from facecore.losses import spreadout_optimize
from facecore.models.checkpoint import load_backbone
from facecore.models.preprocess import faces_to_tensor
from facecore.paths import cache_root, data_root
from facecore.templates import mean_feature_embedding
from simulator.cross_device.evaluation import (
    CELEBA_CAPTURE_STREAM,
    LFW_CAPTURE_SEED,
    LFW_CAPTURE_STREAM,
    PEOPLE_GROUPS,
    people_groups,
    people_verification,
)
from simulator.cross_device.population import Population, SimDevice, captured, load_population


def _cached(path: Path, build: Callable[[], Any]) -> Any:
    """What `build` returns, kept at `path` (written whole or not at all): prefix activations cost minutes."""
    if path.is_file():
        return torch.load(path, weights_only=False)
    result = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(result, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return result


def _crop_key(model: nn.Module) -> str:
    """The detector and crop the activations were computed on: a new detector or geometry is a new file."""
    return hashlib.sha256(f"{detector_version()}|{geometry_of(model)!r}".encode()).hexdigest()[:12]


@torch.no_grad()
def _activations(prefix: nn.Module, faces: np.ndarray, flip: bool = False) -> Tensor:
    batches = (faces_to_tensor(faces[i : i + 64]) for i in range(0, len(faces), 64))
    return torch.cat([prefix(x.flip(3) if flip else x) for x in batches])


def prepare(model: nn.Module, capture: str, blocks: int, seed: int) -> dict[str, Any]:
    """Prefix activations of every set, clean and captured."""

    def build() -> dict[str, Any]:
        root, geometry, camera = data_root(), geometry_of(model), get_capture(capture)
        prefix, _ = split_backbone(model, blocks)
        manifest = build_split(root, SplitConfig(seed=0))
        population, devices = _devices(manifest, model, capture, seed)
        lfw = load_lfw_faces(root / "lfw", CALIBRATION_FOLDS, aligner=FaceAligner(geometry=geometry))
        lfw_captured = camera.capture(lfw.faces, geometry, LFW_CAPTURE_SEED, LFW_CAPTURE_STREAM)
        keep = ~np.isin(lfw.identities, [d.identity for d in devices])
        folds = np.asarray(lfw.face_fold)  # every people fold is loaded whole, so each face has its fold
        public = [image for image in manifest.images("public", root) if image.identity.startswith("celeba:")]
        celeba = load_labelled_faces(public, FaceAligner(geometry=geometry), desc="CelebA public people")
        celeba_ids = np.array(celeba.classes)[celeba.labels]
        train = np.concatenate([d.faces for d in devices])
        clean = np.concatenate([d.faces for d in population.devices])
        return {
            "train": _activations(prefix, train), "train_flipped": _activations(prefix, train, flip=True),
            "train_clean": _activations(prefix, clean),
            "labels": torch.from_numpy(np.concatenate([np.full(len(d.faces), d.index) for d in devices])).long(),
            "eval": {
                "lfw_captured": (_activations(prefix, lfw_captured[keep]), lfw.identities[keep], folds[keep]),
                "lfw_clean": (_activations(prefix, lfw.faces[keep]), lfw.identities[keep], folds[keep]),
                "celeba_captured": (_activations(prefix, camera.capture(celeba.faces, geometry, LFW_CAPTURE_SEED, CELEBA_CAPTURE_STREAM)),
                                    celeba_ids, people_groups(celeba_ids)),
                "celeba_clean": (_activations(prefix, celeba.faces), celeba_ids, people_groups(celeba_ids)),
            },
        }

    return _cached(cache_root() / "capture-lab" / f"{capture}-b{blocks}-s{seed}-{CAPTURES[capture].version}-{_crop_key(model)}-v2.pt", build)


def _devices(manifest: SplitManifest, model: nn.Module, capture: str, seed: int) -> tuple[Population, tuple[SimDevice, ...]]:
    """The split's device people with the owner holdout: as they are, and as the fleet camera takes them."""
    root, geometry = data_root(), geometry_of(model)
    population = load_population(manifest, root, 1000, seed, geometry=geometry, holdout=0.3)
    return population, captured(population, capture, geometry, seed).devices


def owners(model: nn.Module, capture: str, blocks: int, seed: int) -> tuple[Tensor, Tensor]:
    """The owners' held-out photos as the fleet camera takes them (prefix activations, each photo's
    device), which no arm trains on: what each owner is verified on against `prepare`'s clean photos."""

    def build() -> tuple[Tensor, Tensor]:
        prefix, _ = split_backbone(model, blocks)
        held = [(d.index, d.held_out) for d in _devices(build_split(data_root(), SplitConfig(seed=0)), model, capture, seed)[1]
                if d.held_out is not None]
        return (_activations(prefix, np.concatenate([photos for _, photos in held])),
                torch.from_numpy(np.concatenate([np.full(len(photos), index) for index, photos in held])).long())

    return _cached(cache_root() / "capture-lab" / f"owners-{capture}-b{blocks}-s{seed}-{CAPTURES[capture].version}-{_crop_key(model)}.pt", build)


def yale_b(model: nn.Module, blocks: int) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """Real side light: Yale B's 10 people under 64 light directions (prefix activations, identities,
    a group per pair of people, each photo's light azimuth in degrees). Nothing here is simulated."""

    def build() -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray]:
        photos = sorted((data_root() / "yale_b").glob("*/*.pgm"))
        aligned = FaceAligner(geometry=geometry_of(model)).align_paths(photos, progress=False)
        people = np.array([p.parent.name for p in photos])[aligned.kept]
        azimuth = np.array([int(p.stem.split("A")[1][:4]) for p in photos])[aligned.kept]
        prefix, _ = split_backbone(model, blocks)
        return _activations(prefix, aligned.faces), people, np.array([int(name[-2:]) % PEOPLE_GROUPS for name in people]), azimuth

    return _cached(cache_root() / "capture-lab" / f"yale-b-b{blocks}-{_crop_key(model)}.pt", build)


@torch.no_grad()
def embed(suffix: nn.Module, x: Tensor) -> np.ndarray:
    return F.normalize(torch.cat([suffix(x[i : i + 256]) for i in range(0, len(x), 256)]), dim=1).numpy()


def verification(embeddings: np.ndarray, identities: np.ndarray, groups: np.ndarray) -> dict[str, Any]:
    """people_verification's figures in the lab's percent keys."""
    found = people_verification(embeddings, identities, groups)
    return {"tar3": round(100 * found["tar_at_far"]["1e-3"], 2), "tar4": round(100 * found["tar_at_far"]["1e-4"], 2),
            "auc": round(found["auc"], 5), "eer": round(100 * found["eer"], 2),
            "tar3_per_group": [round(100 * t, 2) for t in found["tar_at_far_per_group"]["1e-3"]]}


def score(suffix: nn.Module, sets: dict[str, Any]) -> dict[str, Any]:
    embedded = {name: embed(suffix, x) for name, (x, _, _) in sets["eval"].items()}
    result: dict[str, Any] = {name: verification(embedded[name], ids, groups) for name, (_, ids, groups) in sets["eval"].items()}
    if "yale_b" in sets:
        x, people, groups, azimuth = sets["yale_b"]
        result["yale_b"] = verification(embed(suffix, x), people, groups)
        side = np.abs(azimuth) >= 35  # the side light lowlight-ir draws from
        result["yale_b_side"] = verification(embed(suffix, x[torch.from_numpy(side)]), people[side], groups[side])
    if "owners" in sets:
        _, impostor = all_pairs_scores(embedded["lfw_clean"], sets["eval"]["lfw_clean"][1])
        result["owners"] = owner_figures(suffix, sets, threshold_at_far(impostor, CALIBRATION_FAR))
    return result


def owner_figures(suffix: nn.Module, sets: dict[str, Any], threshold: float) -> dict[str, Any]:
    """Each owner's held-out camera photos against every owner's template of its clean photos, as
    SDK devices enroll (facecore.eval.owners): accept rates at `threshold`, the clean LFW people's
    (as a version recalibrates it), and the genuine accept where these very impostor pairs are held to
    1% and 0.1% (chosen on them: for comparison only, never a threshold to publish)."""
    enrolled, labels = embed(suffix, sets["train_clean"]), sets["labels"].numpy()
    held_activations, held_labels = sets["owners"]
    held, held_labels = embed(suffix, held_activations), held_labels.numpy()
    devices = np.unique(held_labels)
    found = owner_scores([enrolled[labels == d] for d in devices], [held[held_labels == d] for d in devices])
    report = found.report(threshold)
    best = tar_at_far(*found.genuine_and_impostor(), (1e-2, 1e-3))
    return {"threshold": round(threshold, 4), "genuine": round(100 * report.genuine_accept, 2),
            "impostor": round(100 * report.impostor_accept, 3),
            "genuine_at_impostor_1": round(100 * best["1e-2"], 2), "genuine_at_impostor_0.1": round(100 * best["1e-3"], 2)}


def _centring(args: argparse.Namespace, suffix: nn.Module, sets: dict[str, Any]) -> Callable[[Tensor], Tensor]:
    """How a loss moves unit features (`--center`, `--center-on`, `--center-mean`); unchanged without `--center`."""
    if not args.center:
        return lambda f: f
    if args.center_on == "span":  # the plane both public sources' mean features lie in, projected out
        means = np.stack([embed(suffix, sets["eval"][f"{source}_clean"][0]).mean(0) for source in ("lfw", "celeba")])
        basis = torch.linalg.qr(torch.from_numpy(means).T).Q
        return lambda f: F.normalize(f - (f @ basis) @ basis.T, dim=1)
    if args.center_on == "templates":  # what a server holds: the mean of the devices' enrolled templates
        own, labels = embed(suffix, sets["train"] if args.targets == "captured" else sets["train_clean"]), sets["labels"].numpy()
        mean = torch.from_numpy(mean_feature_embedding(np.stack([mean_feature_embedding(own[labels == d]) for d in np.unique(labels)])))
    else:  # the public photos of one source: CelebA's, or LFW's (the sim's; the lab scores those same people)
        mean = torch.from_numpy(embed(suffix, sets["eval"][f"{args.center_on}_clean"][0]).mean(0))
        mean = mean if args.center_mean else F.normalize(mean, dim=0)
    return lambda f: F.normalize(f - mean, dim=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", choices=sorted(CAPTURES), required=True)
    parser.add_argument("--arm", choices=("pretrained", "central", "fedface"), default="fedface")
    parser.add_argument("--blocks", type=int, default=4, help="trainable last blocks")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (central: epochs)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--margin", type=float, default=0.9, help="fedface: positive margin")
    parser.add_argument("--center", action="store_true", help="losses on features centred on a public mean")
    parser.add_argument("--fixed-embeddings", action="store_true", help="fedface: devices do not move their class embedding")
    parser.add_argument("--center-on", choices=("celeba", "lfw", "templates", "span"), default="celeba",
                        help="with --center: the mean feature of the public CelebA or LFW photos, or the mean of the devices' enrolled templates")
    parser.add_argument("--targets", choices=("captured", "clean"), default="captured",
                        help="class embeddings: the pretrained model's mean feature of the owner's captured photos, "
                             "or of the same photos clean (an owner who enrolled with a phone's own camera)")
    parser.add_argument("--center-mean", action="store_true", help="with --center: subtract the mean unit feature itself, not its direction")
    parser.add_argument("--templates", choices=("centred", "mean", "unit"), default="centred",
                        help="with --center, the targets: the normalised mean of the centred features; the mean feature less "
                             "the centre (what a device trains towards, device_sdk.training.train_local's template_length); "
                             "the unit template less the centre (what devices trained towards before)")
    parser.add_argument("--rehearse-clean", action="store_true", help="devices also train on their clean enrolment photos")
    parser.add_argument("--rehearse-weight", type=float, default=None,
                        help="with --rehearse-clean: the loss is the camera photos' mean plus this times the clean photos' mean, "
                             "instead of one mean over both (which halves the camera photos' step)")
    parser.add_argument("--anchor-clean", type=float, default=0.0,
                        help="fedface: weight of a term holding each clean enrolment photo's centred feature where the pretrained model put it")
    parser.add_argument("--loss", choices=("cosface", "positive"), default="cosface",
                        help="central: CosFace over every device's class, or the devices' own positive-only loss pooled")
    parser.add_argument("--server-momentum", type=float, default=0.0, help="fedface: the server's momentum on the averaged update")
    parser.add_argument("--wire", choices=("fp32", "fp16"), default="fp32", help="fedface: the precision devices receive the model in")
    parser.add_argument("--device-batch", type=int, default=32, help="fedface: a device's batch of photos")
    parser.add_argument("--local-epochs", type=int, default=1, help="fedface: passes over its photos a device makes per round")
    parser.add_argument("--nu", type=float, default=0.3)
    parser.add_argument("--spreadout-lr", type=float, default=0.01)
    parser.add_argument("--spreadout-steps", type=int, default=10, help="0: no server spreadout")
    parser.add_argument("--scale", type=float, default=30.0, help="central: CosFace scale")
    parser.add_argument("--cosface-margin", type=float, default=0.2)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON lines of every evaluated round")
    args = parser.parse_args(argv)
    if args.rehearse_weight is not None and not args.rehearse_clean:
        parser.error("--rehearse-weight weighs the clean photos that --rehearse-clean adds: give both")
    torch.manual_seed(args.seed)
    model = load_backbone("default").eval()
    sets = prepare(model, args.capture, args.blocks, args.seed) | {"yale_b": yale_b(model, args.blocks),
                                                                 "owners": owners(model, args.capture, args.blocks, args.seed)}
    _, suffix = split_backbone(model, args.blocks)
    centred = _centring(args, suffix, sets)

    def features(model: nn.Module, x: Tensor) -> Tensor:
        return centred(F.normalize(model(x), dim=1))

    x, flipped, labels = sets["train"], sets["train_flipped"], sets["labels"]
    devices = int(labels.max()) + 1
    enrolled = x if args.targets == "captured" else sets["train_clean"]
    if args.rehearse_clean:  # a device also trains on its clean enrolment photos (not mirrored) towards the same template
        x, flipped, labels = torch.cat([x, sets["train_clean"]]), torch.cat([flipped, sets["train_clean"]]), torch.cat([labels, labels])
    with torch.no_grad():
        W = torch.stack([F.normalize(features(suffix, enrolled[sets["labels"] == d]).mean(0), dim=0) for d in range(devices)])
        if args.templates != "centred":  # a template the centre moves as the devices' loss moves it
            mean = torch.stack([F.normalize(suffix(enrolled[sets["labels"] == d]), dim=1).mean(0) for d in range(devices)])
            W = centred(mean if args.templates == "mean" else F.normalize(mean, dim=1))
    with torch.no_grad():  # the anchor's reference: the pretrained model's centred feature of each clean enrolment photo
        anchors = features(suffix, sets["train_clean"]) if args.anchor_clean else None
    rng = np.random.default_rng(args.seed)
    history = [{"round": 0, **score(suffix, sets)}]
    print(json.dumps(history[-1]), flush=True)
    head = nn.Parameter(W.clone())  # central's classifier
    if args.arm == "central":
        central_opt = torch.optim.SGD([*suffix.parameters(), *([head] if not args.fixed_embeddings else [])], lr=args.lr, momentum=0.9)
    velocity = [torch.zeros_like(p) for p in suffix.parameters()]  # FedFace's server momentum
    for round_number in range(1, args.rounds + 1 if args.arm != "pretrained" else 1):
        started, losses = time.perf_counter(), []

        def batch(rows: Tensor) -> Tensor:  # each photo or its mirror image, as a device trains
            return torch.where(torch.rand(len(rows), 1, 1, 1) < 0.5, x[rows], flipped[rows])

        if args.arm == "central":
            order = torch.from_numpy(rng.permutation(len(labels)))
            for start in range(0, len(order), 64):
                rows = order[start : start + 64]
                cosine = features(suffix, batch(rows)) @ F.normalize(head, dim=1).T
                if args.loss == "positive":
                    own_cosine = cosine.gather(1, labels[rows, None]).ravel()
                    loss = (args.margin - own_cosine).clamp_min(0).pow(2).mean()
                else:
                    loss = F.cross_entropy(args.scale * (cosine - args.cosface_margin * F.one_hot(labels[rows], devices)), labels[rows])
                central_opt.zero_grad()
                loss.backward()
                central_opt.step()
                losses.append(loss.item())
        else:
            start_state = [p.detach().clone() for p in suffix.parameters()]
            received = copy.deepcopy(suffix)
            if args.wire == "fp16":  # devices receive the model in fp16, as the live wire sends it
                with torch.no_grad():
                    for p in received.parameters():
                        p.copy_(p.half().float())
            sent = [p.detach().clone() for p in received.parameters()]
            total = [torch.zeros_like(p) for p in start_state]
            for device in range(devices):
                local, embedding = copy.deepcopy(received), nn.Parameter(W[device].clone())
                opt = torch.optim.SGD([*local.parameters(), *([] if args.fixed_embeddings else [embedding])], lr=args.lr, momentum=0.9)
                own = torch.nonzero(labels == device).ravel()
                if anchors is not None:  # the device's clean enrolment photos and where the pretrained model put them
                    clean_rows = torch.nonzero(sets["labels"] == device).ravel()
                    clean_photos, clean_anchors = sets["train_clean"][clean_rows], anchors[clean_rows]
                for start in [s for _ in range(args.local_epochs) for s in range(0, len(own), args.device_batch)]:
                    rows = own[start : start + args.device_batch]
                    per_photo = (args.margin - features(local, batch(rows)) @ F.normalize(embedding, dim=0)).clamp_min(0).pow(2)
                    loss = per_photo.mean()
                    if args.rehearse_weight is not None:  # rows past the camera's photos are the clean ones
                        clean = rows >= len(sets["labels"])
                        loss = sum((w * per_photo[m].mean() for w, m in ((1.0, ~clean), (args.rehearse_weight, clean)) if m.any()),
                                   torch.zeros(()))
                    if anchors is not None:
                        held = (features(local, clean_photos) * clean_anchors).sum(1)
                        loss = loss + args.anchor_clean * (1 - held).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                W[device] = F.normalize(embedding.detach(), dim=0)
                for acc, p, p0 in zip(total, local.parameters(), sent):
                    acc += (p.detach() - p0) / devices  # FedAvg, each device once
            with torch.no_grad():
                for p, p0, delta, v in zip(suffix.parameters(), start_state, total, velocity):
                    v.mul_(args.server_momentum).add_(delta)  # FedAvgM; 0: plain FedAvg
                    p.copy_(p0 + v)
            if args.spreadout_steps:
                W = spreadout_optimize(W, steps=args.spreadout_steps, lr=args.spreadout_lr, momentum=0.9, nu=args.nu)
        record: dict[str, Any] = {"round": round_number, "loss": round(float(np.mean(losses)), 5),
                                  "seconds": round(time.perf_counter() - started, 1)}
        if round_number % args.eval_every == 0 or round_number == args.rounds:
            record |= score(suffix, sets)
        history.append(record)
        print(json.dumps(record), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(h) + "\n" for h in history))
        evaluated = [h for h in history if "lfw_captured" in h]
        save_line_plot(args.out.with_suffix(".png"), {
            name: ([h["round"] for h in evaluated], [h[name]["tar3"] for h in evaluated]) for name, value in evaluated[0].items()
            if isinstance(value, dict) and "tar3" in value
        }, "round" if args.arm != "central" else "epoch", "TAR@FAR=1e-3 (%)", f"{args.arm} under {args.capture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
