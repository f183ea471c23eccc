"""Workload files: ``name,time,application,num_replicas,batch_size`` per job.

An optional ``epochs`` column declares how many epochs a job trains (blank:
its application's usual number, undeclared): a declared job runs that long
and a policy is told its remaining work even when it learns online.

An optional ``stated_epochs`` column is what the job's user says it will
train (``--epochs``, ``init(total_steps=...)`` live), which may be wrong:
the job still trains its ``epochs``, but a policy learning online is told
the remaining work the statement implies (blank: nothing stated). Written
by :mod:`dlsub.sim.generate`.

Optional ``user`` and ``command`` columns say whose a job is and what it
runs: the source that ``--history columns`` needs to start a job's
throughput fit from earlier runs of the same user's same command (see
:mod:`dlsub.sim.information`). The Pollux workloads state neither.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

REQUIRED = ("name", "time", "application", "num_replicas", "batch_size")


class WorkloadError(ValueError):
    """A workload file that cannot be replayed; the message says what to fix."""


@dataclass(frozen=True)
class WorkloadJob:
    name: str
    arrival_s: float
    application: str
    num_replicas: int
    batch_size: int
    epochs: int | None = None
    user: str | None = None
    command: str | None = None
    stated_epochs: float | None = None


# The Pollux artifact's data, shipped with dlsub (see pollux/README.md).
POLLUX_DIR = Path(__file__).resolve().parent / "pollux"
SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"


def default_traces_dir(workload: Path) -> Path:
    """The ``traces/`` folder beside a Pollux-style ``workloads/`` folder, else the shipped Pollux traces."""
    for parent in (workload.parent, workload.parent.parent):
        candidate = parent / "traces"
        if candidate.is_dir():
            return candidate
    return POLLUX_DIR / "traces"


def read_workload(path: Path) -> list[WorkloadJob]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [col for col in REQUIRED if col not in (reader.fieldnames or [])]
            if missing:
                raise WorkloadError(
                    f"{path}: missing column(s) {', '.join(missing)}; a workload needs {','.join(REQUIRED)}"
                )
            jobs = []
            for line, row in enumerate(reader, start=2):
                try:
                    job = WorkloadJob(
                        name=row["name"],
                        arrival_s=float(row["time"]),
                        application=row["application"],
                        num_replicas=int(row["num_replicas"]),
                        batch_size=int(row["batch_size"]),
                        epochs=int(row["epochs"]) if row.get("epochs") else None,
                        user=row.get("user") or None,
                        command=row.get("command") or None,
                        stated_epochs=float(row["stated_epochs"]) if row.get("stated_epochs") else None,
                    )
                except (TypeError, ValueError) as exc:
                    raise WorkloadError(f"{path}:{line}: {exc}") from None
                if (job.num_replicas < 1 or job.batch_size < 1 or job.arrival_s < 0 or (job.epochs or 1) < 1
                        or not (job.stated_epochs or 1) > 0):
                    raise WorkloadError(f"{path}:{line}: time must be >= 0, num_replicas, batch_size and epochs "
                                        ">= 1, stated_epochs > 0")
                jobs.append(job)
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror}") from None
    if not jobs:
        raise WorkloadError(f"{path}: no jobs")
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise WorkloadError(f"{path}: job names must be unique")
    return jobs


COLUMNS = (*REQUIRED, "epochs", "user", "command", "stated_epochs")


def write_workload(jobs: list[WorkloadJob], path: Path) -> None:
    """A workload file :func:`read_workload` reads back as ``jobs`` (blank: not given)."""
    def cell(value: object) -> str:
        return "" if value is None else format(value, ".10g") if isinstance(value, float) else str(value)

    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for job in jobs:
            writer.writerow([cell(v) for v in (job.name, job.arrival_s, job.application, job.num_replicas,
                                               job.batch_size, job.epochs, job.user, job.command,
                                               job.stated_epochs)])
