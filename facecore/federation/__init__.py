"""The federation's shared vocabulary: what the round server, the device SDK and the benchmark clients
must agree on, kept in one place so no side carries a copy that can drift.

- :mod:`facecore.federation.protocol`: request signing, header names, update-file keys, error codes.
- :mod:`facecore.federation.status`: round and participation statuses.

Invariants: no HTTP, no database, no torch. Nothing here sends, stores or trains; each side brings its
own transport and storage. Every string here is wire or database format: changing one is a protocol
change (protocol_test pins the signed message byte for byte).
"""
