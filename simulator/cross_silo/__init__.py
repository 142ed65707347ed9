"""Cross-silo federated face recognition (Bai et al. 2021): PFM and FV over a few organisations.

- :mod:`.config`: the validated run configuration.
- :mod:`.silos`: which identities each trainer and validator holds, and their faces.
- :mod:`.models`: backbones (the registry's, plus a tiny CPU smoke net) and the GPU path.
- :mod:`.trainer`: one trainer's K local steps (PFM or FedAvg) and the centralized baseline.
- :mod:`.validator`: private pair scoring for FV, and LFW folds 6-10 for reporting.
- :mod:`.engine`: the in-process server loop with synchronous or threaded FV.
- :mod:`.distributed`: one process per server, trainer and validator over torch.distributed.
- :mod:`.experiment`: the CPU smoke experiment behind simulator/CROSS_SILO.md.

The server halves of the algorithms live in ``facecore.federation.strategies.pfm`` / ``.fedval``.
"""
