"""Blob storage and the tensor wire format."""
