"""Cross-device FedFace: one identity per device, many devices, rounds of local training + aggregation."""
