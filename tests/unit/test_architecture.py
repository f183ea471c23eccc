"""Unit (no Slurm): ARCHITECTURE.md names only folders, files and modules that exist, and stays short."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "ARCHITECTURE.md"
#: Top-level folders the package maps under `dlsub` (pyproject's package-dir).
PACKAGE_DIRS = {"agent", "cli", "job", "estimate", "site_config", "dashboard", "policies", "slurm_plugins",
                "containers", "checkpointing"}


def _quoted() -> list[str]:
    return re.findall(r"`([^`\s]+)`", DOC.read_text())


def _is_path(word: str) -> bool:
    return "/" in word or bool(re.search(r"\.(py|sh|lua|md|toml)$", word)) or word == "Containerfile"


def test_every_path_it_names_exists() -> None:
    """Every folder and file it names, relative to the repository (absolute ones are a site's, not ours)."""
    paths = [w.rstrip(",.") for w in _quoted() if _is_path(w) and not w.startswith(("$", "~", "--", "/"))]
    assert len(paths) > 40, "the map names the folders and files"
    missing = [path for path in paths if not (REPO / path).exists()]
    assert not missing, f"ARCHITECTURE.md names what is not in the tree: {missing}"


def test_every_package_folder_is_on_the_map_and_every_module_it_names_exists() -> None:
    text = DOC.read_text()
    for folder in PACKAGE_DIRS | {"dlsub", "etc", "testbed", "tests", "benchmarks", "examples"}:
        assert f"`{folder}/`" in text, f"{folder}/ is not on the map"
    for module in re.findall(r"`(dlsub(?:\.\w+)+)`", text):
        parts = module.split(".")[1:]
        top = parts[0] if parts[0] in PACKAGE_DIRS else f"dlsub/{parts[0]}"
        base = REPO / top / Path(*parts[1:]) if len(parts) > 1 else REPO / top
        assert base.with_suffix(".py").is_file() or (base / "__init__.py").is_file(), module


def test_it_reads_in_ten_minutes() -> None:
    words = len(DOC.read_text().split())
    assert words < 2000, f"{words} words: keep it to a ten-minute read"


def test_the_layers_it_lists_are_the_ones_import_linter_holds() -> None:
    """Its "Who may import whom" lists pyproject's layers contract, in its order (wrapping aside)."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["exhaustive"] and layers["containers"] == ["dlsub"]
    written = " › ".join(f"`{layer}`" for layer in layers["layers"])
    assert written in " ".join(DOC.read_text().split()), written
