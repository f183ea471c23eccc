"""Fencing: what an attempt that is no longer its job's newest may not do (issue 53; the rule is the contract's).

When a node is cut off, or its slurmd lost, Slurm requeues the job and starts a newer attempt elsewhere, while
the old attempt's processes may train on: two writers in one job directory. The newer attempt's batch launcher
records its start (``attempts.jsonl``) before its container starts; from then on the older attempt publishes
nothing (its checkpoint, seal or progress record raises :class:`Superseded`, which ends the process), its
container launcher stops its training, and what it wrote after that moment, should it land late, is never
restored (:func:`stale`).

Read through the environment the batch launcher gives the container (``DLSUB_JOB_DIR``, ``DLSUB_ATTEMPT``):
outside Slurm there is nothing to fence. The attempts file is read again only when its size or modification
time changed, so a check before every progress record costs one ``stat``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlsub import contract

#: The most of the attempts file read (its end): an attempt's records are two short lines.
MAX_ATTEMPTS_BYTES = 1 << 20


class Superseded(SystemExit):
    """Raised where this attempt would publish after a newer attempt of its job began: the process exits with
    :data:`~dlsub.contract.SUPERSEDED_EXIT_CODE` and its message on stderr."""

    def __init__(self, attempt: str, newer: str, what: str) -> None:
        super().__init__(contract.SUPERSEDED_EXIT_CODE)
        self.message = (f"dlsub: attempt {attempt} of this job was superseded by attempt {newer} (the job was "
                        f"requeued and started again elsewhere): {what} not written; stopping")


class _AttemptsFile:
    """The attempts file's records, read again only when it changed."""

    def __init__(self) -> None:
        self._seen: tuple[str, int, int] | None = None
        self._records: list[dict[str, Any]] = []

    def records(self, job_dir: Path) -> list[dict[str, Any]]:
        path = job_dir / contract.ATTEMPTS_FILE
        try:
            info = os.stat(path)
        except OSError:
            return []
        key = (str(path), info.st_size, info.st_mtime_ns)
        if key != self._seen:
            self._records, self._seen = _read(path), key
        return self._records


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_ATTEMPTS_BYTES))
            text = f.read(MAX_ATTEMPTS_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut at the read's start, or not the launcher's
        if isinstance(record, dict):
            records.append(record)
    return records


_ATTEMPTS = _AttemptsFile()


def _where() -> tuple[Path, str] | None:
    """(job directory, attempt) of this process under dlsub in Slurm; None elsewhere (nothing to fence)."""
    job_dir, attempt = os.environ.get(contract.ENV_JOB_DIR), os.environ.get(contract.ENV_ATTEMPT, "")
    return (Path(job_dir), attempt) if job_dir and contract.attempt_order(attempt) is not None else None


def newer_attempt() -> tuple[str, float] | None:
    """(the newer attempt, when it started) when this process's attempt has been superseded; else None."""
    where = _where()
    return contract.superseded_since(where[1], _ATTEMPTS.records(where[0])) if where else None


def check(what: str) -> None:
    """Raise :class:`Superseded` (after saying so on stderr) when a newer attempt of this job has begun:
    ``what`` (e.g. "its checkpoint") must not be published."""
    newer = newer_attempt()
    if newer is not None:
        # A newer attempt is found only for a process whose attempt is in its environment (_where).
        stopped = Superseded(os.environ[contract.ENV_ATTEMPT], newer[0], what)
        print(stopped.message, file=sys.stderr, flush=True)
        raise stopped


def written_by() -> dict[str, Any]:
    """What a checkpoint records of its writer, for :func:`stale`: this attempt and now ({} outside Slurm)."""
    where = _where()
    return {"attempt": where[1], "time": round(time.time(), 6)} if where else {}


def stale(meta: Mapping[str, Any]) -> str | None:
    """Why a checkpoint (``meta``: what it recorded) is not the job's: written by an attempt after a newer one
    began. None when it is the job's, or outside Slurm."""
    job_dir = os.environ.get(contract.ENV_JOB_DIR)
    if not job_dir or "attempt" not in meta:
        return None
    return contract.written_after_superseded(meta, _ATTEMPTS.records(Path(job_dir)))
