"""Face-embedding backbones, built by name through the registry.

Invariant: importing this package (or a torch-free module in it: `cards`, `published`) loads no torch. The
registry imports every architecture module, so its factories are registered, the first time it is asked for a
name (`backbone_names`, `get_backbone`); `backbone_names`, `get_backbone` and `register_backbone` are
re-exported here from the registry, imported when first used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from facecore.models.registry import backbone_names, get_backbone, register_backbone

__all__ = ["backbone_names", "get_backbone", "register_backbone"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from facecore.models import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
