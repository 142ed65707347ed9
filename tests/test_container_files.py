"""No Docker engine runs here, so the container files are checked by parsing them: every path they
copy exists, every `fedface` command they run parses with the real CLI, every FEDFACE_* variable
they set is one the code reads, and dependencies install before the code is copied."""

import ipaddress
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from facecore.models.published import FACE_API
from facecore.paths import PACKAGES_ENV
from fedface.cli import build_parser
from server_api.core.config import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SETTINGS_VARIABLES = {f"FEDFACE_{name.upper()}" for name in Settings.model_fields}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1]) for line in lines]


def _fedface_commands() -> list[list[str]]:
    commands = [COMPOSE["services"]["server"]["command"]]
    for instruction, arguments in _instructions():
        if instruction == "CMD":
            commands.append(yaml.safe_load(arguments))
        elif instruction == "RUN":
            commands += [shlex.split(part) for part in arguments.split("&&") if part.strip().startswith("fedface ")]
    return commands


def test_compose_runs_the_server_on_postgres_with_required_secrets_and_the_default_model() -> None:
    # Prepare / Execute
    server, db = COMPOSE["services"]["server"], COMPOSE["services"]["db"]
    # Assert
    assert server["depends_on"]["db"]["condition"] == "service_healthy" and "healthcheck" in db
    env = server["environment"]
    assert env["FEDFACE_DATABASE_URL"].startswith("postgresql+psycopg://fedface:")
    for secret in ("FEDFACE_ADMIN_TOKEN", "FEDFACE_TEMPLATE_KEY"):
        assert re.fullmatch(r"\$\{" + secret + r":\?.+\}", env[secret]), f"{secret} must be required, never defaulted"
    assert env["FEDFACE_MODEL"] == "${FEDFACE_MODEL:-default}"
    assert set(COMPOSE["volumes"]) == {"pgdata"}


def test_compose_runs_two_replicas_behind_one_proxy_sharing_the_database_and_its_blobs() -> None:
    # Prepare
    server, proxy = COMPOSE["services"]["server"], COMPOSE["services"]["proxy"]
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    # Execute
    args = build_parser().parse_args(server["command"][1:])
    proxy_ip = proxy["networks"]["fedface"]["ipv4_address"]
    subnet = COMPOSE["networks"]["fedface"]["ipam"]["config"][0]["subnet"]
    # Assert: replicas share blobs through the database and publish no port of their own; the proxy is the address
    assert server["deploy"]["replicas"] == 2 and "ports" not in server and "volumes" not in server
    assert args.blob_store == "database" and args.db is None and server["environment"]["FEDFACE_DATABASE_URL"].startswith("postgresql")
    # ... and sum a round's shards together, a setting the server accepts with those blobs
    assert server["environment"]["FEDFACE_AGGREGATION_SHARED_SHARDS"] == "true"
    Settings(aggregation_shared_shards=server["environment"]["FEDFACE_AGGREGATION_SHARED_SHARDS"], blob_store=args.blob_store).check_aggregation()
    assert proxy["ports"] == ["127.0.0.1:8000:8080"] and proxy["depends_on"]["server"]["condition"] == "service_healthy"
    assert proxy["volumes"] == ["./deploy/nginx.conf:/etc/nginx/nginx.conf:ro"]
    # Only the proxy may name a device's address, and it replaces any X-Forwarded-For a device sent.
    assert args.forwarded_allow_ips == proxy_ip and ipaddress.ip_address(proxy_ip) in ipaddress.ip_network(subnet)
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in nginx and "$proxy_add_x_forwarded_for" not in nginx
    assert re.search(r"server server:(\d+) resolve;", nginx).group(1) == str(args.port)
    assert re.search(r"listen (\d+);", nginx).group(1) == proxy["ports"][0].rsplit(":", 1)[1]
    assert "proxy_request_buffering off;" in nginx and "client_max_body_size 0;" in nginx


def test_the_image_fetches_and_verifies_the_package_the_code_pins() -> None:
    # Prepare
    tarball = f"{FACE_API.name.strip('@').replace('/', '-')}-{FACE_API.version}.tgz"  # npm pack's file name
    # Execute
    packed = re.search(r"RUN npm pack (\S+)", DOCKERFILE)
    copied = re.search(r"COPY --from=weights /weights/(\S+) (\S+)", DOCKERFILE)
    fetched = re.search(r"RUN fedface models fetch --tarball (\S+)", DOCKERFILE)
    # Assert: the same version as facecore.models.published, checked by its sha256 inside the image
    assert packed and packed.group(1) == FACE_API.spec
    assert copied and copied.group(1) == tarball
    assert fetched and fetched.group(1) == copied.group(2)
    assert f"ENV {PACKAGES_ENV}=" in DOCKERFILE


def test_every_copied_path_exists_and_dependencies_install_before_the_code() -> None:
    # Prepare
    steps = _instructions()
    copies = [(i, arguments.split()) for i, (instruction, arguments) in enumerate(steps) if instruction == "COPY"]
    local = [(i, words[:-1]) for i, words in copies if not words[0].startswith("--from=")]
    install = next(
        i
        for i, (instruction, arguments) in enumerate(steps)
        if instruction == "RUN" and "requirements.txt" in arguments
    )
    # Execute
    missing = [source for _, sources in local for source in sources if not (ROOT / source).exists()]
    before_install = {source for i, sources in local if i < install for source in sources}
    # Assert: a code edit leaves the dependency layer cached; everything the package needs is copied after it
    assert missing == []
    assert before_install == {"pyproject.toml", "README.md"}
    packages = {source for i, sources in local if i > install for source in sources}
    with (ROOT / "pyproject.toml").open("rb") as handle:
        included = tomllib.load(handle)["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (pattern.rstrip("*") for pattern in included):  # every package `pip install .` would ship
        assert package in packages and (ROOT / package / "__init__.py").is_file(), package
    assert re.search(r"RUN pip install --no-deps \.$", DOCKERFILE, re.MULTILINE)


def test_every_fedface_command_parses_and_every_variable_is_read_by_the_code() -> None:
    # Prepare
    commands = _fedface_commands()
    compose_env = set(COMPOSE["services"]["server"]["environment"])
    image_env = set(re.findall(r"\b(FEDFACE_[A-Z_]+)=", DOCKERFILE))
    # Execute: the real parser, as `fedface` in the image would run them
    parsed = [build_parser().parse_args(command[1:]) for command in commands]
    # Assert
    assert len(commands) == 3 and all(command[0] == "fedface" for command in commands)
    assert sorted(args.command for args in parsed) == ["models", "server", "server"]
    assert compose_env - SETTINGS_VARIABLES == set() and image_env - SETTINGS_VARIABLES == {PACKAGES_ENV}
    data_dirs = {args.data_dir for args in parsed if args.command == "server"}
    assert data_dirs == {"/data"} and 'VOLUME ["/data"]' in DOCKERFILE
    ports = {args.port for args in parsed if args.command == "server"}
    assert ports == {8000} and "EXPOSE 8000" in DOCKERFILE
    assert "http://127.0.0.1:8000/readyz" in DOCKERFILE


def test_the_build_context_leaves_out_environments_caches_and_local_data() -> None:
    # Prepare
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    # Assert
    assert {
        ".git",
        ".venv",
        ".venv-flower",
        ".cache",
        ".pytest_cache",
        "**/__pycache__",
        "reports",
        "runs",
        "fedface-data",
    } <= ignored
    copied = {
        word for instruction, arguments in _instructions() if instruction == "COPY" for word in arguments.split()[:-1]
    }
    assert not copied & ignored
