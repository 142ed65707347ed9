"""Benchmarks behind `fedface bench export|server|device|sim|secagg`: medians and ratios measured side by
side in one run. Speed and memory targets are judged here, never by timed unit tests.

Invariants:
- Benchmarks may import every product package; no product package (facecore, server_api, device_sdk,
  export, pretrain, simulator) imports them (`layering_test.py`).
- Local servers come from the one shared launcher, :mod:`server_api.launcher`.
- Importing this package imports nothing: `flower.py` runs in the separate Flower environment.
- Named `fedface_bench`, not `benchmarks`: opacus installs a top-level `benchmarks` package.
- A run's result goes to stdout alone; its progress to stderr (`progress.py`); each JSON result says for every
  goal its target, measured value and verdict (`goals.py`).
"""
