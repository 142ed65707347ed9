"""No Docker engine runs here, so the container files are checked by parsing them."""
import re
from pathlib import Path

import yaml

from facecore.models.published import FACE_API

ROOT = Path(__file__).resolve().parents[1]


def test_compose_runs_the_server_on_postgres_with_required_secrets_and_the_default_model() -> None:
    # Prepare / Execute
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    server, db = compose["services"]["server"], compose["services"]["db"]
    # Assert
    assert server["depends_on"]["db"]["condition"] == "service_healthy" and "healthcheck" in db
    env = server["environment"]
    assert env["FEDFACE_DATABASE_URL"].startswith("postgresql+psycopg://fedface:")
    for secret in ("FEDFACE_ADMIN_TOKEN", "FEDFACE_TEMPLATE_KEY"):
        assert re.fullmatch(r"\$\{" + secret + r":\?.+\}", env[secret]), f"{secret} must be required, never defaulted"
    assert env["FEDFACE_MODEL"] == "${FEDFACE_MODEL:-default}"
    assert set(compose["volumes"]) == {"pgdata", "blobs"}


def test_the_image_fetches_and_verifies_the_package_the_code_pins() -> None:
    # Prepare
    dockerfile = (ROOT / "Dockerfile").read_text()
    tarball = f"{FACE_API.name.strip('@').replace('/', '-')}-{FACE_API.version}.tgz"  # npm pack's file name
    # Execute
    packed = re.search(r"RUN npm pack (\S+)", dockerfile)
    copied = re.search(r"COPY --from=weights /weights/(\S+) (\S+)", dockerfile)
    fetched = re.search(r"RUN fedface models fetch --tarball (\S+)", dockerfile)
    # Assert: the same version as facecore.models.published, checked by its sha256 inside the image
    assert packed and packed.group(1) == FACE_API.spec
    assert copied and copied.group(1) == tarball
    assert fetched and fetched.group(1) == copied.group(2)
    assert "ENV FEDFACE_PACKAGES=" in dockerfile
