"""Name -> backbone factory registry.

Architecture modules register factories with :func:`register_backbone`; callers
build models by name with :func:`get_backbone`, so configs, checkpoints and the
CLI only ever carry a string. Each factory owns its default embedding size, which
is why ``embedding_dim=None`` means "the backbone's default" here. The built-in
architecture modules are imported, and so registered, at the first lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any, TypeVar, cast

import torch
from torch import nn

from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.errors import UnknownBackbone

BackboneFactory = Callable[..., nn.Module]
F = TypeVar("F", bound=BackboneFactory)

_REGISTRY: dict[str, BackboneFactory] = {}

# Attributes every backbone must carry so downstream code (alignment size, head
# construction, checkpoint metadata) never has to special-case an architecture.
_REQUIRED_ATTRIBUTES = ("name", "embedding_dim", "input_size")


def register_backbone(name: str) -> Callable[[F], F]:
    """Decorator registering ``factory(embedding_dim=<default>, **kwargs)`` under ``name``."""

    def decorate(factory: F) -> F:
        # A silent overwrite would make the model depend on import order.
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"backbone {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _register_architectures() -> None:
    # Each architecture module registers its factories on import. Imported at the first lookup, not with the
    # package, so that importing facecore.models stays free of torch (facecore/models/__init__.py).
    from facecore.models import dlib_cut, dlib_resnet, iresnet, mobilefacenet  # noqa: F401


def backbone_names() -> list[str]:
    """Sorted names accepted by :func:`get_backbone`."""
    _register_architectures()
    return sorted(_REGISTRY)


def get_backbone(name: str, embedding_dim: int | None = None, **kwargs: Any) -> nn.Module:
    """Build the backbone registered as ``name``.

    Args:
        name: a value of :func:`backbone_names`.
        embedding_dim: output size; ``None`` keeps the backbone's default.
        **kwargs: architecture options (e.g. ``width`` for MobileFaceNet).

    Raises:
        UnknownBackbone: ``name`` is not registered; the message lists valid names.
    """
    _register_architectures()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UnknownBackbone(name, backbone_names())
    if embedding_dim is not None:
        kwargs["embedding_dim"] = embedding_dim
    model = factory(**kwargs)
    missing = [attr for attr in _REQUIRED_ATTRIBUTES if not hasattr(model, attr)]
    if missing:
        raise TypeError(f"backbone factory {name!r} returned a module without {', '.join(missing)}")
    return model


def embedding_dim_of(model: nn.Module) -> int:
    """A backbone's ``embedding_dim`` (every registered backbone carries one), typed: torch types a
    module's undeclared attributes as ``Tensor | Module``."""
    return cast(int, model.embedding_dim)


@cache
def backbone_geometry(name: str) -> FaceGeometry:
    """The crop geometry of a registered backbone, without keeping a model around."""
    return geometry_of(get_backbone(name))


@lru_cache(maxsize=16)
def expected_state(name: str, embedding_dim: int | None = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{state_dict key: (shape, dtype)} of a freshly built ``name`` backbone, built on torch's meta
    device: no weights are allocated, so a file's tensors can be checked against it before a model is
    built for them (whatever ``embedding_dim`` the file claims)."""
    with torch.device("meta"):
        model = get_backbone(name, embedding_dim=embedding_dim)
    return {key: (tuple(value.shape), value.dtype) for key, value in model.state_dict().items()}
