"""FedFace cross-device round server (FastAPI over SQLAlchemy).

Entry points: :func:`server_api.main.create_app` (tests, embedding) and
``fedface server`` (uvicorn). Aggregation strategies in :mod:`server_api.strategies`
are pure and shared with the simulator; nothing else here is imported by it.
"""
