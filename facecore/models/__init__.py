"""Face-embedding backbones, built by name through the registry.

Importing this package imports every architecture module so its factories are
registered before the first :func:`get_backbone` call.
"""
from facecore.models.registry import backbone_names, get_backbone, register_backbone

# Imported for their registration side effect; keep after the registry import.
from facecore.models import dlib_resnet, iresnet, mobilefacenet  # noqa: E402,F401  isort: skip

__all__ = ["backbone_names", "get_backbone", "register_backbone"]
