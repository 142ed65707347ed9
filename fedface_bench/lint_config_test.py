"""The lint gate is wired up: pyproject.toml declares the import-linter contracts (the layers of
`layering_test.py`, crud below services, the HTTP layer on top, no SDK in the server), pins the tools in the extra that
`make venv` installs, and the Makefile's `test` target runs `lint` (ruff, mypy, lint-imports) first."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
MAKEFILE = (REPO / "Makefile").read_text()


def _contract(contract_id: str) -> dict[str, Any]:
    contracts = {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}
    return contracts[contract_id]


def _rule(target: str) -> tuple[list[str], list[str]]:
    """(prerequisites, recipe lines) of a Makefile target."""
    match = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)*)", MAKEFILE, re.MULTILINE)
    assert match, f"the Makefile has no {target} target"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_the_layers_contract_orders_every_product_package() -> None:
    # Prepare
    packages = {pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    # Execute
    layers = _contract("layers")
    layered = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    # Assert: the CLI on top, facecore at the bottom, the benchmarks only under the CLI
    assert layers["type"] == "layers" and layers["exhaustive"] is False
    assert layers["layers"][0] == "fedface" and layers["layers"][1] == "fedface_bench" and layers["layers"][-1] == "facecore"
    assert layered == packages == set(PYPROJECT["tool"]["importlinter"]["root_packages"])


def test_the_server_contracts_keep_crud_below_services_the_http_layer_on_top_and_the_sdk_out() -> None:
    # Execute
    crud, api, sdk = _contract("crud-below-services"), _contract("api-on-top"), _contract("server-without-sdk")
    # Assert
    assert (sdk["source_modules"], sdk["forbidden_modules"]) == (["server_api"], ["device_sdk"])
    assert crud["type"] == "forbidden" and crud["source_modules"] == ["server_api.crud"]
    assert crud["forbidden_modules"] == ["server_api.services"] and "ignore_imports" not in crud
    assert api["type"] == "forbidden" and api["forbidden_modules"] == ["server_api.api"]
    assert set(api["source_modules"]) == {"server_api.crud", "server_api.services", "server_api.core"}


def test_make_test_lints_first_with_the_pinned_tools() -> None:
    # Prepare
    pinned = {spec.split("==")[0]: spec for spec in PYPROJECT["project"]["optional-dependencies"]["test"] if "==" in spec}
    # Execute
    test_prerequisites, _ = _rule("test")
    lint_prerequisites, lint_recipe = _rule("lint")
    # Assert: lint runs before the weights and the suite; `make venv` installs '.[test]', tools included
    assert test_prerequisites.index("lint") < test_prerequisites.index("weights")
    assert lint_prerequisites == ["$(STAMP)"]
    assert lint_recipe == ["$(BIN)/ruff check .", "$(BIN)/mypy", "$(BIN)/lint-imports"]
    assert {"ruff", "mypy", "import-linter"} <= set(pinned)
    assert "-e '.[test]'" in MAKEFILE
