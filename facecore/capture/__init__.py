"""Simulated fleet cameras (capture models): see `facecore.capture.models`."""
from facecore.capture.models import CAPTURES, CaptureModel, UnknownCapture, get_capture

__all__ = ["CAPTURES", "CaptureModel", "UnknownCapture", "get_capture"]
