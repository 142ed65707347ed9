"""The figures files committed beside the weights name no machine: paths are the repository's or the cache's."""
import json
from pathlib import Path
from typing import Any

from facecore.models.checkpoint import WEIGHTS_DIR, model_source


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_no_committed_figures_file_records_an_absolute_path() -> None:
    # Prepare
    files = sorted(WEIGHTS_DIR.glob("*.json"))
    # Execute
    absolute = {f.name: s for f in files for s in _strings(json.loads(f.read_text())) if s.startswith("/")}
    # Assert
    assert files and absolute == {}


def test_the_bundled_model_is_named_by_its_path_in_the_repository() -> None:
    source = model_source("mobile")
    assert not Path(source).is_absolute() and (WEIGHTS_DIR.parents[1] / source).is_file()
