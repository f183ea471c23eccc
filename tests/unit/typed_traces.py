"""Shared by the simulator's unit tests (pure, files under tmp_path only): the Pollux cifar10 traces copied as
two GPU types, ``fast`` and ``slow`` (twice the step and sync times)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from dlsub.sim.workload import POLLUX_DIR

CIFAR = POLLUX_DIR / "traces" / "cifar10"


def _scaled_copy(source: Path, target: Path, factor: float) -> None:
    with source.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with target.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (float(v) * factor if k in ("step_time", "sync_time") else v) for k, v in row.items()})


def write_typed_traces(root: Path) -> Path:
    """``root``/traces/cifar10 with placements-<type>.csv and scalability-<type>.csv for types fast and slow
    (2x); returns ``root``/traces."""
    app = root / "traces" / "cifar10"
    app.mkdir(parents=True)
    for path in CIFAR.glob("validation-*.csv"):
        shutil.copy(path, app / path.name)
    for kind in ("placements", "scalability"):
        _scaled_copy(CIFAR / f"{kind}.csv", app / f"{kind}-fast.csv", 1.0)
        _scaled_copy(CIFAR / f"{kind}.csv", app / f"{kind}-slow.csv", 2.0)
    return root / "traces"
