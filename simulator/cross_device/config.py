"""Validated hyper-parameters of a cross-device simulation (defaults: the FedFace paper and its code).

Invariants: a checkpoint holds `to_dict()`, and a run resumes only under the same meaning, so a default
here never changes (a field added later reads as LEGACY_DEFAULTS in an older checkpoint). The settings a
live round shares are `fedface sim cross-device`'s flags with RoundConfig's defaults, which equal these:
the bare command line is `CrossDeviceConfig()` (fedface/commands/round_flags_test.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, get_args

from device_sdk.training import LocalTrainingConfig
from facecore.capture import CAPTURES
from facecore.eval.lfw import MIN_SUBSET_PHOTOS_PER_FOLD
from facecore.federation.config import AggregationSettings, LocalSettings, RoundConfig, SpreadoutSettings, Weighting
from facecore.federation.wire import PRECISIONS, Precision
from facecore.spreadout import SpreadoutConfig

METHODS = ("pretrained", "fedavg", "fedface", "central")
BACKENDS = ("process", "ray")
EXECUTION_FIELDS = ("workers", "backend", "ray_address")  # where devices train, not what the run means
SELECTIONS = ("least_recent", "uniform")
SEEDINGS = ("live", "per_device")
WEIGHTINGS = get_args(Weighting)
ENROLMENTS = ("captured", "clean")
CENTER_SOURCES = ("lfw", "celeba", "model")  # model: the centre the starting model publishes, as a live round uses
# What a checkpoint written before a field existed ran with, so it resumes with its own meaning.
LEGACY_DEFAULTS: dict[str, Any] = {"selection": "uniform", "wire": "fp32", "seeding": "per_device", "public_negatives": 0, "public_rehearsal": False,
                                   "weighting": "samples", "eval_photos": None, "capture": None,
                                   "enrolment": "captured", "train_enrolment": False, "server_momentum": 0.0,
                                   "center_features": False, "center_source": "lfw", "upload_bits": None, "download_bits": None}
LEGACY_LOCAL_DEFAULTS: dict[str, Any] = {"negative_scale": 64.0, "negative_margin": 0.35, "train_embedding": True}
LEGACY_SPREADOUT_DEFAULTS: dict[str, Any] = {"center": False}


@dataclass(frozen=True)
class CrossDeviceConfig:
    devices: int = 1000
    rounds: int = 20
    per_round: int = 100
    method: str = "fedface"
    init: str = "mean"  # class-embedding start: mean feature (FedFace) or random
    spreadout: bool = True  # only meaningful for fedface; fedavg never spreads
    seed: int = 0
    model: str = "default"
    eval_every: int = 5
    eval_folds: tuple[int, ...] = (6, 7, 8, 9, 10)
    # The smaller evaluation: a seeded subset of at most this many of the folds' photos (None: all of them).
    eval_photos: int | None = None
    target_accuracy: float | None = None  # for rounds_to_target
    # Share of each device's photos it never trains on; its owner is verified on them (None: train on all).
    owner_holdout: float | None = None
    # Client: SGD lr 0.01, momentum 0.9, positive margin 0.9 (paper / official code).
    local: LocalTrainingConfig = field(default_factory=lambda: LocalTrainingConfig(epochs=1, lr=0.01, momentum=0.9, margin=0.9, batch=32))
    # Server: 10 spreadout SGD steps, lr 0.01, momentum 0.9, nu 0.3.
    server_spreadout: SpreadoutConfig = field(default_factory=SpreadoutConfig)
    # DP-FedAvg for the backbone: None = off; inf = clipping and equal weights without noise.
    dp_epsilon: float | None = None
    dp_clip: float = 1.0
    dp_delta: float = 1e-5
    # Devices upload templates blurred to keep this cosine with the true one (None: clean).
    template_noise_cos: float | None = None
    # Public identities whose templates the server sends each round, for devices to train against (0: none,
    # the paper's positive-only loss); CosFace's scale and margin against them are local.negative_*.
    public_negatives: int = 0
    # With public negatives: devices also get those people's faces and keep them near their templates.
    public_rehearsal: bool = False
    # The live rules (facecore.federation): the round server's least-recently-selected choice of devices,
    # and fp16 downloads and uploads, the SDK's default. "uniform" / "fp32" / "per_device" reproduce earlier runs.
    selection: str = "least_recent"
    wire: Precision = "fp16"
    # A live round's local.upload_bits: devices send each trained weight in 8 or 4 bits (facecore.federation.quantize)
    # and keep what the codes miss for their next update; None: at `wire`.
    upload_bits: int | None = None
    # A live round's local.download_bits: 8, devices train from the model's int8 file
    # (facecore.models.checkpoint.int8_received); None: from the model at `wire`.
    download_bits: int | None = None
    # "live": every device trains a round with the SDK's seed for it (training_seed); "per_device": earlier runs' seeds.
    seeding: str = "live"
    # FedAvg's weights: each device's update by its training photos (the paper's), or every device once.
    weighting: Weighting = "samples"
    # The server's heavy-ball momentum on each round's backbone step (0: plain FedAvg), as a live round's.
    server_momentum: float = 0.0
    # Device training in this many persistent processes (simulator/cross_device/workers.py); 1: in process.
    workers: int = 1
    # "process": the workers above on this machine; "ray": that many Ray actors (ray_backend.py), on
    # the cluster at ray_address (None: a local Ray, or RAY_ADDRESS).
    backend: str = "process"
    ray_address: str | None = None
    # The fleet's camera (facecore.capture): every device photo and the held-out LFW photos as it takes
    # them, so a run measures what the web photos never showed (None: the photos as they are).
    capture: str | None = None
    # Under a capture: the photos each device's template starts from, the fleet camera's ("captured") or
    # the same photos before it took them ("clean": the owner enrolled with a phone's own camera).
    enrolment: str = "captured"
    # With a clean enrolment: each device also trains on the clean photos it enrolled from, as an SDK device
    # does (it trains on every face it holds, the enrolment's and the camera's it added); False: the camera's only.
    train_enrolment: bool = False
    # The devices' positive loss centred on the direction the starting model's features of public faces
    # share (facecore.eval.feature_center, fixed at the start), as a live round's local.feature_center.
    center_features: bool = False
    center_source: str = "lfw"  # whose public photos: LFW's, CelebA's (then not an independent check of the CelebA people), the model's own

    def __post_init__(self) -> None:
        problems = [
            message for message, bad in (
                ("devices must be >= 2", self.devices < 2), ("rounds must be >= 0", self.rounds < 0),
                ("per_round must be >= 1", self.per_round < 1), (f"method must be one of {METHODS}", self.method not in METHODS),
                ("init must be mean or random", self.init not in ("mean", "random")),
                ("owner_holdout must be in (0, 1)", self.owner_holdout is not None and not 0 < self.owner_holdout < 1),
                ("eval_every must be >= 1", self.eval_every < 1),
                (f"eval_photos must be >= {MIN_SUBSET_PHOTOS_PER_FOLD} per eval fold",
                 self.eval_photos is not None and self.eval_photos < MIN_SUBSET_PHOTOS_PER_FOLD * len(self.eval_folds)),
                ("dp_epsilon must be > 0", self.dp_epsilon is not None and not self.dp_epsilon > 0),
                ("dp_clip must be > 0", not self.dp_clip > 0), ("dp_delta must be in (0, 1)", not 0 < self.dp_delta < 1),
                ("template_noise_cos must be in (0, 1]", self.template_noise_cos is not None and not 0 < self.template_noise_cos <= 1),
                ("DP-FedAvg needs a federated method", self.dp_epsilon is not None and self.method not in ("fedavg", "fedface")),
                ("workers must be >= 1", self.workers < 1), ("backend must be process or ray", self.backend not in BACKENDS),
                ("ray_address needs backend ray", self.ray_address is not None and self.backend != "ray"),
                (f"selection must be one of {SELECTIONS}", self.selection not in SELECTIONS),
                (f"wire must be one of {PRECISIONS}", self.wire not in PRECISIONS),
                ("upload_bits must be 8, 4 or None", self.upload_bits not in (None, 8, 4)),
                ("download_bits must be 8 or None", self.download_bits not in (None, 8)),
                (f"seeding must be one of {SEEDINGS}", self.seeding not in SEEDINGS),
                (f"weighting must be one of {WEIGHTINGS}", self.weighting not in WEIGHTINGS),
                ("weighting devices is FedAvg's: DP-FedAvg weighs every device once already", self.weighting == "devices" and self.dp_epsilon is not None),
                ("public_negatives must be >= 0", self.public_negatives < 0),
                ("public_rehearsal needs public_negatives", self.public_rehearsal and not self.public_negatives),
                ("public negatives are for fedface and fedavg", self.public_negatives > 0 and self.method not in ("fedavg", "fedface")),
                (f"capture must be one of {', '.join(CAPTURES)} (or none)", self.capture is not None and self.capture not in CAPTURES),
                ("server_momentum must be in [0, 1)", not 0 <= self.server_momentum < 1),
                ("enrolment must be captured or clean", self.enrolment not in ENROLMENTS),
                ("center_source must be lfw, celeba or model", self.center_source not in CENTER_SOURCES),
                ("enrolment clean needs a capture", self.enrolment == "clean" and self.capture is None),
                ("train_enrolment needs enrolment clean", self.train_enrolment and self.enrolment != "clean"),
                ("public negatives train in process: use workers 1 and backend process",
                 self.public_negatives > 0 and (self.workers > 1 or self.backend != "process")),
            ) if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def uses_spreadout(self) -> bool:
        return self.method == "fedface" and self.spreadout

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def round_config(self, devices: int, dp_noise_multiplier: float = 0.0) -> RoundConfig:
        """The live round that this simulation's rounds stand for: the server would aggregate it the same way."""
        target = min(self.per_round, devices)
        return RoundConfig(
            target_participants=target, min_participants=1,
            strategy="fedface" if self.uses_spreadout else "fedavg",
            local=LocalSettings(epochs=self.local.epochs, steps=self.local.steps, lr=self.local.lr, margin=self.local.margin,
                                batch_size=self.local.batch, trainable_blocks=self.local.trainable_blocks,
                                train_embedding=self.local.train_embedding, upload_bits=self.upload_bits,
                                download_bits=self.download_bits),
            spreadout=SpreadoutSettings(**asdict(self.server_spreadout)),
            aggregation=AggregationSettings(
                method="fedavg" if self.dp_epsilon is None else "dp_fedavg", weighting=self.weighting, max_update_norm=self.dp_clip,
                dp_noise_multiplier=dp_noise_multiplier, dp_delta=self.dp_delta, server_momentum=self.server_momentum,
            ),
        )
