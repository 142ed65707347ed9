"""The pretraining loop: margin-softmax classification of public identities.

Resume is exact: each epoch's shuffling and augmentation draw from a generator seeded by
(seed, epoch), and model, optimizer, scheduler and RNG states are saved after every epoch,
so stopping after epoch k and resuming replays the same batches as a straight run.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from facecore.data.faces import LabelledFaces
from facecore.errors import CheckpointError, FaceCoreError
from facecore.losses import make_margin_head
from facecore.models.checkpoint import FORMAT, atomic_torch_save, save_backbone
from facecore.models.preprocess import normalize_nchw
from facecore.models.registry import embedding_dim_of, get_backbone
from pretrain.augment import AugmentedFaces
from pretrain.config import PretrainConfig

EvalFn = Callable[[torch.nn.Module], dict[str, float]]


@dataclass(frozen=True)
class PretrainResult:
    backbone_path: Path
    epochs: int
    seconds: float
    images_per_second: float
    history: list[dict[str, float]]


class OutOfMemory(FaceCoreError):
    pass


def lr_factor(config: PretrainConfig, step: int, steps_per_epoch: int) -> float:
    """Linear warm-up, then cosine to zero (or x0.1 steps at 60% and 85%)."""
    total = config.epochs * steps_per_epoch
    warmup = int(config.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    if config.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return 0.1 ** sum(progress >= p for p in (0.6, 0.85))


class Pretrainer:
    def __init__(
        self, config: PretrainConfig, data: LabelledFaces, out_dir: str | Path, evaluate: EvalFn | None = None,
        init_state: dict[str, torch.Tensor] | None = None, init_head: torch.Tensor | None = None,
    ) -> None:
        self.config = config
        self.data = data
        self.out = Path(out_dir)
        self.evaluate = evaluate
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.model = get_backbone(config.backbone, embedding_dim=config.embedding_dim)
        if init_state is not None:  # fine-tuning: start from a trained backbone, fresh classifier head
            self.model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in init_state.items()})
        self.model.to(self.device, memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented; Module.to's overloads omit it
        head_options = {k: v for k, v in (("s", config.scale), ("m", config.margin)) if v is not None}
        self.head = make_margin_head(config.loss, embedding_dim_of(self.model), len(data.classes), **head_options).to(self.device)
        if init_head is not None:  # (classes, dim), e.g. each class's mean feature: no random head to recover from
            if tuple(init_head.shape) != tuple(self.head.weight.shape):
                raise FaceCoreError(f"init_head has shape {tuple(init_head.shape)}, the head needs {tuple(self.head.weight.shape)}")
            with torch.no_grad():
                self.head.weight.copy_(init_head.to(self.head.weight))
        params = list(self.model.parameters()) + list(self.head.parameters())
        self.optimizer: torch.optim.Optimizer = (
            torch.optim.AdamW(params, lr=config.lr, betas=(config.momentum, 0.999), weight_decay=config.weight_decay)
            if config.optimizer == "adamw" else torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
        )
        self.steps_per_epoch = self._steps_per_epoch()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(config, s, self.steps_per_epoch))
        self.epoch = 0
        self.history: list[dict[str, float]] = []
        self._forward = torch.compile(self.model) if config.compile else self.model

    def _steps_per_epoch(self) -> int:
        steps = len(self.data) // self.config.batch
        if steps == 0:
            raise FaceCoreError(f"{len(self.data)} faces are fewer than one batch of {self.config.batch}: lower --batch")
        return min(steps, self.config.max_steps_per_epoch or steps)

    # ---- checkpoints -------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        atomic_torch_save(
            {
                "format": FORMAT,
                "backbone": self.model.name,
                "embedding_dim": self.model.embedding_dim,
                "state_dict": self.model.state_dict(),
                "meta": {"kind": "pretrain-checkpoint"},
                "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "epoch": self.epoch,
                "history": self.history,
                "config": self.config.to_dict(),
                "classes": list(self.data.classes),
                "rng_torch": torch.get_rng_state(),
                **self._extra_state(),
            },
            self.checkpoint_path,
        )

    def resume(self) -> None:
        if not self.checkpoint_path.is_file():
            raise CheckpointError(f"nothing to resume: {self.checkpoint_path} does not exist")
        state = torch.load(self.checkpoint_path, map_location=self.device, weights_only=True)
        saved = type(self.config)(**state.get("config", {})).resume_key() if "config" in state else {}
        mismatched = {k: (saved.get(k), v) for k, v in self.config.resume_key().items() if saved.get(k) != v}
        if mismatched or state.get("classes") != list(self.data.classes):
            detail = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in mismatched.items()) or "a different identity list"
            raise CheckpointError(f"cannot resume from {self.checkpoint_path}: {detail}")
        self.model.load_state_dict(state["state_dict"])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.history = state["epoch"], state["history"]
        torch.set_rng_state(state["rng_torch"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, object]:
        """More checkpoint entries a subclass needs for exact resume (none here)."""
        return {}

    def _load_extra_state(self, state: dict[str, object]) -> None:
        """Restore what `_extra_state` saved."""

    # ---- training ----------------------------------------------------------------------
    def _loader(self, epoch: int) -> DataLoader:  # type: ignore[type-arg]
        generator = torch.Generator().manual_seed(self.config.seed * 100_003 + epoch)
        return DataLoader(
            AugmentedFaces(self.data.faces, self.data.labels),
            batch_size=self.config.batch,
            shuffle=True,
            drop_last=True,
            generator=generator,
            num_workers=self.config.workers,
            persistent_workers=False,
        )

    def _batch_loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """The loss of one loader batch and its number of faces (subclasses train on other losses)."""
        faces, labels = batch
        faces, labels = normalize_nchw(faces.to(self.device)), labels.to(self.device)
        return self.head(self._forward(faces).float(), labels), len(labels)

    def _on_record(self, record: dict[str, float]) -> None:
        """Called with each epoch's record (after evaluation, before the checkpoint is saved)."""

    def train_epoch(self) -> dict[str, float]:
        self.model.train()
        self.head.train()
        losses, seen, started = [], 0, time.perf_counter()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else torch.autocast("cpu", enabled=False)
        bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {self.epoch + 1}/{self.config.epochs}", unit="step", leave=False)
        for step, batch in enumerate(self._loader(self.epoch)):
            if step >= self.steps_per_epoch:
                break
            try:
                with autocast:
                    loss, size = self._batch_loss(batch)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            except (torch.OutOfMemoryError, MemoryError) as error:
                raise OutOfMemory(f"out of memory at batch {self.config.batch}: lower --batch ({type(error).__name__})") from None
            if not torch.isfinite(loss):
                raise FaceCoreError(f"loss became {loss.item()} at epoch {self.epoch + 1} step {step}: lower --lr")
            self.optimizer.step()
            self.scheduler.step()
            losses.append(loss.item())
            seen += size
            rate = seen / (time.perf_counter() - started)
            bar.update()
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", img_s=f"{rate:.1f}", lr=f"{self.scheduler.get_last_lr()[0]:.4f}")
        bar.close()
        self.epoch += 1
        seconds = time.perf_counter() - started
        return {"epoch": self.epoch, "loss": float(np.mean(losses)), "seconds": seconds, "images_per_second": seen / seconds}

    def fit(self) -> PretrainResult:
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        while self.epoch < self.config.epochs:
            record = self.train_epoch()
            last = self.epoch == self.config.epochs
            if self.evaluate and (last or (self.config.eval_every and self.epoch % self.config.eval_every == 0)):
                record.update(self.evaluate(self.model))
                self.model.train()
            self.history.append(record)
            self._on_record(record)
            self.save_checkpoint()
            with open(self.out / "metrics.jsonl", "a") as log:
                log.write(json.dumps(record) + "\n")
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()), flush=True)
        seconds = time.perf_counter() - started
        path = save_backbone(self.model, self.out / "backbone.pt", meta={"config": self.config.to_dict(), "epochs": self.epoch})
        rates = [h["images_per_second"] for h in self.history]
        return PretrainResult(path, self.epoch, seconds, float(np.median(rates)) if rates else 0.0, self.history)
