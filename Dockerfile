# FedFace round server image: `docker compose up` (see docker-compose.yml).

# The default model's weights come from an npm package; npm stays in this stage only.
FROM node:20-slim AS weights
WORKDIR /weights
RUN npm pack @vladmandic/face-api@1.7.15

FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, from pyproject.toml alone, so a code edit does not reinstall torch. The CPU wheel index
# keeps the image at about 1 GB; PyPI's default torch wheel carries CUDA (several GB) the server never uses.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
 && pip install --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/requirements.txt \
 && pip install --no-deps facenet-pytorch==2.6.0

# The code: only this layer and the ones below are rebuilt when it changes.
COPY facecore facecore
COPY fedface fedface
COPY server_api server_api
COPY export export
COPY pretrain pretrain
COPY device_sdk device_sdk
COPY simulator simulator
COPY fedface_bench fedface_bench
RUN pip install --no-deps .

# Verified against the recorded sha256 and unpacked into the image, not the /data volume.
ENV FEDFACE_PACKAGES=/opt/fedface/packages
COPY --from=weights /weights/vladmandic-face-api-1.7.15.tgz /tmp/face-api.tgz
RUN fedface models fetch --tarball /tmp/face-api.tgz && rm /tmp/face-api.tgz

RUN useradd --system --create-home --uid 10001 fedface && mkdir /data && chown fedface /data
USER fedface
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=5 \
  CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status != 200)"

# Secrets (FEDFACE_ADMIN_TOKEN, FEDFACE_TEMPLATE_KEY) and FEDFACE_DATABASE_URL come from the environment.
CMD ["fedface", "server", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
