"""facecore: the small shared core of FedFace.

Backbones, losses, face detection and alignment, data readers, identity splits and
verification evaluation. Everything here is pure library code: no HTTP, no database.
"""

__version__ = "0.1.0"
