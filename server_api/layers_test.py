"""The server's layers keep to their jobs, checked on the source, since import-linter checks imports
between packages and not names or calls:
- crud holds queries only: it never ends a transaction and never builds an API response;
- services return domain results and query through crud: they never build an API response, never
  take a callback that computes a value for them (a route's `respond` would build the response inside
  the service all the same), and never write a SELECT of their own.
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

SERVER = Path(__file__).parent
TRANSACTION_ENDS = {"commit", "rollback"}


def _modules(layer: str) -> dict[str, ast.Module]:
    folder = SERVER / layer
    return {path.name: ast.parse(path.read_text(), str(path)) for path in sorted(folder.glob("*.py")) if not path.name.endswith("_test.py")}


def _transaction_ends(tree: ast.Module) -> list[str]:
    return [
        f"line {node.lineno}: .{node.func.attr}()" for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TRANSACTION_ENDS
    ]


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


def _value_callbacks(tree: ast.Module) -> list[str]:
    """Parameters typed ``Callable[..., R]`` with R other than None: a value the caller computes for the
    function, such as a response body. A hook that returns nothing (a rate limit's charge) is allowed."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            annotation = arg.annotation
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
                annotation = ast.parse(annotation.value, mode="eval").body
            if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).split(".")[-1] == "Callable"):
                continue
            signature = annotation.slice
            returns = signature.elts[-1] if isinstance(signature, ast.Tuple) and signature.elts else None
            if not (isinstance(returns, ast.Constant) and returns.value is None):
                found.append(f"line {node.lineno}: {node.name}({arg.arg})")
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


def _offenders(layer: str, rule: Callable[[ast.Module], list[str]]) -> dict[str, list[str]]:
    return {name: found for name, tree in _modules(layer).items() if (found := rule(tree))}


def test_both_layers_are_found() -> None:
    # Execute
    crud, services = _modules("crud"), _modules("services")
    # Assert: a moved folder must not make the checks below pass by reading nothing
    assert {"rounds.py", "devices.py", "updates.py", "secagg.py", "versions.py"} <= set(crud)
    assert {"rounds.py", "devices.py", "uploads.py", "secure_aggregation.py", "aggregation.py", "context.py"} <= set(services)


def test_no_crud_function_commits_or_rolls_back() -> None:
    # Execute / Assert: the service that called crud owns the transaction (core.db.transaction)
    assert _offenders("crud", _transaction_ends) == {}


def test_neither_crud_nor_a_service_builds_an_api_response() -> None:
    # Execute / Assert: responses are built in the API layer from the rows and results these return
    assert _offenders("crud", _response_models) == {}
    assert _offenders("services", _response_models) == {}


def test_neither_crud_nor_a_service_takes_a_callback_for_a_value() -> None:
    # Execute / Assert: they return plain values, and the caller builds what it needs from them
    assert _offenders("crud", _value_callbacks) == {}
    assert _offenders("services", _value_callbacks) == {}


def test_no_service_writes_a_query() -> None:
    # Execute / Assert: queries live in crud, where they are found and reused
    assert _offenders("services", _select_calls) == {}


def test_the_callback_check_sees_a_response_builder_and_allows_a_hook() -> None:
    # Prepare: the shapes a callback may take, beside a hook that returns nothing
    source = (
        "from collections.abc import Callable\n"
        "import typing\n"
        "\n"
        "def f(admit: Callable[[str], None], respond: Callable[[int, int], dict[str, Any]], *, body: typing.Callable[..., bytes]):\n"
        "    async def g(make: 'Callable[[], int]', plain: int) -> None: ...\n"
    )
    # Execute
    found = _value_callbacks(ast.parse(source))
    # Assert
    assert found == ["line 4: f(respond)", "line 4: f(body)", "line 5: g(make)"]


def test_the_checks_see_a_commit_a_response_model_and_a_select() -> None:
    # Prepare: what the rules forbid, as a layer might write it, beside what they allow
    source = (
        "import sqlalchemy as sa\n"
        "from server_api.schemas import RoundCreate, UpdatePublic\n"
        "\n"
        "def f(session):\n"
        "    _select(session)\n"
        "    session.commit()\n"
        "    return session.scalar(sa.select(1)), select(2)\n"
    )
    tree = ast.parse(source)
    # Execute
    ends, imports, selects = _transaction_ends(tree), _response_models(tree), _select_calls(tree)
    # Assert
    assert ends == ["line 6: .commit()"] and imports == ["line 2: UpdatePublic"]
    assert sorted(selects) == ["line 7: select()", "line 7: select()"]
