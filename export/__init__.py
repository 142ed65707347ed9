"""Compact on-device backbones: ONNX export, int8 quantization, parity checks and latency."""
