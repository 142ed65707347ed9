"""FedFusion (Yao et al., ICIP 2019): fuse the previous global model's features with the local model's.

Local training is this package's own small CNN loop (the device SDK trains face backbones, not
classifiers); server-side averaging is `facecore.federation.strategies.FedAvg`, the live server's code.
"""
