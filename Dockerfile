# FedFace round server image: `docker compose up` (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, so code edits do not reinstall torch. The CPU wheel index keeps the
# image at about 1 GB; PyPI's default torch wheel carries CUDA (several GB) the server never uses.
COPY pyproject.toml README.md ./
COPY facecore facecore
COPY fedface fedface
COPY server_api server_api
COPY export export
COPY pretrain pretrain
COPY device_sdk device_sdk
COPY simulator simulator
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu . \
 && pip install --no-deps facenet-pytorch==2.6.0

RUN useradd --system --create-home --uid 10001 fedface && mkdir /data && chown fedface /data
USER fedface
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=5 \
  CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status != 200)"

# Secrets (FEDFACE_ADMIN_TOKEN, FEDFACE_TEMPLATE_KEY) and FEDFACE_DATABASE_URL come from the environment.
CMD ["fedface", "server", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
