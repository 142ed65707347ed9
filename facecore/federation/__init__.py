"""The federation's shared rules: what the round server, the device SDK, the simulator and the benchmark
clients must agree on, kept in one place so no side carries a copy that can drift.

- :mod:`facecore.federation.config`: the typed round configuration (`RoundConfig`) and each device's training seed.
- :mod:`facecore.federation.strategies`: the aggregation strategies and the factory that builds a round's strategy.
- :mod:`facecore.federation.selection`: which candidates a round takes.
- :mod:`facecore.federation.wire`: the model as a device receives it and the update file's tensors at the wire's precision.
- :mod:`facecore.federation.template_noise`: the optional blur on the class embedding a device uploads.
- :mod:`facecore.federation.protocol`: request signing, header names, update-file keys, error codes.
- :mod:`facecore.federation.messages`: the bodies a device sends and reads (check-in, enrollment, upload metadata, secure aggregation, errors).
- :mod:`facecore.federation.status`: round and participation statuses.

Invariants: no HTTP and no database anywhere here; no torch outside `strategies` (whose FedFace step runs the
spreadout in torch), so a validation worker or a device that only verifies stays light. Nothing here sends,
stores or trains; each side brings its own transport and storage. Every string here is wire or database
format: changing one is a protocol change (protocol_test pins the signed message byte for byte).
"""
