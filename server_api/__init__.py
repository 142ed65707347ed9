"""FedFace cross-device round server (FastAPI over SQLAlchemy).

Entry points: :func:`server_api.main.create_app` (tests, embedding) and
``fedface server`` (uvicorn). Aggregation strategies in :mod:`facecore.federation.strategies`
are pure and shared with the simulator; besides them, the simulator and the benchmarks import
only :mod:`server_api.launcher` (a local server process, also the tests') and :mod:`server_api.errors`.
"""
