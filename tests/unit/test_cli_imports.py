"""Unit (no Slurm): what a `dlsub` command imports before it does anything.

Every command a user or a script runs on a login node (status, cancel, logs; the live tests poll status each
second) imports the CLI's module. NumPy's import alone was 150 ms of the 350 ms each spent importing
(benchmarks/cli_start.py: status 0.42 s of CPU, 0.30 s without it); only a fit of a loss curve or of an
estimate's profiles needs it, and those import it themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imported_by(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    """The top-level packages among ``prefixes`` that a fresh interpreter has imported after ``statement``."""
    code = (f"import json, sys; {statement}; "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules if m.startswith({prefixes!r})}})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return list(json.loads(out.splitlines()[-1]))


def test_the_cli_imports_no_numpy_scipy_or_torch() -> None:
    assert _imported_by("import dlsub.cli.main", ("numpy", "scipy", "torch")) == []


def test_a_fit_still_gets_numpy_when_it_runs() -> None:
    code = ("from dlsub.job.loss_curve import fit_loss_curve; "
            "assert fit_loss_curve(list(range(1, 21)), [1.0 / (0.5 * k + 1.0) + 0.1 for k in range(1, 21)])")
    assert _imported_by(code, ("numpy",)) == ["numpy"]
