"""The user's dlsub jobs in SQLite (WAL; a rollback journal on a network file system): what Slurm does not keep.

On a file system whose locks one host takes the others do not see (sshfs; NFS mounted ``nolock`` or
``local_lock``), SQLite's own locks would not keep two login nodes' commands apart; there the store is opened
with SQLite's dot-file locking (its ``unix-dotfile`` VFS: a ``dlsub.db.lock`` directory, made by mkdir, which
the file server makes once for every host), and a lock left by a command killed mid-write is broken after
:data:`STALE_LOCK_S`.

Slurm is the source of truth for what runs; this store maps a dlsub job to
its Slurm job and remembers how it was asked for, that a user cancelled it,
and the last :class:`~dlsub.contract.JobState` ``dlsub status`` observed. It
refuses transitions the contract's model does not allow (a final state never
changes), so a job seen COMPLETED stays COMPLETED after Slurm forgets it.

A ``dlsub.db`` made before states were kept gains the columns on open.

Read and written through the standard library's ``sqlite3``; sqlite-utils makes the table, or adds the
columns an older dlsub's store lacks, and is imported only then: every ``dlsub`` command opens this store,
and sqlite-utils' import (with NumPy, which it loads when present) was half the CPU of a ``dlsub status``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlsub.contract import IllegalTransition, JobState, StateSource, check_transition
from dlsub.job.filesystems import locks_shared_between_hosts, mount_table, on_network_filesystem


@dataclass
class JobRecord:
    id: str
    name: str
    user: str
    script: str
    args: list[str]
    job_dir: str
    partition: str
    gpus_per_node: int
    nodes: int
    cpus: int
    mem_mb: int
    time_limit_min: int | None
    image: str
    slurm_job_id: int | None = None
    submitted_at: float = field(default_factory=time.time)
    cancelled_at: float | None = None
    state: str | None = None  # the last JobState observed (None: never observed)
    state_at: float | None = None
    # An elastic job's most members, its main job's nodes and its workers (None: fixed at ``nodes``). Named
    # max_nodes for the store's column and `dlsub submit --json`/`status --json`'s field, which users read.
    max_nodes: int | None = None
    worker_array_id: int | None = None  # its held worker array in Slurm
    worker_gpus: int | None = None  # GPUs of each worker (None: a node's, ``gpus_per_node``; elastic in nodes)
    # The site's and the user's extra mounts, as containers.mounts.Mount.to_json gives them.
    mounts: list[dict[str, Any]] = field(default_factory=list)
    # The image's ID at submit, which every attempt runs (None: a store made before it was kept).
    image_id: str | None = None

    @property
    def worker_tasks(self) -> int:
        """How many tasks its worker array has: one for each member it may add."""
        return self.max_nodes - self.nodes if self.max_nodes is not None else 0

    @property
    def gpus_per_worker(self) -> int:
        return self.worker_gpus or self.gpus_per_node

    @property
    def elastic_in_gpus(self) -> bool:
        return self.max_nodes is not None and self.worker_gpus is not None

    @property
    def gpu_range(self) -> tuple[int, int] | None:
        """A job elastic in GPUs: its fewest and most GPUs (None for any other job)."""
        if not self.elastic_in_gpus:
            return None
        low = self.nodes * self.gpus_per_node
        return low, low + self.worker_tasks * self.gpus_per_worker

    @property
    def elastic_range(self) -> str:
        """An elastic job's range as it asked for it: "1 to 4 GPUs" or "1 to 2 nodes" ("" when fixed)."""
        if self.max_nodes is None:
            return ""
        if self.gpu_range is not None:
            return f"{self.gpu_range[0]} to {self.gpu_range[1]} GPUs"
        return f"{self.nodes} to {self.max_nodes} nodes"

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["args"] = json.dumps(self.args)
        row["mounts"] = json.dumps(self.mounts)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobRecord:
        # Columns a newer dlsub added are left out: its store still reads after a downgrade.
        row = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        row["args"] = json.loads(row["args"])
        row["mounts"] = json.loads(row.get("mounts") or "[]")  # none in a store made before mounts were kept
        return cls(**row)


class UnknownJob(LookupError):
    pass


# Columns added since the first schema, with their types; added on open.
_ADDED_COLUMNS = {"state": str, "state_at": float, "max_nodes": int, "worker_array_id": int, "worker_gpus": int,
                  "mounts": str, "image_id": str}
_COLUMNS = {
    "id": str, "name": str, "user": str, "script": str, "args": str, "job_dir": str,
    "partition": str, "gpus_per_node": int, "nodes": int, "cpus": int, "mem_mb": int,
    "time_limit_min": int, "image": str, "slurm_job_id": int, "submitted_at": float,
    "cancelled_at": float, **_ADDED_COLUMNS,
}


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]


def _unknown(key: str) -> UnknownJob:
    return UnknownJob(f"no dlsub job {key!r} of yours; `dlsub status` lists them")


#: How old a dot-file lock must be to be taken for a command killed while it held it: every command holds it
#: for one statement, milliseconds.
STALE_LOCK_S = 30.0
#: How long a command waits for another's lock before it says the store is busy.
BUSY_WAIT_S = 10.0


def _break_stale_lock(lock: Path, now: float | None = None) -> bool:
    """Remove ``lock`` (SQLite's dot-file lock, a directory) when it is older than :data:`STALE_LOCK_S`; whether
    it did. Two commands breaking it at once: one removes it, the other finds it gone."""
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age <= STALE_LOCK_S:
        return False
    try:
        os.rmdir(lock)
    except FileNotFoundError:
        return False
    print(f"dlsub: removed {lock}, a lock on the job store left {age:.0f} s ago by a command that was killed",
          file=sys.stderr)
    return True


class JobStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = not path.exists()
        table = mount_table()  # read once: every dlsub command opens the store
        self.locking = "posix" if locks_shared_between_hosts(path.parent, table) else "dotfile"
        if self.locking == "dotfile":
            _break_stale_lock(path.with_name(path.name + ".lock"))
        self._uri = _uri(path, self.locking)
        self._conn = self._connect()
        if new:
            path.chmod(0o600)  # the user's own record of their jobs
        # WAL's shared memory is one host's: on a home that login nodes share over the network, two hosts'
        # commands would each see their own, and SQLite's documentation says WAL does not work there. The
        # rollback journal uses the file system's locks (NFS's lock manager), which hosts do share.
        self.journal = "delete" if on_network_filesystem(path.parent, table) else "wal"
        self.conn.execute(f"PRAGMA journal_mode={self.journal}")
        have = {row[1] for row in self.conn.execute("PRAGMA table_info(jobs)")}
        if not have or not set(_ADDED_COLUMNS) <= have:
            self._make_table(have)

    def _connect(self) -> sqlite3.Connection:
        # Autocommit (isolation_level=None): each write is its own transaction, as sqlite-utils made them.
        return sqlite3.connect(self._uri, uri=True, isolation_level=None, timeout=BUSY_WAIT_S)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection for the next statement. Under dot-file locking, a new one each time: a network file
        system revalidates what its host caches of a file when it is opened (NFS's close-to-open; FUSE drops its
        page cache), and under POSIX locks SQLite's lock itself does (NFS's lock manager), but the dot-file lock
        is a directory, which makes no host read again; a statement on an old connection would read the pages
        it had, not another host's last write, and write over it (two login hosts' submits lost one)."""
        if self.locking == "dotfile":
            self._conn.close()
            self._conn = self._connect()
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def _make_table(self, have: set[str]) -> None:
        """Create the table (a new store) or add the columns a store made by an older dlsub lacks (its rows
        read as never observed)."""
        import sqlite_utils

        jobs = sqlite_utils.Database(self.conn).table("jobs")
        if not have:  # made whole: every column, the added ones among them
            jobs.create(_COLUMNS, pk="id", if_not_exists=True)
            jobs.create_index(["slurm_job_id"], if_not_exists=True)
            return
        for name, kind in _ADDED_COLUMNS.items():
            if name not in have:
                jobs.add_column(name, kind)

    def _row(self, job_id: str) -> dict[str, Any]:
        rows = _rows(self.conn.execute("SELECT * FROM jobs WHERE id = ?", [job_id]))
        if not rows:
            raise _unknown(job_id)
        return rows[0]

    def _set(self, job_id: str, fields: dict[str, Any]) -> None:
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"no such field of a job: {', '.join(sorted(unknown))}")
        names = list(fields)
        done = self.conn.execute(f"UPDATE jobs SET {', '.join(f'[{n}] = ?' for n in names)} WHERE id = ?",
                                 [*(fields[n] for n in names), job_id])
        if done.rowcount == 0:
            raise _unknown(job_id)

    def add(self, record: JobRecord) -> None:
        row = record.to_row()
        names = list(row)
        self.conn.execute(f"INSERT INTO jobs ({', '.join(f'[{n}]' for n in names)}) "
                          f"VALUES ({', '.join('?' for _ in names)})", [row[n] for n in names])

    def update(self, job_id: str, **fields: Any) -> None:
        if "state" in fields:
            raise ValueError("a job's state changes through observe(), which checks the transition")
        self._set(job_id, fields)

    def observe(self, job_id: str, state: JobState | str, now: float | None = None,
                source: StateSource = StateSource.CONTROLLER) -> JobState:
        """Record that the job was seen in ``state`` (by ``source``); raise IllegalTransition if that cannot
        follow the recorded state (:func:`dlsub.contract.check_transition`)."""
        current = self._row(job_id).get("state")
        new = check_transition(current, state, source)
        if current != new.value:
            self._set(job_id, {"state": new.value, "state_at": time.time() if now is None else now})
        return new

    def observed(self, job_id: str, state: JobState | str,
                 source: StateSource = StateSource.CONTROLLER) -> JobState:
        """What to show for a job seen in ``state`` (by ``source``): that, unless it cannot follow the
        recorded state (then the recorded one: an ended job is not shown UNKNOWN, nor a lagging record's)."""
        try:
            return self.observe(job_id, state, source=source)
        except IllegalTransition:
            return JobState(self._row(job_id)["state"])

    def remove(self, job_id: str) -> None:
        self.conn.execute("DELETE FROM jobs WHERE id = ?", [job_id])

    def all(self) -> list[JobRecord]:
        return [JobRecord.from_row(r) for r in _rows(self.conn.execute("SELECT * FROM jobs ORDER BY submitted_at"))]

    def get(self, key: str) -> JobRecord:
        """By dlsub id, a unique prefix of one, or a Slurm job id.

        A number is a Slurm job id (or a whole dlsub id that happens to be all digits), never a prefix: as a
        prefix, `dlsub cancel 904` for Slurm job 904 would reach the caller's unrelated job 904a1b2c.
        """
        key = key.strip()
        rows = _rows(self.conn.execute("SELECT * FROM jobs WHERE id = ?", [key]))
        if not rows and key.isdigit():
            rows = _rows(self.conn.execute("SELECT * FROM jobs WHERE slurm_job_id = ?", [int(key)]))
        elif not rows and key:
            rows = _rows(self.conn.execute("SELECT * FROM jobs WHERE id LIKE ?",
                                           [key.replace("%", "").replace("_", "") + "%"]))
        if len(rows) == 1:
            return JobRecord.from_row(rows[0])
        if len(rows) > 1:
            raise UnknownJob(f"{key!r} matches several jobs ({', '.join(r['id'] for r in rows)}); give more of the id")
        if key.isdigit():
            raise UnknownJob(f"no dlsub job of yours has Slurm job id {key} (a number is taken as a Slurm job id; "
                             "a dlsub id prefix needs a letter, or give the whole id); `dlsub status` lists them")
        raise _unknown(key)


def _uri(path: Path, locking: str) -> str:
    """The store's SQLite URI: the path quoted (spaces, ``?``, ``#``), and the dot-file VFS where the file
    system's locks are each host's own."""
    from urllib.parse import quote

    return f"file:{quote(str(path))}" + ("?vfs=unix-dotfile" if locking == "dotfile" else "")


def _select_jobs(uri: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(uri, uri=True, timeout=2)
    try:
        conn.row_factory = sqlite3.Row
        return conn.execute("select * from jobs order by submitted_at").fetchall()
    finally:
        conn.close()


def read_only_records(path: Path) -> list[JobRecord]:
    """Another user's job store, read without creating or changing anything (no WAL files of ours).

    A store in WAL mode whose last writer has closed it has no ``-shm`` file, and SQLite cannot read it
    read-only where it may not create one (a read-only mount, as the dashboard's unit makes the homes, or a
    directory the reader cannot write): "attempt to write a readonly database". Such a store holds all its
    commits in the main file, so it is read again as immutable (no WAL, no locks).
    """
    try:
        rows = _select_jobs(f"file:{path}?mode=ro")
    except sqlite3.OperationalError as exc:
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
        rows = _select_jobs(f"file:{path}?mode=ro&immutable=1")
    # sqlite3.Row iterates its values, not its keys; from_row leaves out the columns it does not know.
    return [JobRecord.from_row({k: r[k] for k in r.keys()}) for r in rows]  # noqa: SIM118
