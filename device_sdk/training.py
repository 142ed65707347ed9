"""The device's local FedFace round: train the backbone and the owner's class embedding with the
positive-only loss mean(max(0, m - cos(f, w))^2).

This is THE training code: the live SDK and the simulator both call `train_local`, so a simulated
device does exactly what a phone does.

BatchNorm runs on its global statistics (eval mode) by default: a device sees one person only,
and batch statistics of one face would both normalise away what makes it that face and drag the
averaged running statistics towards each device's owner.
"""
from __future__ import annotations

import copy
import math
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

# Re-exported: the simulator and the personal verifier take the template's start from here, with the training.
from facecore.errors import FaceCoreError
from facecore.federation.config import is_unit_vector
from facecore.federation.packed import Layout, PackedArrays
from facecore.federation.wire import Precision, delta, packed_delta, trained_entries, wire_arrays
from facecore.losses import cosface_loss, impostor_loss, positive_loss, public_negatives_loss
from facecore.models.preprocess import faces_to_tensor


class TrainingDiverged(FaceCoreError):
    """The local update is not finite; it must never be uploaded."""


@dataclass(frozen=True)
class LocalTrainingConfig:
    epochs: int = 1
    steps: int | None = None  # cap on optimizer steps per round (None: whole epochs)
    lr: float = 0.01
    momentum: float = 0.9
    margin: float = 0.9
    batch: int = 32
    flip: bool = True
    bn_mode: str = "frozen"  # or "train"
    trainable_blocks: int | None = None  # None: the whole backbone; k: only the last k blocks + head
    # False: the class embedding stays the enrolled template and only the backbone learns to map the
    # device's photos onto it (the anchor a template from a clean enrolment photo gives a fleet camera).
    train_embedding: bool = True
    # The positive loss on features and template both moved by minus this unit vector (a fixed mean face
    # feature), so that its margin measures what the model tells apart rather than the direction every
    # face feature of a strong model shares; None: the paper's loss on the raw features.
    feature_center: tuple[float, ...] | None = None
    # True: loss_before/loss_after are full passes over the faces (what a phone reports). False:
    # they are the mean batch loss of the first and of the last epoch, computed during training
    # anyway; a simulator of thousands of devices saves two forward passes per device.
    exact_losses: bool = True
    # With public identities (train_local's `public`): CosFace's scale and margin against their templates.
    negative_scale: float = 64.0
    negative_margin: float = 0.35

    @classmethod
    def from_round(cls, local: Mapping[str, Any]) -> LocalTrainingConfig:
        """The `local` settings a round's check-in carries (server_api.schemas.LocalTrainingConfig,
        whose `batch_size` is `batch` here); what the server leaves out keeps this class's default."""
        names = {"epochs": "epochs", "steps": "steps", "lr": "lr", "margin": "margin", "batch_size": "batch",
                 "trainable_blocks": "trainable_blocks", "train_embedding": "train_embedding", "feature_center": "feature_center"}
        settings = {names[key]: value for key, value in local.items() if key in names}
        if settings.get("feature_center") is not None:
            settings["feature_center"] = tuple(settings["feature_center"])
        return cls(**settings)

    def __post_init__(self) -> None:
        problems = [
            m for m, bad in (
                ("epochs must be >= 1", self.epochs < 1), ("steps must be >= 1", self.steps is not None and self.steps < 1),
                ("lr must be > 0", not self.lr > 0), ("momentum must be in [0, 1)", not 0 <= self.momentum < 1),
                ("margin must be in (-1, 1]", not -1 < self.margin <= 1), ("batch must be >= 1", self.batch < 1),
                ("bn_mode must be frozen or train", self.bn_mode not in ("frozen", "train")),
                ("trainable_blocks must be >= 0", self.trainable_blocks is not None and self.trainable_blocks < 0),
                ("a frozen prefix needs bn_mode frozen", self.trainable_blocks is not None and self.bn_mode != "frozen"),
                ("negative_scale must be > 0", not self.negative_scale > 0),
                ("negative_margin must be in [0, 1]", not 0 <= self.negative_margin <= 1),
                ("feature_center must be a unit vector",
                 self.feature_center is not None and not is_unit_vector(self.feature_center)),
            ) if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class LocalUpdate:
    # The trained entries of the backbone's state_dict: all of them, or with trainable_blocks only the
    # suffix's (trainable_keys); the frozen rest is the round's base, unchanged. The floating ones are
    # `packed` in one flat buffer in `layout`'s order, the others (BatchNorm's step counts) are `rest`,
    # and `state_dict` views both in the model's `order`.
    packed: Tensor
    layout: Layout
    rest: dict[str, Tensor]
    order: tuple[str, ...]
    embedding: Tensor  # (D,) the trained class embedding, L2-normalised
    n_samples: int
    loss_before: float
    loss_after: float
    steps: int
    seconds: float

    @cached_property
    def state_dict(self) -> dict[str, Tensor]:
        """Every trained entry by name, the floating ones as views of `packed`. Made on first use: a
        simulator reads `packed` only, and one view per entry costs it more than the whole buffer's delta."""
        parts = torch.split(self.packed, list(self.layout.sizes))
        floating = {k: part.view(shape) for k, part, shape in zip(self.layout.keys, parts, self.layout.shapes, strict=True)}
        return {k: floating[k] if k in floating else self.rest[k] for k in self.order}

    def delta(self, base: Mapping[str, Tensor], packed_base: Tensor, precision: Precision) -> PackedArrays:
        """This update minus `base` (the model the device trained from) at the wire's precision, packed like
        `packed`; `packed_base` is `base` packed in the same layout (`packed_entries`), once for many updates."""
        return PackedArrays(self.layout, packed_delta(self.packed, packed_base, precision), wire_arrays(delta(self.rest, base), precision))


def packed_entries(entries: Mapping[str, Tensor], layout: Layout) -> Tensor:
    """`layout`'s entries of a state_dict in one flat buffer, as LocalUpdate.packed holds its own."""
    with torch.no_grad():
        return torch.cat([entries[k].reshape(-1) for k in layout.keys]) if layout.keys else torch.empty(0)


def split_backbone(model: nn.Module, trainable_blocks: int | None) -> tuple[nn.Module, nn.Module]:
    """(frozen prefix, trainable suffix) with suffix(prefix(x)) == model(x); the whole model is
    the suffix when `trainable_blocks` is None."""
    if trainable_blocks is None:
        return nn.Identity(), model
    blocks = list(_part(model, "blocks").children())
    cut = len(blocks) - min(trainable_blocks, len(blocks))
    return nn.Sequential(_part(model, "stem"), *blocks[:cut]), nn.Sequential(*blocks[cut:], _part(model, "head"))


def _part(model: nn.Module, name: str) -> nn.Module:
    """The backbone contract's `stem`, `blocks` (a Sequential) or `head` (facecore.models.registry)."""
    part = getattr(model, name)
    if not isinstance(part, nn.Module):
        raise TypeError(f"{type(model).__name__} has no {name} module: not a FedFace backbone")
    return part


def trainable_keys(model: nn.Module, trainable_blocks: int | None, names: list[str] | None = None) -> list[str]:
    """The state_dict entries local training can change, in the model's order: every entry, or
    the trainable suffix's (the last blocks and the head, as split_backbone cuts them), by
    `facecore.federation.wire.trained_entries`, which the server reads updates with. Updates
    carry only these, so a frozen-prefix round moves 30% of mobilefacenet instead of all of it
    (59 of 333 tensors at 2 blocks). `names`: the model's state_dict keys when already at hand
    (listing them walks every module, which costs more than a small suffix's training step)."""
    names = list(model.state_dict(keep_vars=True)) if names is None else names
    if trainable_blocks is not None:
        _part(model, "blocks")  # a model without the backbone contract is refused here, not trained whole
    return trained_entries(names, trainable_blocks)


@dataclass(frozen=True)
class PrefixCache:
    """Frozen-prefix activations of a device's faces and of their mirror images.

    The prefix never trains anywhere, so these stay valid across rounds: a device pays the
    prefix forward pass once instead of every step."""

    plain: Tensor
    flipped: Tensor
    trainable_blocks: int


@torch.no_grad()
def prefix_cache(backbone: nn.Module, faces: np.ndarray, trainable_blocks: int, dtype: torch.dtype = torch.float32, batch: int = 64) -> PrefixCache:
    prefix, _ = split_backbone(backbone, trainable_blocks)
    if prefix.training or any(p.dtype != dtype for p in prefix.parameters()):
        # Only then is a copy needed, to leave the caller's model in its own mode and dtype; a
        # simulator calls this once per device on an eval-mode model, where the copy was most of the cost.
        prefix = copy.deepcopy(prefix).to(dtype=dtype).eval()
    # Batch by batch into buffers made once, in the activations' own memory format: beside the cache, memory holds
    # one batch's inputs and activations, not every photo's inputs and a second copy of the outputs to join.
    if len(faces) == 0:
        raise ValueError("no faces to cache")
    plain = flipped = torch.empty(0)
    for start in range(0, len(faces), batch):
        inputs = faces_to_tensor(faces[start : start + batch]).to(dtype)
        ahead, mirrored = prefix(inputs), prefix(inputs.flip(3))
        if start == 0:
            plain, flipped = _rows_like(ahead, len(faces)), _rows_like(mirrored, len(faces))
        plain[start : start + len(inputs)] = ahead
        flipped[start : start + len(inputs)] = mirrored
    return PrefixCache(plain, flipped, trainable_blocks)


def _rows_like(batch: Tensor, rows: int) -> Tensor:
    """An empty tensor of `rows` items shaped, typed and laid out (channels_last or not) like `batch`'s."""
    channels_last = batch.dim() == 4 and not batch.is_contiguous() and batch.is_contiguous(memory_format=torch.channels_last)
    return torch.empty((rows, *batch.shape[1:]), dtype=batch.dtype, memory_format=torch.channels_last if channels_last else torch.contiguous_format)


# Per trained module, its submodules and batch norms: a simulator trains one module for thousands of devices,
# and walking the tree for each costs more than a small suffix's step. Modules do not change shape while they train.
_MODULES: weakref.WeakKeyDictionary[nn.Module, tuple[list[nn.Module], list[bool]]] = weakref.WeakKeyDictionary()


def _set_mode(model: nn.Module, bn_mode: str) -> None:
    """model.train(), with its batch norms in eval mode when `bn_mode` is "frozen". Only the modules
    not yet in their mode are set: a module's attribute write costs more than reading the flag, and a
    simulator's workspace keeps its modes from one device to the next."""
    if model not in _MODULES:
        modules = list(model.modules())
        _MODULES[model] = (modules, [isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules])
    modules, is_norm = _MODULES[model]
    frozen = bn_mode == "frozen"
    for module, norm in zip(modules, is_norm, strict=True):
        training = not (frozen and norm)
        if module.training is not training:
            module.training = training


def centred_positive_loss(features: Tensor, embedding: Tensor, margin: float, center: Tensor | None) -> Tensor:
    """positive_loss, with features and template both moved by -center first (LocalTrainingConfig.feature_center)."""
    if center is None:
        return positive_loss(features, embedding, margin)
    moved = torch.nn.functional.normalize(torch.nn.functional.normalize(features, dim=1) - center, dim=1)
    return positive_loss(moved, torch.nn.functional.normalize(embedding - center, dim=-1), margin)


@torch.no_grad()
def _mean_loss(forward: nn.Module, embedding: Tensor, inputs: Tensor, margin: float, batch: int, center: Tensor | None) -> float:
    was_training = forward.training
    forward.eval()
    losses = [centred_positive_loss(forward(inputs[i : i + batch]), embedding, margin, center) * len(inputs[i : i + batch])
              for i in range(0, len(inputs), batch)]
    forward.train(was_training)
    return float(sum(losses) / len(inputs))


def _weighted_mean(losses: list[tuple[float, int]]) -> float:
    count = sum(n for _, n in losses)
    return sum(loss * n for loss, n in losses) / count if count else math.nan


@dataclass(frozen=True)
class Cohort:
    """Public impostor faces (prefix activations) and the hinge mean(max(0, cos - margin)^2) on them."""

    activations: Tensor
    margin: float = 0.2
    weight: float = 1.0


@dataclass(frozen=True)
class PublicIdentities:
    """Public people a device trains against: their templates (K, D) and, for rehearsal, some of
    their faces (inputs to the trainable part, e.g. prefix activations) with template indices, which
    each step keeps near their own templates (CosFace), so that the owner's faces cannot part from
    public people by moving as a group."""

    templates: Tensor
    faces: Tensor | None = None
    labels: Tensor | None = None


def fit_positive(
    forward: nn.Module, w: nn.Parameter, params: list[nn.Parameter], plain: Tensor, flipped: Tensor | None,
    config: LocalTrainingConfig, seed: int, after_step: Callable[[], None] | None = None, cohort: Cohort | None = None,
    public: PublicIdentities | None = None,
) -> tuple[float, float, int]:
    """SGD on `params` and `w` (`params` only when not config.train_embedding) for the positive-only
    loss of forward(inputs) against w.

    `flipped` holds the mirrored inputs (prefix activations) when mirroring cannot be done on
    `plain` itself. With a `cohort`, each step also pushes a batch of public impostor faces below
    the cohort margin; with `public` identities, each step adds CosFace of the batch against w and
    their templates (`public_negatives_loss`), and with their faces CosFace of a batch of those. The
    reported losses stay the positive loss. Returns (loss_before, loss_after, optimizer steps)."""
    optimizer = torch.optim.SGD([*params, *([w] if config.train_embedding else [])], lr=config.lr, momentum=config.momentum)
    generator = torch.Generator().manual_seed(seed)
    center = None if config.feature_center is None else torch.tensor(config.feature_center, dtype=w.dtype)
    loss_before = _mean_loss(forward, w.detach(), plain, config.margin, config.batch, center) if config.exact_losses else math.nan
    _set_mode(forward, config.bn_mode)
    steps = 0
    limit = config.steps or math.inf
    epoch_losses: list[list[tuple[float, int]]] = []
    for _ in range(config.epochs):
        epoch_losses.append([])
        order = torch.randperm(len(plain), generator=generator)
        for start in range(0, len(order), config.batch):
            if steps >= limit:
                break
            index = order[start : start + config.batch]
            batch = plain[index]
            if config.flip:
                mirror = (torch.rand(len(index), generator=generator) < 0.5)[:, None, None, None]
                batch = torch.where(mirror, batch.flip(3) if flipped is None else flipped[index], batch)
            features = forward(batch)
            loss = centred_positive_loss(features, w, config.margin, center)
            if public is not None:
                loss = loss + public_negatives_loss(features, w, public.templates, config.negative_scale, config.negative_margin)
                if public.faces is not None and public.labels is not None:
                    picked = torch.randint(len(public.faces), (config.batch,), generator=generator)
                    loss = loss + cosface_loss(forward(public.faces[picked]), public.labels[picked], public.templates,
                                               config.negative_scale, config.negative_margin)
            if cohort is not None:
                picked = torch.randint(len(cohort.activations), (config.batch,), generator=generator)
                loss = loss + cohort.weight * impostor_loss(forward(cohort.activations[picked]), w, cohort.margin)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if after_step is not None:
                after_step()
            epoch_losses[-1].append((float(loss.detach()), len(index)))
            steps += 1
    if config.exact_losses:
        return loss_before, _mean_loss(forward, w.detach(), plain, config.margin, config.batch, center), steps
    return _weighted_mean(epoch_losses[0]), _weighted_mean([x for e in epoch_losses[-1:] for x in e]), steps


class Workspace:
    """A model that devices train in one after another, with what walking its modules yields
    worked out once instead of per device (for a small frozen-prefix suffix, those walks cost
    more than its training step): its live state_dict entries, and per prefix cut the trainable
    keys, the suffix and its parameters. It also keeps the live entries of the backbone it
    copies from; that backbone must change in place between devices (``load_state_dict`` or
    ``copy_``, as the simulator does), not get new tensor objects.

    A cut's floating trainable entries live in one flat buffer (``packing``), so that loading a
    device's starting weights and packing its update are one copy each instead of one per entry.
    One cut's entries are packed at a time: packing another cut moves any entry they share into
    the new cut's buffer, and the old cut is packed again when next asked for."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.entries = model.state_dict(keep_vars=True)
        self._cuts: dict[int | None, tuple[list[str], nn.Module, list[nn.Parameter]]] = {}
        self._packings: dict[int | None, tuple[Layout, Tensor, list[str]]] = {}
        self._source: tuple[weakref.ref[nn.Module], dict[str, Tensor]] | None = None
        # per cut: the source entries and their version counters when packed, and the packed copy
        self._packed_sources: dict[int | None, tuple[dict[str, Tensor], tuple[int, ...], Tensor]] = {}

    def cut(self, trainable_blocks: int | None) -> tuple[list[str], nn.Module, list[nn.Parameter]]:
        """(trainable keys, trainable suffix, its parameters) for a prefix cut."""
        if trainable_blocks not in self._cuts:
            _, suffix = split_backbone(self.model, trainable_blocks)
            self._cuts[trainable_blocks] = (trainable_keys(self.model, trainable_blocks, list(self.entries)), suffix, list(suffix.parameters()))
        return self._cuts[trainable_blocks]

    @torch.no_grad()
    def packing(self, trainable_blocks: int | None) -> tuple[Layout, Tensor, list[str]]:
        """For a prefix cut: the layout of its floating trainable entries (LocalUpdate.packed), the flat
        buffer those live entries are views of, and the other trainable keys."""
        if trainable_blocks not in self._packings:
            keys = self.cut(trainable_blocks)[0]
            floating = [k for k in keys if self.entries[k].is_floating_point()]
            dtypes = {self.entries[k].dtype for k in floating}
            if len(dtypes) > 1:
                raise TypeError(f"a workspace trains in one floating dtype, got {sorted(map(str, dtypes))}")
            layout = Layout.of({k: tuple(self.entries[k].shape) for k in floating})
            flat = packed_entries(self.entries, layout)
            for key, part, shape in zip(floating, torch.split(flat, list(layout.sizes)), layout.shapes, strict=True):
                self.entries[key].data = part.view(shape)
            moved = set(floating)
            for other in [c for c, (other_layout, _, _) in self._packings.items() if moved.intersection(other_layout.keys)]:
                del self._packings[other]
            self._packings[trainable_blocks] = (layout, flat, [k for k in keys if k not in moved])
        return self._packings[trainable_blocks]

    def source_entries(self, backbone: nn.Module) -> dict[str, Tensor]:
        if self._source is None or self._source[0]() is not backbone:
            self._source = (weakref.ref(backbone), backbone.state_dict(keep_vars=True))
        return self._source[1]

    @torch.no_grad()
    def load(self, backbone: nn.Module) -> None:
        """Copy all of `backbone`'s weights in."""
        source = self.source_entries(backbone)
        torch._foreach_copy_(list(self.entries.values()), [source[k] for k in self.entries])

    def packed_source(self, backbone: nn.Module, trainable_blocks: int | None) -> Tensor:
        """`backbone`'s entries in the cut's packed layout (`packed_entries`), kept until one of them changes in
        place (its version counter moves): a device's start, and the base its update's delta is taken from."""
        layout = self.packing(trainable_blocks)[0]
        source = self.source_entries(backbone)
        versions = tuple(source[k]._version for k in layout.keys)
        known = self._packed_sources.get(trainable_blocks)
        if known is None or known[0] is not source or known[1] != versions:
            known = (source, versions, packed_entries(source, layout))
            self._packed_sources[trainable_blocks] = known
        return known[2]

    @torch.no_grad()
    def load_trained(self, backbone: nn.Module, trainable_blocks: int | None) -> None:
        """Copy in only what a cut trains: its packed entries in one copy (from `packed_source`), then its counters."""
        _, flat, rest_keys = self.packing(trainable_blocks)
        flat.copy_(self.packed_source(backbone, trainable_blocks))
        source = self.source_entries(backbone)
        torch._foreach_copy_([self.entries[k] for k in rest_keys], [source[k] for k in rest_keys])


def train_local(
    backbone: nn.Module, embedding: np.ndarray | Tensor, faces: np.ndarray, config: LocalTrainingConfig, seed: int = 0,
    dtype: torch.dtype = torch.float32, cache: PrefixCache | None = None, workspace: Workspace | None = None,
    public: PublicIdentities | None = None, template_length: float = 1.0,
) -> LocalUpdate:
    """One round of local training on the owner's aligned faces. `backbone` is not modified.

    `template_length`: the length of the enrolment photos' mean unit feature (facecore.templates.
    mean_feature_length). With a `feature_center` the loss's target is the template at that length less
    the centre, which points where the owner's centred features do on average. The unit template less
    the centre leans towards the centre instead, and training towards it pulls every face towards the
    centre and towards each other. The update's embedding is unit length either way.

    With `config.trainable_blocks`, only the last blocks and the head train; their input comes
    from `cache` (computed here when not given) instead of running the frozen prefix each step.
    `workspace`: a Workspace over a model of the same architecture and dtype to train in,
    overwritten with `backbone`'s weights; reusing one across devices saves a deep copy and the
    module walks per device. `public`: public identities sent with the round; each face is also
    trained against them (fit_positive)."""
    if len(faces) == 0:
        raise FaceCoreError("local training needs at least one aligned face")
    started = time.perf_counter()
    cached = cache is not None and cache.trainable_blocks == config.trainable_blocks
    if workspace is None:
        workspace = Workspace(copy.deepcopy(backbone).to(dtype=dtype))
    else:
        # the prefix never runs with cached activations: then load only what trains
        workspace.load_trained(backbone, config.trainable_blocks) if cached else workspace.load(backbone)
    keys, suffix, suffix_parameters = workspace.cut(config.trainable_blocks)
    for p in suffix_parameters:
        p.requires_grad_(True)
    if config.trainable_blocks is None:
        plain = faces_to_tensor(faces).to(dtype)
        flipped = None
    else:
        if not cached:
            cache = prefix_cache(workspace.model, faces, config.trainable_blocks, dtype)
        assert cache is not None
        plain, flipped = cache.plain.to(dtype), cache.flipped.to(dtype)
    if not 0 < template_length <= 1:
        raise ValueError(f"template_length must be in (0, 1], got {template_length}")
    scale = template_length if config.feature_center is not None else 1.0
    w = nn.Parameter(torch.tensor(np.asarray(embedding) * scale, dtype=dtype))  # a copy (Ray hands read-only arrays)
    loss_before, loss_after, steps = fit_positive(suffix, w, suffix_parameters, plain, flipped, config, seed, public=public)
    layout, flat, rest_keys = workspace.packing(config.trainable_blocks)
    with torch.no_grad():  # a copy: the workspace trains on
        packed = flat.clone() if len(flat) else torch.empty(0, dtype=dtype)
    # One reduction for every entry: a sum is finite exactly when each value is (short of overflowing
    # float32, which is divergence too; fp16 training sums in float32, where its values cannot). The rest are integers.
    if not (math.isfinite(loss_after) and math.isfinite(packed.sum(dtype=torch.float32).item())):
        raise TrainingDiverged(f"local training diverged (loss {loss_after}); lower the learning rate")
    rest = {k: workspace.entries[k].detach().clone() for k in rest_keys}
    return LocalUpdate(packed, layout, rest, tuple(keys), torch.nn.functional.normalize(w.detach(), dim=0), len(faces), loss_before,
                       loss_after, steps, time.perf_counter() - started)
