"""Benchmarks sit above the product: no product package imports them, and the server never imports the
simulator or the benchmarks (imports found by parsing every module, lazy ones inside functions included).
The shared core sits below everything: facecore's code imports no package above it, and its federation
rules (facecore/federation) no transport or database, and torch only in the strategies. The package's name is ours alone:
opacus, a dependency, installs a top-level `benchmarks` package."""
from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT_PACKAGES = ("facecore", "server_api", "device_sdk", "export", "pretrain", "simulator")


def imported_modules(source: str) -> set[str]:
    """Every absolute module name an `import` or `from ... import` statement anywhere in `source` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def importers_of(top_level: str, packages: tuple[str, ...], tests: bool = True) -> list[str]:
    """`path: module` for each import of `top_level` (or a module inside it) from the given packages' files
    (their `*_test.py` files too unless `tests` is False)."""
    found = []
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            if not tests and path.name.endswith("_test.py"):
                continue
            for name in imported_modules(path.read_text()):
                if name == top_level or name.startswith(top_level + "."):
                    found.append(f"{path.relative_to(REPO)}: {name}")
    return found


def test_the_scanner_finds_lazy_and_from_imports_and_ignores_look_alikes() -> None:
    # Prepare
    source = (
        "import os\nfrom fedface_bench.server import bench_round\n"
        "def f():\n    import fedface_bench.sim as sim\n    from . import local\n"
        "import fedface_bench_extra\nfrom fedface_benchx import y\nimport benchmarks\n"
    )
    # Execute
    names = imported_modules(source)
    # Assert
    ours = {n for n in names if n == "fedface_bench" or n.startswith("fedface_bench.")}
    assert ours == {"fedface_bench.server", "fedface_bench.sim"}


def test_no_installed_distribution_but_fedface_ships_a_package_of_this_name() -> None:
    # Execute
    owners = {
        dist.metadata["Name"] for dist in metadata.distributions()
        if "fedface_bench" in (dist.read_text("top_level.txt") or "").split()
        or any(str(file).startswith("fedface_bench/") for file in dist.files or ())
    }
    # Assert
    assert owners <= {"fedface"}, f"another distribution installs fedface_bench: {owners}"


@pytest.mark.parametrize("package", PRODUCT_PACKAGES)
def test_no_product_package_imports_the_benchmarks(package: str) -> None:
    # Execute
    offenders = importers_of("fedface_bench", (package,))
    # Assert
    assert offenders == [], f"product code imports the benchmarks: {offenders}"


@pytest.mark.parametrize("upper", ["simulator", "fedface_bench", "fedface"])
def test_the_server_does_not_import_what_sits_above_it(upper: str) -> None:
    # Execute
    offenders = importers_of(upper, ("server_api",))
    # Assert
    assert offenders == [], f"server_api imports {upper}: {offenders}"


@pytest.mark.parametrize("upper", ["server_api", "device_sdk", "simulator", "fedface_bench", "fedface", "export", "pretrain"])
def test_the_core_imports_nothing_above_it(upper: str) -> None:
    # Execute: a test may drive the code above (the federation protocol test signs with the SDK)
    offenders = importers_of(upper, ("facecore",), tests=False)
    # Assert
    assert offenders == [], f"facecore imports {upper}: {offenders}"


@pytest.mark.parametrize("heavy", ["httpx", "fastapi", "starlette", "sqlalchemy", "psycopg", "torch", "facecore.losses", "requests"])
def test_the_federation_rules_import_no_transport_database_or_torch(heavy: str) -> None:
    # Execute: the strategies may train (FedFace's spreadout runs in torch), and the wire's `delta` subtracts
    # the tensors a device trained (torch imported inside it, so importing the wire stays numpy-only:
    # wire_test checks that); nothing else there may
    allowed = ("facecore/federation/strategies/", "facecore/federation/wire.py")
    offenders = [found for found in importers_of(heavy, ("facecore/federation",), tests=False)
                 if not (heavy in ("torch", "facecore.losses") and found.startswith(allowed))]
    # Assert
    assert offenders == [], f"facecore/federation imports {heavy}: {offenders}"


def test_the_strategies_and_the_wires_delta_are_the_only_federation_code_that_imports_torch() -> None:
    # Execute
    importers = importers_of("torch", ("facecore/federation",), tests=False)
    # Assert: the allowance above is used, and only where expected
    expected = ("facecore/federation/strategies/fedface.py", "facecore/federation/wire.py")
    assert importers and all(found.startswith(expected) for found in importers), importers
