"""Unit (no Slurm): ARCHITECTURE.md names only folders, files, modules and code that exist, its resize
walkthrough can be followed with the files it names, and it stays short."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "ARCHITECTURE.md"
#: Top-level folders the package maps under `dlsub` (pyproject's package-dir).
PACKAGE_DIRS = {"agent", "cli", "job", "estimate", "site_config", "dashboard", "policies", "sim", "slurm_plugins",
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
    (layers,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == ["dlsub"]]
    assert layers["exhaustive"]
    written = " › ".join(f"`{layer}`" for layer in layers["layers"])
    assert written in " ".join(DOC.read_text().split()), written


def test_the_ticks_steps_it_lists_are_the_ones_import_linter_holds() -> None:
    """Its order of the agent's tick steps is pyproject's layers contract inside dlsub.agent, and the modules the
    contract keeps from the store are the steps it lists below the tick."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (steps,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == ["dlsub.agent"]]
    written = " › ".join(f"`{layer}`" for layer in steps["layers"])
    assert written in " ".join(DOC.read_text().split()), written
    (store,) = [c for c in contracts if c.get("forbidden_modules", [])[:1] == ["dlsub.agent.agent_store"]]
    below_tick = {m for layer in steps["layers"][1:-1] for m in layer.split(" | ")}
    assert {m.removeprefix("dlsub.agent.") for m in store["source_modules"]} == below_tick


# ---------------------------------------------------------------- the code names it quotes
def _definitions() -> tuple[dict[str, set[Path]], dict[tuple[str, str], set[Path]]]:
    """Every name the package defines (classes, functions, module constants, and the methods and fields of
    its classes), with the files that define it; and each (class, member) pair."""
    import ast

    names: dict[str, set[Path]] = {}
    members: dict[tuple[str, str], set[Path]] = {}
    files = [f for d in (*PACKAGE_DIRS, "dlsub") for f in (REPO / d).rglob("*.py")]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            for name in _defined(node):
                names.setdefault(name, set()).add(path)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    for name in _defined(item):
                        members.setdefault((node.name, name), set()).add(path)
    return names, members


def _defined(node: object) -> list[str]:
    import ast

    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def _code_names(text: str) -> list[str]:
    """The quoted names that are code, not commands or layers: CamelCase, CONSTANTS, Class.member, _private."""
    words = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`", text)
    return [w for w in dict.fromkeys(words) if not w.startswith(("dlsub", "__")) and (
        any(c.isupper() for c in w) or w.startswith("_"))]


def _resolves(word: str, names: dict[str, set[Path]], members: dict[tuple[str, str], set[Path]]) -> set[Path]:
    """The files that define what ``word`` names (none: it names nothing in the package)."""
    if word.startswith("DLSUB_"):  # an environment variable: the contract names it
        contract = REPO / "dlsub" / "contract.py"
        return {contract} if f'"{word}"' in contract.read_text() else set()
    if "." in word:
        owner, member = word.split(".")
        return members.get((owner, member), set())
    return names.get(word, set()) | {p for (_, m), ps in members.items() if m == word for p in ps}


def test_every_code_name_it_quotes_is_defined_in_the_package() -> None:
    """A class, a Class.member, a constant or a function it names exists (so a rename updates the map)."""
    names, members = _definitions()
    quoted = _code_names(DOC.read_text())
    assert len(quoted) >= 8, quoted
    missing = [w for w in quoted if not _resolves(w, names, members)]
    assert not missing, f"ARCHITECTURE.md names code the package does not define: {missing}"


def test_a_gpu_grow_can_be_followed_with_the_files_its_walkthrough_names() -> None:
    """The resize walkthrough, read alone, leads from the decision to Slurm: each code name it quotes is
    defined in a file that same section names, and it names the grow's Slurm calls."""
    text = DOC.read_text()
    section = text[text.index("## A resize"):text.index("## The contract")]
    files = {REPO / p.rstrip(",.") for p in re.findall(r"`([^`\s]+\.py)`", section)}
    names, members = _definitions()
    quoted = _code_names(section)
    assert {"SlurmClient.point_at_node", "SlurmClient.release", "Capacity", "STEPS"} <= set(quoted), quoted
    astray = [w for w in quoted if not _resolves(w, names, members) & files]
    assert not astray, f"the resize walkthrough names code defined in no file it names: {astray}"
    for path in ("agent/decide.py", "policies/actions/resize_rules.py", "agent/agent_store.py", "agent/act.py",
                 "slurm_plugins/client.py"):
        assert REPO / path in files, f"the walkthrough of a grow does not name {path}"
    assert "`scontrol update Partition= ReqNodeList=`" in section
