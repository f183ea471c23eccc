"""The agent's own state (SQLite through sqlite-utils, WAL): what Slurm does not keep.

Tables: ``jobs`` (dlsub jobs the agent has seen, their mode and placement
history), ``attempts`` (their Slurm attempts), ``progress`` (samples),
``decisions`` (every decision, with its reason in plain words), ``moves``
(moves in flight: the write-ahead record that makes a move survive a
crash) and ``meta`` (the agent's own pid, last tick, what it is doing).

Slurm stays the source of truth for what runs; after a crash the agent
rebuilds everything else from Slurm and the job directories, and finishes
the moves recorded here.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

DEFAULT_DB = Path("/var/lib/dlsub/agent.db")


def default_db_path() -> Path:
    env = os.environ.get("DLSUB_AGENT_DB")
    return Path(env) if env else DEFAULT_DB


@dataclass(frozen=True)
class Decision:
    time: float
    dlsub_id: str
    slurm_job_id: int | None
    user: str
    kind: str
    reason: str
    details: dict[str, Any]


def _open_readonly(path: Path) -> sqlite3.Connection:
    """Another user's view of the agent's database.

    While the agent runs, its WAL index (``-shm``) exists and a read-only
    connection shares it. When no agent is connected SQLite has removed
    that file, a reader without write access cannot recreate it, and the
    database (fully checkpointed then) is read as immutable instead.
    """
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, check_same_thread=False)
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)


class AgentStore:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        if readonly:
            if not path.exists():
                raise FileNotFoundError(path)
            self.db = sqlite_utils.Database(_open_readonly(path))
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # The scheduler ticks in a worker thread (one at a time).
        conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        self.db.enable_wal()
        self._create()
        # Readers are other users (`dlsub why`, `dlsub agent status`): the files are world-readable.
        for suffix in ("", "-wal", "-shm"):
            try:
                os.chmod(str(path) + suffix, 0o644)
            except OSError:
                pass

    def _create(self) -> None:
        db = self.db
        if "jobs" not in db.table_names():
            db["jobs"].create({
                "dlsub_id": str, "user": str, "slurm_job_id": int, "job_dir": str, "mode": str,
                "ideal_partition": str, "gpus_wanted": int, "first_seen": float, "last_seen": float,
                "last_state": str, "last_partition": str, "continuations": int, "backfilled_from": str,
                "backfilled_limit_min": int, "last_note": str,
            }, pk="dlsub_id", not_null={"continuations"}, defaults={"continuations": 0})
        if "attempts" not in db.table_names():
            db["attempts"].create({
                "slurm_job_id": int, "restart": int, "dlsub_id": str, "partition": str, "nodes": str,
                "first_seen": float, "start_time": float, "state": str,
            }, pk=("slurm_job_id", "restart"))
        if "progress" not in db.table_names():
            db["progress"].create({
                "dlsub_id": str, "time": float, "step": int, "eta_s": float, "steps_per_s": float,
                "checkpoint_step": int, "partition": str,
            })
            db["progress"].create_index(["dlsub_id", "time"])
        if "decisions" not in db.table_names():
            db["decisions"].create({
                "id": int, "time": float, "dlsub_id": str, "slurm_job_id": int, "user": str, "kind": str,
                "reason": str, "details": str,
            }, pk="id")
            db["decisions"].create_index(["dlsub_id", "time"])
        if "moves" not in db.table_names():
            db["moves"].create({
                "dlsub_id": str, "slurm_job_id": int, "kind": str, "phase": str, "target_partition": str,
                "target_gpus": int, "since": float, "signals": int, "created": float, "time_limit_min": int,
            }, pk="dlsub_id")
        if "meta" not in db.table_names():
            db["meta"].create({"key": str, "value": str}, pk="key")

    # ---------------------------------------------------------------- jobs
    def job(self, dlsub_id: str) -> dict[str, Any] | None:
        rows = list(self.db["jobs"].rows_where("dlsub_id = ?", [dlsub_id]))
        return rows[0] if rows else None

    def upsert_job(self, row: dict[str, Any]) -> None:
        self.db["jobs"].upsert(row, pk="dlsub_id", alter=True)

    def set_job(self, dlsub_id: str, **fields: Any) -> None:
        self.db["jobs"].update(dlsub_id, fields, alter=True)

    def record_attempt(self, row: dict[str, Any]) -> None:
        """The first sighting of an attempt; later ones change nothing (it keeps its first_seen)."""
        self.db["attempts"].insert(row, pk=("slurm_job_id", "restart"), ignore=True)

    def record_progress(self, row: dict[str, Any]) -> None:
        last = list(self.db["progress"].rows_where("dlsub_id = ?", [row["dlsub_id"]], order_by="time desc", limit=1))
        if last and last[0]["step"] == row["step"] and last[0]["checkpoint_step"] == row["checkpoint_step"]:
            return
        self.db["progress"].insert(row)

    # ---------------------------------------------------------------- decisions
    def decide(self, when: float, dlsub_id: str, slurm_job_id: int | None, user: str, kind: str, reason: str,
               details: dict[str, Any] | None = None) -> None:
        self.db["decisions"].insert({
            "time": when, "dlsub_id": dlsub_id, "slurm_job_id": slurm_job_id, "user": user, "kind": kind,
            "reason": reason, "details": json.dumps(details or {}),
        })

    def decisions(self, dlsub_id: str | None = None, slurm_job_id: int | None = None) -> list[Decision]:
        if dlsub_id is not None:
            rows = self.db["decisions"].rows_where("dlsub_id = ?", [dlsub_id], order_by="time, id")
        elif slurm_job_id is not None:
            rows = self.db["decisions"].rows_where("slurm_job_id = ?", [slurm_job_id], order_by="time, id")
        else:
            rows = self.db["decisions"].rows_where(order_by="time, id")
        return [Decision(r["time"], r["dlsub_id"], r["slurm_job_id"], r["user"], r["kind"], r["reason"],
                         json.loads(r["details"] or "{}")) for r in rows]

    # ---------------------------------------------------------------- moves
    def move(self, dlsub_id: str) -> dict[str, Any] | None:
        rows = list(self.db["moves"].rows_where("dlsub_id = ?", [dlsub_id]))
        return rows[0] if rows else None

    def moves(self) -> list[dict[str, Any]]:
        return list(self.db["moves"].rows)

    def start_move(self, row: dict[str, Any]) -> None:
        self.db["moves"].insert(row, pk="dlsub_id", replace=True, alter=True)

    def set_move(self, dlsub_id: str, **fields: Any) -> None:
        self.db["moves"].update(dlsub_id, fields, alter=True)

    def end_move(self, dlsub_id: str) -> None:
        self.db["moves"].delete_where("dlsub_id = ?", [dlsub_id])

    # ---------------------------------------------------------------- meta
    def set_meta(self, **values: Any) -> None:
        for key, value in values.items():
            self.db["meta"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    def meta(self) -> dict[str, Any]:
        if "meta" not in self.db.table_names():
            return {}
        return {r["key"]: json.loads(r["value"]) for r in self.db["meta"].rows}

