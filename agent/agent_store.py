"""The agent's own state (SQLite, WAL on one host): what Slurm does not keep.

Every row about a job is keyed by ``(uid, slurm_job_id)``: the uid is
Slurm's ``user_id`` of the job, never anything its user wrote. Tables:

* ``bindings``: each dlsub id and the uid it was first seen with (its owner);
* ``jobs``: the Slurm jobs the agent follows, their one :class:`JobState`,
  the request it trusts (submit record or the tags first seen), and where
  reading the job's files stopped (``data``: a :class:`~dlsub.agent.job_data.JobData`, as JSON);
* ``attempts``: their Slurm attempts; ``progress``: samples;
* ``decisions``: every decision with its reason in plain words, and the uid
  it is about (who may read it);
* ``moves``: moves in flight, the write-ahead record that makes a move
  survive a crash, with Slurm's restart count when it was signalled;
* ``resizes``: the same for an elastic job's workers: a grow or shrink
  written before Slurm is asked, and each worker told to leave while it
  checkpoints with its group (the agent's ``leaving`` set, kept across a
  restart);
* ``meta``: the agent's own pid, last tick, what it is doing;
* ``lease``: with a pair of agents on one shared database (``[failover] shared_state``), which of them acts
  (:mod:`dlsub.agent.lease`). Such a database uses a rollback journal, not WAL: SQLite's WAL needs the
  readers' and the writer's shared memory on one host. Every write of a store opened with lease terms is
  fenced: it checks, in its own transaction, that the lease still carries this agent's token, and raises
  :class:`~dlsub.agent.lease.Deposed` (writing nothing) when it does not.

The tick writes once, in one transaction, and only rows that changed
(:class:`Writes`); a move's intent is written before its signal. The files
are created private (0600): users ask the agent through its socket.
A database written by the previous schema (keyed by dlsub id) is migrated
on open, moves in flight included.
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlsub.agent.job_data import JobData, TrustedRequest
from dlsub.agent.lease import Deposed, Holder, LeaseRow, LeaseTerms, may_take, next_token
from dlsub.agent.records import MOVE_COLUMNS, RESIZE_COLUMNS, MoveRow, ResizePhase, ResizeRow
from dlsub.agent.store_rows import Binding, Decision, JobRow, StoreSnapshot, Writes
from dlsub.contract import JobState
from dlsub.policies.actions.kinds import ActionKind

DEFAULT_DB = Path("/var/lib/dlsub/agent.db")
SCHEMA_VERSION = 2
#: Retention pruning runs at most this often.
PRUNE_EVERY_S = 3600.0


def default_db_path() -> Path:
    env = os.environ.get("DLSUB_AGENT_DB")
    return Path(env) if env else DEFAULT_DB


_DDL = """
CREATE TABLE IF NOT EXISTS bindings (
    dlsub_id TEXT PRIMARY KEY, uid INTEGER NOT NULL, slurm_job_id INTEGER, bound REAL,
    source TEXT NOT NULL DEFAULT 'comment');
CREATE TABLE IF NOT EXISTS jobs (
    uid INTEGER NOT NULL, slurm_job_id INTEGER NOT NULL, dlsub_id TEXT, user TEXT, state TEXT,
    data TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (uid, slurm_job_id));
CREATE TABLE IF NOT EXISTS attempts (
    uid INTEGER NOT NULL, slurm_job_id INTEGER NOT NULL, restart INTEGER NOT NULL, dlsub_id TEXT,
    partition TEXT, nodes TEXT, first_seen REAL, start_time REAL, state TEXT,
    PRIMARY KEY (uid, slurm_job_id, restart));
CREATE TABLE IF NOT EXISTS progress (
    uid INTEGER NOT NULL, slurm_job_id INTEGER NOT NULL, dlsub_id TEXT, time REAL, step INTEGER,
    eta_s REAL, steps_per_s REAL, checkpoint_step INTEGER, partition TEXT);
CREATE INDEX IF NOT EXISTS progress_job_time ON progress (uid, slurm_job_id, time);
CREATE INDEX IF NOT EXISTS progress_time ON progress (time);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY, time REAL, uid INTEGER, dlsub_id TEXT, slurm_job_id INTEGER, user TEXT,
    kind TEXT, reason TEXT, details TEXT);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time);
CREATE INDEX IF NOT EXISTS decisions_dlsub ON decisions (dlsub_id, time);
CREATE INDEX IF NOT EXISTS decisions_slurm ON decisions (slurm_job_id, time);
CREATE INDEX IF NOT EXISTS decisions_uid ON decisions (uid, time);
CREATE TABLE IF NOT EXISTS moves (
    uid INTEGER NOT NULL, slurm_job_id INTEGER NOT NULL, dlsub_id TEXT, kind TEXT, phase TEXT,
    target_partition TEXT, target_gpus INTEGER, since REAL, signals INTEGER, created REAL,
    time_limit_min INTEGER, restart_count INTEGER, target_gpu_type TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (uid, slurm_job_id));
CREATE TABLE IF NOT EXISTS resizes (
    worker TEXT PRIMARY KEY, uid INTEGER NOT NULL, dlsub_id TEXT, slurm_job_id INTEGER, kind TEXT, phase TEXT,
    since REAL, reason TEXT, partition TEXT, batch_size INTEGER, accumulation_steps INTEGER, node TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), host TEXT NOT NULL, pid INTEGER NOT NULL, instance TEXT NOT NULL,
    token INTEGER NOT NULL, renewed REAL NOT NULL, expires REAL NOT NULL);
"""
_LEASE_COLUMNS = ("host", "pid", "instance", "token", "renewed", "expires")

_ATTEMPT_COLUMNS = ("uid", "slurm_job_id", "restart", "dlsub_id", "partition", "nodes", "first_seen", "start_time",
                    "state")
_PROGRESS_COLUMNS = ("uid", "slurm_job_id", "dlsub_id", "time", "step", "eta_s", "steps_per_s", "checkpoint_step",
                     "partition")


def _state(value: str | None) -> JobState | None:
    """A stored job state (None: never seen in Slurm); a value no JobState has reads as UNKNOWN."""
    if value is None:
        return None
    try:
        return JobState(value)
    except ValueError:
        return JobState.UNKNOWN


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only view of the database, for another thread or process of the service account.

    While the agent runs, its WAL index (``-shm``) exists and a read-only
    connection shares it. When no agent is connected SQLite has removed
    that file, a reader without write access cannot recreate it, and the
    database (fully checkpointed then) is read as immutable instead.

    Whoever may write the file (the service account, root) opens it
    read-write and only reads: a tick process that exited without closing
    leaves its newest rows in the WAL, and a read-only connection that
    cannot use the WAL index would fall back to the main file and miss them.
    """
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        return sqlite3.connect(str(path), timeout=10, check_same_thread=False)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, check_same_thread=False)
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
    if Path(f"{path}-wal").exists() and Path(f"{path}-wal").stat().st_size > 0:
        raise sqlite3.OperationalError(f"{path}: its newest rows are in a WAL this account cannot read")
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)


def _uid_of_user(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, TypeError):
        return None


class AgentStore:
    """The agent's database. ``terms``: the lease terms of a database two login hosts share (None: one host's
    own database, no lease, WAL)."""

    def __init__(self, path: Path, *, readonly: bool = False,
                 uid_of: Callable[[str], int | None] = _uid_of_user, terms: LeaseTerms | None = None) -> None:
        self.path = path
        self.readonly = readonly
        self.terms = terms
        # The lease as this store holds it: its token (None: not held) and when it runs out by our clock.
        self.token: int | None = None
        self.held_until = 0.0
        if readonly:
            if not path.exists():
                raise FileNotFoundError(path)
            self.conn = _open_readonly(path)
            self.conn.row_factory = sqlite3.Row
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Private from the start: SQLite gives -wal and -shm the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
        # The scheduler ticks in a worker thread (one at a time).
        self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        if terms is None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        else:  # WAL's shared memory does not reach the other host: a rollback journal, synced at each commit
            self.conn.execute("PRAGMA journal_mode=DELETE")
            self.conn.execute("PRAGMA synchronous=FULL")
        self._migrate(uid_of)

    # ---------------------------------------------------------------- schema
    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("select name from sqlite_master where type = 'table'")}

    def _columns(self, table: str) -> set[str]:
        return {r[1] for r in self.conn.execute(f'pragma table_info("{table}")')}

    def _migrate(self, uid_of: Callable[[str], int | None]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = self._tables()
            v1 = "jobs" in tables and "uid" not in self._columns("jobs")
            if v1:
                for name in ("jobs", "attempts", "progress", "decisions", "moves"):
                    if name in tables:
                        conn.execute(f'ALTER TABLE "{name}" RENAME TO "v1_{name}"')
                for index in ("idx_progress_dlsub_id_time", "idx_decisions_dlsub_id_time"):
                    conn.execute(f'DROP INDEX IF EXISTS "{index}"')
            for statement in _DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if "source" not in self._columns("bindings"):  # a v2 database from before claims had a source
                conn.execute("ALTER TABLE bindings ADD COLUMN source TEXT NOT NULL DEFAULT 'comment'")
            if "node" not in self._columns("resizes"):  # from before grows were pinned to a node
                conn.execute("ALTER TABLE resizes ADD COLUMN node TEXT")
            if "target_gpu_type" not in self._columns("moves"):  # from before moves between GPU kinds
                conn.execute("ALTER TABLE moves ADD COLUMN target_gpu_type TEXT NOT NULL DEFAULT ''")
            if v1:
                self._copy_v1(uid_of)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _copy_v1(self, uid_of: Callable[[str], int | None]) -> None:
        """Rows of the schema keyed by dlsub id, re-keyed by (uid, Slurm job id).

        The uid comes from the user name the old agent recorded (Slurm's own);
        rows whose user no longer resolves are dropped. Moves keep their
        phase; Slurm's restart count at their signal is unknown, and is
        adopted from what Slurm shows when the agent first sees the job again.
        """
        conn = self.conn
        tables = self._tables()
        owners: dict[str, tuple[int, int]] = {}
        for r in conn.execute("select * from v1_jobs").fetchall():
            uid = uid_of(r["user"] or "")
            if uid is None or r["slurm_job_id"] is None:
                continue
            owners[r["dlsub_id"]] = (uid, int(r["slurm_job_id"]))
            state = JobState.from_slurm(r["last_state"] or "")
            data = JobData(
                request=TrustedRequest("migrated", "", r["mode"], r["ideal_partition"], int(r["gpus_wanted"] or 0),
                                       r["backfilled_from"] or r["last_partition"], r["backfilled_limit_min"]),
                job_dir=r["job_dir"], job_dir_fixed=True, continuations=int(r["continuations"] or 0),
                backfilled_from=r["backfilled_from"], backfilled_limit_min=r["backfilled_limit_min"],
                last_note=r["last_note"], partition=r["last_partition"])
            conn.execute("insert or ignore into jobs (uid, slurm_job_id, dlsub_id, user, state, data) "
                         "values (?, ?, ?, ?, ?, ?)",
                         (uid, int(r["slurm_job_id"]), r["dlsub_id"], r["user"], state.value, data.to_json()))
            conn.execute("insert or ignore into bindings (dlsub_id, uid, slurm_job_id, bound) values (?, ?, ?, ?)",
                         (r["dlsub_id"], uid, int(r["slurm_job_id"]), r["first_seen"]))
        if "v1_moves" in tables:
            for r in conn.execute("select * from v1_moves").fetchall():
                if r["dlsub_id"] not in owners:
                    continue
                uid, _ = owners[r["dlsub_id"]]
                conn.execute(f"insert or replace into moves ({', '.join(MOVE_COLUMNS)}) values "
                             f"({', '.join('?' * len(MOVE_COLUMNS))})",
                             (uid, r["slurm_job_id"], r["dlsub_id"], r["kind"], r["phase"], r["target_partition"],
                              r["target_gpus"], r["since"], r["signals"], r["created"], r["time_limit_min"], None,
                              ""))
        if "v1_attempts" in tables:
            for r in conn.execute("select * from v1_attempts").fetchall():
                if r["dlsub_id"] in owners:
                    conn.execute("insert or ignore into attempts values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (owners[r["dlsub_id"]][0], r["slurm_job_id"], r["restart"], r["dlsub_id"],
                                  r["partition"], r["nodes"], r["first_seen"], r["start_time"], r["state"]))
        if "v1_progress" in tables:
            for r in conn.execute("select * from v1_progress").fetchall():
                if r["dlsub_id"] in owners:
                    uid, sjid = owners[r["dlsub_id"]]
                    conn.execute("insert into progress values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (uid, sjid, r["dlsub_id"], r["time"], r["step"], r["eta_s"], r["steps_per_s"],
                                  r["checkpoint_step"], r["partition"]))
        if "v1_decisions" in tables:
            for r in conn.execute("select * from v1_decisions order by id").fetchall():
                conn.execute("insert into decisions (time, uid, dlsub_id, slurm_job_id, user, kind, reason, details) "
                             "values (?, ?, ?, ?, ?, ?, ?, ?)",
                             (r["time"], uid_of(r["user"] or ""), r["dlsub_id"], r["slurm_job_id"], r["user"],
                              r["kind"], r["reason"], r["details"]))
        for name in ("jobs", "attempts", "progress", "decisions", "moves"):
            conn.execute(f'DROP TABLE IF EXISTS "v1_{name}"')

    # ---------------------------------------------------------------- reads
    def snapshot(self) -> StoreSnapshot:
        """What a tick reads, in one read transaction (a consistent view: the query server's writes between
        two of the reads cannot tear it)."""
        self.conn.execute("BEGIN")
        try:
            return StoreSnapshot(self.jobs(), self.bindings(), self.move_rows(), self.resizes())
        finally:
            self.conn.execute("COMMIT")

    def jobs(self) -> dict[tuple[int, int], JobRow]:
        rows = {}
        for r in self.conn.execute("select uid, slurm_job_id, dlsub_id, user, state, data from jobs"):
            row = JobRow(int(r["uid"]), int(r["slurm_job_id"]), r["dlsub_id"] or "", r["user"] or "",
                         _state(r["state"]), JobData.from_json(r["data"]))
            rows[row.key()] = row
        return rows

    def job(self, uid: int, slurm_job_id: int) -> JobRow | None:
        return self.jobs().get((uid, slurm_job_id))

    def bindings(self) -> dict[str, Binding]:
        """Each dlsub id's owner, and whether a submit record (not just a comment) says so."""
        return {r["dlsub_id"]: Binding(int(r["uid"]), str(r["source"]))
                for r in self.conn.execute("select dlsub_id, uid, source from bindings")}

    def move(self, uid: int, slurm_job_id: int) -> dict[str, Any] | None:
        rows = self.conn.execute("select * from moves where uid = ? and slurm_job_id = ?",
                                 (uid, slurm_job_id)).fetchall()
        return dict(rows[0]) if rows else None

    def moves(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("select * from moves order by created, slurm_job_id")]

    def move_rows(self) -> dict[tuple[int, int], MoveRow]:
        """The moves in flight as the agent works on them, by (uid, Slurm job id); a row that does not parse
        is left out (it is kept in the table: nothing here deletes it)."""
        out = {}
        for m in self.moves():
            try:
                row = MoveRow.from_dict(m)
            except (KeyError, TypeError, ValueError):
                continue
            out[row.key()] = row
        return out

    def resizes(self) -> dict[str, ResizeRow]:
        """The resizes in flight, by worker handle (a row that does not parse is dropped: it is only a hint)."""
        out = {}
        for r in self.conn.execute(f"select {', '.join(RESIZE_COLUMNS)} from resizes order by since, worker"):
            try:
                row = ResizeRow(**{**dict(r), "kind": ActionKind(r["kind"]), "phase": ResizePhase(r["phase"])})
            except (TypeError, ValueError):
                continue
            out[row.worker] = row
        return out

    def decisions(self, dlsub_id: str | None = None, slurm_job_id: int | None = None,
                  uid: int | None = None) -> list[Decision]:
        where, args = [], []
        for column, value in (("dlsub_id", dlsub_id), ("slurm_job_id", slurm_job_id), ("uid", uid)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "select * from decisions" + (" where " + " and ".join(where) if where else "") + " order by time, id"
        out = []
        for r in self.conn.execute(sql, args):
            try:
                details = json.loads(r["details"] or "{}")
            except ValueError:
                details = {}
            out.append(Decision(r["time"], r["uid"], r["dlsub_id"] or "", r["slurm_job_id"], r["user"] or "",
                                r["kind"], r["reason"], details if isinstance(details, dict) else {}))
        return out

    def progress(self, uid: int, slurm_job_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(
            "select * from progress where uid = ? and slurm_job_id = ? order by time", (uid, slurm_job_id))]

    def meta(self) -> dict[str, Any]:
        if "meta" not in self._tables():
            return {}
        out = {}
        for r in self.conn.execute("select key, value from meta"):
            try:
                out[r["key"]] = json.loads(r["value"])
            except (TypeError, ValueError):
                out[r["key"]] = r["value"]
        return out

    # ---------------------------------------------------------------- the lease (a shared database only)
    def lease(self) -> LeaseRow | None:
        """The lease as the database holds it now (None: never taken, or a database of one host)."""
        if "lease" not in self._tables():
            return None
        r = self.conn.execute(f"select {', '.join(_LEASE_COLUMNS)} from lease where id = 1").fetchone()
        return LeaseRow(str(r[0]), int(r[1]), str(r[2]), int(r[3]), float(r[4]), float(r[5])) if r else None

    def holds_lease(self) -> bool:
        """Whether this store may write: it holds the lease, or there is none (a database of one host)."""
        return self.terms is None or self.token is not None

    def take_lease(self, me: Holder, now: float) -> LeaseRow | None:
        """Take (or keep) the lease when :func:`~dlsub.agent.lease.may_take` allows: the lease now held, or None
        when another agent holds it."""
        terms = self._terms()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # the read and the write as one: two takers are serialised here
        try:
            row = self.lease()
            if not may_take(row, me, now):
                conn.execute("COMMIT")
                self.token = None
                return None
            taken = LeaseRow(me.host, me.pid, me.instance, next_token(row, me, now), now, now + terms.lease_s)
            conn.execute(f"insert or replace into lease (id, {', '.join(_LEASE_COLUMNS)}) values (1, ?, ?, ?, ?, ?, ?)",
                         (taken.host, taken.pid, taken.instance, taken.token, taken.renewed, taken.expires))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.token, self.held_until = taken.token, taken.expires
        return taken

    def renew_lease(self, now: float) -> None:
        """Extend the lease held to ``now + lease_s``; :class:`Deposed` (nothing written) when it is no longer
        ours. Nothing to do on a database of one host."""
        if self.terms is None:
            return
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._fence()
            conn.execute("update lease set renewed = ?, expires = ? where id = 1", (now, now + self.terms.lease_s))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.held_until = now + self.terms.lease_s

    def check_lease(self, now: float) -> None:
        """Before a Slurm call: :class:`Deposed` unless the lease is ours and has more than its margin left by
        our clock (a holder whose renewals failed stops acting before a standby may take over)."""
        if self.terms is None:
            return
        if self.token is not None and now > self.held_until - self.terms.margin_s:
            self.token = None
            raise Deposed(f"the lease runs out at {self.held_until:.0f}, in less than {self.terms.margin_s:g} s "
                          "(it was not renewed: Slurm or the shared database did not answer)")
        self._fence()

    def release_lease(self, now: float) -> None:
        """Give the lease up (a clean stop): it runs out now, so the standby takes over at its next try."""
        if self.terms is None or self.token is None:
            return
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("update lease set expires = ? where id = 1 and token = ? and expires > ?", (now, self.token,
                                                                                                    now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.token = None

    def _terms(self) -> LeaseTerms:
        if self.terms is None:
            raise ValueError(f"{self.path} is one host's database: it has no lease ([failover] shared_state)")
        return self.terms

    def _fence(self) -> None:
        """Inside a write transaction: :class:`Deposed` unless the lease still carries this store's token."""
        if self.terms is None:
            return
        if self.token is None:
            raise Deposed(f"this agent does not hold the lease on {self.path}")
        row = self.lease()
        if row is None or row.token != self.token:
            mine, self.token = self.token, None
            holder = f"{row.host} (pid {row.pid}, token {row.token})" if row else "nobody"
            raise Deposed(f"deposed: the lease on {self.path} is held by {holder}, not by this agent (token {mine})")

    # ---------------------------------------------------------------- writes
    def set_meta(self, **values: Any) -> None:
        self.write(Writes(meta=values))

    def write(self, writes: Writes) -> None:
        """Commit ``writes`` in one transaction."""
        if not writes:
            return
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._fence()
            for b in writes.bindings:
                conn.execute("insert or replace into bindings (dlsub_id, uid, slurm_job_id, bound, source) "
                             "values (?, ?, ?, ?, ?)", (b.dlsub_id, b.uid, b.slurm_job_id, b.when, b.source))
            conn.executemany(
                "insert into jobs (uid, slurm_job_id, dlsub_id, user, state, data) values (?, ?, ?, ?, ?, ?) "
                "on conflict (uid, slurm_job_id) do update set dlsub_id = excluded.dlsub_id, user = excluded.user, "
                "state = excluded.state, data = excluded.data",
                [(r.uid, r.slurm_job_id, r.dlsub_id, r.user, r.state, r.encoded()) for r in writes.jobs.values()])
            conn.executemany(
                f"insert or ignore into attempts ({', '.join(_ATTEMPT_COLUMNS)}) "
                f"values ({', '.join('?' * len(_ATTEMPT_COLUMNS))})",
                [tuple(a.get(c) for c in _ATTEMPT_COLUMNS) for a in writes.attempts])
            conn.executemany(
                f"insert into progress ({', '.join(_PROGRESS_COLUMNS)}) "
                f"values ({', '.join('?' * len(_PROGRESS_COLUMNS))})",
                [tuple(p.get(c) for c in _PROGRESS_COLUMNS) for p in writes.progress])
            for key in writes.ended_moves:
                conn.execute("delete from moves where uid = ? and slurm_job_id = ?", key)
            conn.executemany(
                f"insert or replace into moves ({', '.join(MOVE_COLUMNS)}) "
                f"values ({', '.join('?' * len(MOVE_COLUMNS))})",
                [tuple(m.as_dict()[c] for c in MOVE_COLUMNS) for m in writes.moves.values()])
            conn.executemany("delete from resizes where worker = ?", [(w,) for w in writes.ended_resizes])
            conn.executemany(
                f"insert or replace into resizes ({', '.join(RESIZE_COLUMNS)}) "
                f"values ({', '.join('?' * len(RESIZE_COLUMNS))})",
                [tuple(r.phase.value if c == "phase" else getattr(r, c) for c in RESIZE_COLUMNS)
                 for r in writes.resizes.values()])
            conn.executemany(
                "insert into decisions (time, uid, dlsub_id, slurm_job_id, user, kind, reason, details) "
                "values (?, ?, ?, ?, ?, ?, ?, ?)",
                [(d.time, d.uid, d.dlsub_id, d.slurm_job_id, d.user, d.kind, d.reason,
                  json.dumps(d.details, default=str)) for d in writes.decisions])
            conn.executemany("insert or replace into meta (key, value) values (?, ?)",
                             [(k, json.dumps(v, default=str)) for k, v in writes.meta.items()])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def prune(self, now: float, progress_days: float, decisions_days: float) -> bool:
        """Drop progress samples and decisions past their retention; at most once an hour. True if it ran."""
        last = self.meta().get("last_prune")
        if isinstance(last, (int, float)) and now - last < PRUNE_EVERY_S:
            return False
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._fence()
            conn.execute("delete from progress where time < ?", (now - progress_days * 86400.0,))
            conn.execute("delete from decisions where time < ?", (now - decisions_days * 86400.0,))
            conn.execute("insert or replace into meta (key, value) values ('last_prune', ?)", (json.dumps(now),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return True

    def forget(self, keys: Iterable[tuple[int, int]]) -> None:
        """Drop job rows the agent no longer needs (Slurm has forgotten the job and no move is in flight)."""
        keys = list(keys)
        if keys:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self._fence()
                self.conn.executemany("delete from jobs where uid = ? and slurm_job_id = ?", keys)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise


__all__ = ["AgentStore", "default_db_path"]
