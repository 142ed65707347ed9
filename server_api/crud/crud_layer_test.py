"""crud stays queries only: no module in it ends a transaction or builds an API response.

Import-linter checks imports between packages, not calls, so this reads the source instead."""
from __future__ import annotations

import ast
from pathlib import Path

CRUD = Path(__file__).parent
TRANSACTION_ENDS = {"commit", "rollback"}


def _crud_modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(), str(path)) for path in sorted(CRUD.glob("*.py")) if not path.name.endswith("_test.py")}


def _transaction_ends(tree: ast.Module) -> list[str]:
    return [
        f"line {node.lineno}: .{node.func.attr}()" for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TRANSACTION_ENDS
    ]


def _response_models(tree: ast.Module) -> list[str]:
    """Response models imported from server_api.schemas (``*Public``), or the whole module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "server_api.schemas":
            found += [f"line {node.lineno}: {alias.name}" for alias in node.names if alias.name.endswith("Public") or alias.name == "*"]
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: {alias.name}" for alias in node.names if alias.name == "server_api.schemas"]
    return found


def test_the_crud_layer_is_found() -> None:
    # Execute
    modules = _crud_modules()
    # Assert: a moved folder must not make the checks below pass by reading nothing
    assert {"rounds.py", "devices.py", "updates.py", "secagg.py", "versions.py"} <= set(modules)


def test_no_crud_function_commits_or_rolls_back() -> None:
    # Prepare
    modules = _crud_modules()
    # Execute
    ends = {name: _transaction_ends(tree) for name, tree in modules.items()}
    # Assert: the service that called crud owns the transaction (core.db.transaction)
    assert {name: found for name, found in ends.items() if found} == {}


def test_no_crud_module_builds_an_api_response() -> None:
    # Prepare
    modules = _crud_modules()
    # Execute
    imports = {name: _response_models(tree) for name, tree in modules.items()}
    # Assert: responses are built in the API layer from what crud returns
    assert {name: found for name, found in imports.items() if found} == {}


def test_the_checks_see_a_commit_and_a_response_model() -> None:
    # Prepare: what the rules forbid, as crud might write it
    tree = ast.parse("from server_api.schemas import RoundPublic\n\ndef f(session):\n    session.commit()\n")
    # Execute
    ends, imports = _transaction_ends(tree), _response_models(tree)
    # Assert
    assert ends == ["line 4: .commit()"] and imports == ["line 1: RoundPublic"]
