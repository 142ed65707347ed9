"""services return domain results and query through crud: no module in it builds an API response
or writes a SELECT of its own.

Import-linter checks imports between packages, not names or calls, so this reads the source instead
(as crud/crud_layer_test.py does for crud)."""
from __future__ import annotations

import ast
from pathlib import Path

SERVICES = Path(__file__).parent


def _service_modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(), str(path)) for path in sorted(SERVICES.glob("*.py")) if not path.name.endswith("_test.py")}


def _response_models(tree: ast.Module) -> list[str]:
    """Response models imported from server_api.schemas (``*Public``), or the whole module; request
    bodies (``*Create``) are a service's input and may be imported."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "server_api.schemas":
            found += [f"line {node.lineno}: {alias.name}" for alias in node.names if alias.name.endswith("Public") or alias.name == "*"]
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: {alias.name}" for alias in node.names if alias.name == "server_api.schemas"]
    return found


def _select_calls(tree: ast.Module) -> list[str]:
    """Calls of ``select(...)`` or ``<module>.select(...)``; a function merely named like it (``_select``) is not one."""
    return [
        f"line {node.lineno}: select()" for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id == "select")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "select")
        )
    ]


def test_the_services_layer_is_found() -> None:
    # Execute
    modules = _service_modules()
    # Assert: a moved folder must not make the checks below pass by reading nothing
    assert {"rounds.py", "devices.py", "uploads.py", "secure_aggregation.py", "aggregation.py", "context.py"} <= set(modules)


def test_no_service_builds_an_api_response() -> None:
    # Prepare
    modules = _service_modules()
    # Execute
    imports = {name: _response_models(tree) for name, tree in modules.items()}
    # Assert: a service returns rows or its own dataclasses; the route builds the response from them
    assert {name: found for name, found in imports.items() if found} == {}


def test_no_service_writes_a_query() -> None:
    # Prepare
    modules = _service_modules()
    # Execute
    selects = {name: _select_calls(tree) for name, tree in modules.items()}
    # Assert: queries live in crud, where they are found and reused
    assert {name: found for name, found in selects.items() if found} == {}


def test_the_checks_see_a_response_model_and_a_select() -> None:
    # Prepare: what the rules forbid, as a service might write it, beside what they allow
    source = (
        "import sqlalchemy as sa\n"
        "from server_api.schemas import RoundCreate, UpdatePublic\n"
        "\n"
        "def f(session):\n"
        "    _select(session)\n"
        "    return session.scalar(sa.select(1)), select(2)\n"
    )
    tree = ast.parse(source)
    # Execute
    imports, selects = _response_models(tree), _select_calls(tree)
    # Assert
    assert imports == ["line 2: UpdatePublic"] and sorted(selects) == ["line 6: select()", "line 6: select()"]
