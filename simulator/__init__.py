"""Simulations: many FedFace devices in one process (or over real HTTP), the cross-silo mode, FedFusion.

The simulator owns no training or aggregation code: devices run `device_sdk.training.train_local`
and the server side runs `facecore.federation.strategies`, exactly what the live system runs.
"""
