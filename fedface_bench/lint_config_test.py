"""The lint gate catches what it is for. import-linter, run with the repo's own contracts on a throwaway package tree,
passes the layering the code is meant to have and fails each kind of import the contracts exist to stop; `make test`
runs ruff, mypy and lint-imports before the weights and the suite, and a failing linter stops it; every package that
setuptools ships sits in the layers. And one rule the tools cannot express: every `pytest.raises` names the message it
expects (`match=`), so a test cannot pass on the wrong error of the right type."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
IMPORTLINTER = PYPROJECT["tool"]["importlinter"]
CONTRACT_NAMES = {contract["id"]: contract["name"] for contract in IMPORTLINTER["contracts"]}

# A tree laid out as the contracts intend: each import goes down a layer or stays inside the server's own order
# (app -> api -> services -> crud -> core). Every violation below is one module planted into it.
LAYERED_TREE = {
    "fedface/cli.py": "import fedface_bench.sim\nimport device_sdk.client\nimport pretrain.train\nimport export.onnx\n",
    "fedface_bench/sim.py": "import simulator.engine\nimport server_api.app\n",
    "simulator/engine.py": "import server_api.core.cfg\nimport facecore.maths\n",
    "server_api/app.py": "import server_api.api.routes\n",
    "server_api/api/routes.py": "from server_api.services import pay\n",
    "server_api/services/pay.py": "import server_api.crud.rows\nimport server_api.core.cfg\nimport facecore.maths\n",
    "server_api/crud/rows.py": "import server_api.core.cfg\n",
    "server_api/core/cfg.py": "",
    "device_sdk/client.py": "import facecore.maths\n",
    "pretrain/train.py": "import facecore.maths\n",
    "export/onnx.py": "import facecore.maths\n",
    "facecore/maths.py": "",
}


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for package in IMPORTLINTER["root_packages"]:  # lint-imports refuses a config whose root package is missing
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            if folder != Path("."):
                (root / folder / "__init__.py").touch()
        path.write_text(source)


def _repo_contracts_as_toml() -> str:
    """The repo's [tool.importlinter] written out again. Only change: an ignore_imports line that matches nothing
    in the throwaway tree is not an error there (in the repo, `make lint` keeps it one)."""
    lines = ["[tool.importlinter]", f"root_packages = {json.dumps(IMPORTLINTER['root_packages'])}"]
    for contract in IMPORTLINTER["contracts"]:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in contract.items()]  # JSON strings, lists, booleans are TOML
        if "ignore_imports" in contract:
            lines.append('unmatched_ignore_imports_alerting = "none"')
    return "\n".join(lines) + "\n"


def lint_imports(root: Path, planted: dict[str, str]) -> tuple[int, str, dict[str, str]]:
    """Exit status, report and {contract id: KEPT or BROKEN} of lint-imports run with the repo's contracts on
    LAYERED_TREE plus `planted`, under `root`."""
    _write_tree(root, LAYERED_TREE | planted)
    (root / "pyproject.toml").write_text(_repo_contracts_as_toml())
    # lint-imports puts its working folder first on sys.path, ahead of the editable install of the real packages
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=60)
    report = " ".join((done.stdout + done.stderr).split())  # long contract names wrap across lines
    verdicts = {}
    for contract_id, name in CONTRACT_NAMES.items():
        found = re.search(re.escape(" ".join(name.split())) + r" (KEPT|BROKEN)", report)
        assert found, f"lint-imports did not report contract {contract_id!r}: {report[:2000]}"
        verdicts[contract_id] = found.group(1)
    return done.returncode, report, verdicts


def test_the_contracts_pass_the_intended_layering(tmp_path: Path) -> None:
    # Execute
    code, report, verdicts = lint_imports(tmp_path, {})
    # Assert: a contract that forbade a legitimate import (the app on the HTTP layer, services on crud) fails here
    assert set(verdicts.values()) == {"KEPT"} and code == 0, report
    assert f"Analyzed {len(list(tmp_path.rglob('*.py')))} files" in report  # this tree, not the installed repo


@pytest.mark.parametrize(("module", "source", "broken"), [
    ("server_api/crud/planted.py", "import server_api.services.pay\n", "crud-below-services"),
    ("server_api/crud/planted.py", "def late() -> None:\n    from server_api.services import pay\n", "crud-below-services"),
    ("server_api/services/planted.py", "import server_api.api.routes\n", "api-on-top"),
    ("server_api/core/planted.py", "from server_api.api import routes\n", "api-on-top"),
    ("server_api/planted.py", "import device_sdk.client\n", "server-without-sdk"),
    ("facecore/planted.py", "import server_api.core.cfg\n", "layers"),
    ("facecore/planted.py", "import fedface.cli\n", "layers"),
    ("server_api/planted.py", "import simulator.engine\n", "layers"),
    ("simulator/planted.py", "import fedface_bench.sim\n", "layers"),
    ("device_sdk/planted.py", "import export.onnx\n", "layers"),  # the SDK, pretraining and export are siblings
], ids=["crud->services", "crud->services lazily", "services->api", "core->api", "server->sdk", "facecore->server_api",
        "facecore->cli", "server->simulator", "simulator->benchmarks", "sdk->export"])
def test_each_contract_fails_the_import_it_forbids(tmp_path: Path, module: str, source: str, broken: str) -> None:
    # Execute
    code, report, verdicts = lint_imports(tmp_path, {module: source})
    # Assert: that contract alone breaks, and the report names the planted module
    assert code != 0
    assert verdicts == {contract_id: "BROKEN" if contract_id == broken else "KEPT" for contract_id in CONTRACT_NAMES}, report
    assert module.removesuffix(".py").replace("/", ".") + " -> " in report


def test_the_layers_contract_orders_every_shipped_package_and_exempts_only_tests() -> None:
    # Prepare
    shipped = {pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    layers = next(contract for contract in IMPORTLINTER["contracts"] if contract["type"] == "layers")
    # Execute
    layered = {name.strip() for layer in layers["layers"] for name in re.split(r"[|:]", layer)}  # independent or not
    exempted = [rule.split("->")[0].strip() for rule in layers.get("ignore_imports", [])]
    # Assert: a package outside the layers is not checked at all (the contract is not exhaustive), and an exemption
    # may only let a test drive the code above its package
    assert layered == shipped == set(IMPORTLINTER["root_packages"])
    assert [name for name in exempted if not name.rsplit(".", 1)[-1].endswith("_test")] == []


def _fake_tools(folder: Path, failing: str = "") -> Path:
    """A BIN folder whose ruff, mypy, lint-imports, fedface and python log their command line; `failing` exits 1."""
    folder.mkdir()
    log = folder / "log"
    for tool in ("ruff", "mypy", "lint-imports", "fedface", "python"):
        (folder / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexit {1 if tool == failing else 0}\n')
        (folder / tool).chmod(0o755)
    return log


def _make(target: str, bin_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # STAMP empty: no venv rebuild; the caller's make flags (a jobserver, -j) stay out of it
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", *flags, target, f"BIN={bin_dir}", "STAMP="], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_make_test_runs_ruff_mypy_and_lint_imports_before_the_weights_and_the_suite(tmp_path: Path) -> None:
    # Prepare
    log = _fake_tools(tmp_path / "bin")
    planned = _make("test", tmp_path / "bin", "-n").stdout.splitlines()
    assert planned and all(line.startswith(f"{tmp_path}/bin/") for line in planned), planned  # only the fakes will run
    # Execute
    made = _make("test", tmp_path / "bin")
    # Assert
    ran = [line.split()[0] for line in log.read_text().splitlines()]
    assert made.returncode == 0, made.stderr
    assert ran == ["ruff", "mypy", "lint-imports", "fedface", "python"]
    assert log.read_text().splitlines()[-1].startswith("python -m pytest")


@pytest.mark.parametrize("failing", ["ruff", "mypy", "lint-imports"])
def test_a_failing_linter_stops_make_test_before_the_suite(tmp_path: Path, failing: str) -> None:
    # Prepare
    log = _fake_tools(tmp_path / "bin", failing)
    # Execute
    made = _make("test", tmp_path / "bin")
    # Assert: make fails at that tool; nothing after it runs (an ignored error, `-` or `|| true`, would go on)
    ran = [line.split()[0] for line in log.read_text().splitlines()]
    assert made.returncode != 0
    assert ran[-1] == failing and "fedface" not in ran and "python" not in ran


def test_the_lint_tools_installed_are_the_pinned_ones() -> None:
    # Prepare: `make venv` installs '.[test]', where the tools are pinned so a new release cannot fail CI on its own
    pins = dict(spec.split("==") for spec in PYPROJECT["project"]["optional-dependencies"]["test"] if "==" in spec)
    # Execute
    installed = {tool: metadata.version(tool) for tool in ("ruff", "mypy", "import-linter")}
    # Assert
    assert installed == {tool: pins.get(tool) for tool in installed}


# --- every pytest.raises names its message ---------------------------------------------------------------------

TEST_FILE = re.compile(r"(_test|^test_.*|^conftest)\.py$")


def _test_files() -> list[Path]:
    """Every test module, conftest and test helper under pytest's testpaths (all of tests/ is test code)."""
    files: set[Path] = set()
    for folder in PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"]:
        for path in (REPO / folder).rglob("*.py"):
            if folder == "tests" or TEST_FILE.search(path.name):
                files.add(path)
    return sorted(files | {REPO / "conftest.py"})


def _is_raises(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "raises" and isinstance(func.value, ast.Name)
            and func.value.id == "pytest") or (isinstance(func, ast.Name) and func.id == "raises")


def _vacuous(pattern: ast.expr) -> bool:
    """A literal match= that any message fits (``""``, ``".*"``) or ``None``: it pins nothing."""
    if not isinstance(pattern, ast.Constant):
        return False  # built from values (re.escape, f-strings): checked when the test runs
    return pattern.value is None or (isinstance(pattern.value, str) and all(
        re.search(pattern.value, text) for text in ("", "an unrelated message 0123 ([x])")))


def raises_without_match(source: str, where: str) -> list[str]:
    """`where:line` of each pytest.raises(...) call in `source` with no match= keyword, or a vacuous one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _is_raises(node):
            match = next((keyword.value for keyword in node.keywords if keyword.arg == "match"), None)
            if match is None or _vacuous(match):
                found.append(f"{where}:{node.lineno}")
    return found


def test_the_raises_scanner_flags_a_bare_or_vacuous_raises_and_passes_a_pinned_one() -> None:
    # Prepare: `pt` spelt apart, so that a grep for bare raises in the repo does not find these samples
    pt = "pytest" + ".raises"
    source = (
        "import pytest\nfrom pytest import raises\n"
        f"with {pt}(ValueError):\n    pass\n"  # 3
        f"with {pt}(ValueError, match='.*'):\n    pass\n"  # 5
        f"with {pt}(ValueError, match=''):\n    pass\n"  # 7
        "with raises(KeyError) as caught:\n    pass\n"  # 9
        f"def f():\n    with {pt}(\n        OSError,\n    ):\n        pass\n"  # 12
        f"with {pt}(ValueError, match='^lr must be'):\n    pass\n"
        f"with {pt}(ValueError, match='^$'):\n    pass\n"
        f"with {pt}(ValueError, match=re.escape(text)):\n    pass\n"
        "with mocker.raises(ValueError):\n    pass\n"
    )
    # Execute
    found = raises_without_match(source, "t.py")
    # Assert
    assert found == ["t.py:3", "t.py:5", "t.py:7", "t.py:9", "t.py:12"]


def test_every_pytest_raises_names_the_message_it_expects() -> None:
    # Prepare
    files = _test_files()
    assert REPO / "fedface_bench" / "lint_config_test.py" in files and REPO / "tests" / "server" / "conftest.py" in files
    # Execute
    offenders = [hit for path in files for hit in raises_without_match(path.read_text(), str(path.relative_to(REPO)))]
    # Assert
    assert offenders == [], f"pytest.raises without match= (say which message the test expects): {offenders}"

