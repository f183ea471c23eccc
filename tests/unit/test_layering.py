"""Unit (no Slurm): the container-side library imports only the contract.

``dlsub.checkpointing`` is bind-mounted into training containers that may have
nothing but Python and torch; import-linter checks the layering over the
installed package (``make lint``), and this test proves it at run time, in a
fresh interpreter where every other dlsub package and dlsub's third-party
dependencies raise on import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import NO_HANG_S

REPO = Path(__file__).resolve().parents[2]

BLOCKED_RUN = r"""
import importlib.abc
import os
import pkgutil
import sys

ALLOWED = {"dlsub", "dlsub.contract", "dlsub.batch_split", "dlsub.hostlist"}
THIRD_PARTY = {"click", "sqlite_utils", "numpy", "scipy", "apscheduler", "prometheus_client",
               "fastapi", "uvicorn", "jinja2"}


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        ours = name.startswith("dlsub.") and name not in ALLOWED and not name.startswith("dlsub.checkpointing")
        if ours or name.split(".")[0] in THIRD_PARTY:
            raise ImportError(f"the container-side library imported {name}")
        return None


sys.meta_path.insert(0, Blocked())
import dlsub.checkpointing as checkpointing

# These need torch (which tries numpy) or a framework the container may not have: import-linter checks them.
NEEDS_FRAMEWORK = {"dlsub.checkpointing.sharded", "dlsub.checkpointing.lightning", "dlsub.checkpointing.hf_trainer"}
for info in pkgutil.iter_modules(checkpointing.__path__, "dlsub.checkpointing."):
    if info.name not in NEEDS_FRAMEWORK:
        __import__(info.name)
from dlsub.checkpointing import batch, run

os.environ["SLURM_JOB_NODELIST"] = "gpu[1-2],cpu1"
assert run._hostlist("SLURM_JOB_NODELIST") == ["gpu1", "gpu2", "cpu1"]
assert batch.split(batch.BatchSizes(64, max=256, local_max=64), 4, 128, "declared").micro_batch_size > 0
print("ok", sorted(m for m in sys.modules if m.startswith("dlsub")))
"""


def test_checkpointing_imports_nothing_but_the_contract() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED_RUN], cwd=REPO, capture_output=True, text=True,
                          timeout=NO_HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok"), done.stdout
    loaded = done.stdout
    for other in ("dlsub.policies", "dlsub.agent", "dlsub.slurm_plugins", "dlsub.job", "dlsub.cli"):
        assert f"'{other}" not in loaded


def test_the_blocker_does_block() -> None:
    """The guard itself: importing a scheduler package under it fails (so the test above can fail)."""
    probe = BLOCKED_RUN.replace("import dlsub.checkpointing as checkpointing",
                                "import dlsub.policies.registry\nimport dlsub.checkpointing as checkpointing")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=NO_HANG_S)
    assert done.returncode != 0
    assert "the container-side library imported dlsub.policies" in done.stderr


def _imported_roots(path: Path) -> set[str]:
    """The top-level names every import statement of a file reaches (at any depth, TYPE_CHECKING ones too)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_contract_imports_the_standard_library_only() -> None:
    """dlsub/contract.py is what every program shares, the container's included: nothing but the stdlib
    (import-linter's layers keep it from the rest of dlsub; this keeps it from third-party packages)."""
    roots = _imported_roots(REPO / "dlsub" / "contract.py")
    assert roots, "the check reads the file's imports"
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots - set(sys.stdlib_module_names)
