"""What the dashboard shows, gathered with the CLI's own code and identity rules.

A viewer is the account the dashboard runs as, as for every ``dlsub``
command: its jobs are those in its own job store (``dlsub status``'s),
merged with Slurm's view by :func:`dlsub.job.status.job_status`. Root and
the policy's ``admins`` see every store they can read (each user's
``~/.dlsub/dlsub.db``, opened read-only). What the agent decided comes from
its query socket, which answers about the viewer's own jobs only
(``dlsub why``'s channel). Nothing here writes to another user's files.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsub.contract import (
    DLSUB_ID,
    EVENT_END,
    EVENT_PROGRESS,
    EVENT_START,
    PROGRESS_FILE,
    SIZE_EVENTS,
    JobState,
    output_file,
)
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask
from dlsub.job.output_files import tail, worker_output_files
from dlsub.job.settings import Settings, store_of
from dlsub.job.status import JobStatus, SlurmView
from dlsub.job.status_window import ended_at, fraction_done, is_ended
from dlsub.job.user_store import JobRecord, JobStore, UnknownJob, read_only_records
from dlsub.job_progress import read_attempts, read_events, summarize_progress
from dlsub.jobdir import check_progress_event
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.models import Partition, SlurmJob

#: Ask the agent's socket about this many jobs per page at most (one short request each).
MAX_WHY_JOBS = 25


@dataclass(frozen=True)
class Viewer:
    uid: int
    user: str
    admin: bool  # root or a policy admin: every job store this process can read

    @classmethod
    def current(cls, policy: AgentPolicy) -> Viewer:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(uid, name, uid == 0 or policy.is_admin(name))


@dataclass(frozen=True)
class JobOnPage:
    """One job as a page shows it."""

    status: JobStatus
    owner: str
    fraction: float | None  # of its declared total; None without one
    why: str = ""  # the agent's latest word on it, in plain words

    @property
    def percent(self) -> int | None:
        return None if self.fraction is None else int(round(self.fraction * 100))

    @property
    def live(self) -> bool:
        return not is_ended(self.status.state)


@dataclass
class JobDetail:
    view: JobOnPage
    record: JobRecord
    loss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # per attempt: (step, loss)
    throughput: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (step, samples or steps/s)
    throughput_unit: str = "samples/s"
    attempts: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    decisions_note: str = ""
    log_tail: str = ""
    worker_log_tails: list[tuple[str, str]] = field(default_factory=list)  # an elastic job's: (file name, end)


# ---------------------------------------------------------------- job stores


def other_stores(me: int) -> Iterable[tuple[str, Path]]:
    """(user, store path) of every account with a readable ``~/.dlsub/dlsub.db`` (for admins)."""
    for entry in pwd.getpwall():
        if entry.pw_uid == me:
            continue
        path = store_of(Path(entry.pw_dir))
        try:
            info = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == entry.pw_uid and os.access(path, os.R_OK):
            yield entry.pw_name, path


class Dashboard:
    """The dashboard's reads for one viewer; one per app."""

    def __init__(self, viewer: Viewer, settings: Settings, policy: AgentPolicy,
                 client_factory: Callable[[], SlurmClient] = SlurmClient,
                 stores: Callable[[int], Iterable[tuple[str, Path]]] = other_stores,
                 socket_path: Path | None = None) -> None:
        self.viewer = viewer
        self.settings = settings
        self.policy = policy
        self.client_factory = client_factory
        self.stores = stores
        # The agent: its socket on its own host, its agent_address (TCP, munge) from another login host.
        self.agent = AgentEndpoint(socket=socket_path) if socket_path else AgentEndpoint.of(policy)

    def _own_store(self) -> JobStore | None:
        if not self.settings.db_path.exists():
            return None
        return JobStore(self.settings.db_path)

    def records(self) -> list[tuple[JobRecord, str, JobStore | None]]:
        """(record, owner, the store to record observed states in: the viewer's own only)."""
        found: list[tuple[JobRecord, str, JobStore | None]] = []
        own = self._own_store()
        if own is not None:
            found += [(r, self.viewer.user, own) for r in own.all()]
        if self.viewer.admin:
            for user, path in self.stores(self.viewer.uid):
                try:
                    found += [(r, user, None) for r in read_only_records(path)]
                except (sqlite3.Error, OSError, TypeError, ValueError):
                    continue  # a store we cannot read is one user's jobs missing, not the page
        return found

    # ---------------------------------------------------------------- jobs
    def _slurm_view(self, records: list[JobRecord]) -> SlurmView:
        """One read of Slurm for these records, as `dlsub status` reads it; Slurm down: an empty view (the
        job directories still say a lot)."""
        try:
            return SlurmView.read(self.client_factory(), records)
        except SlurmError:
            return SlurmView()

    def _view(self, row: JobStatus, owner: str, why: str = "") -> JobOnPage:
        fraction = fraction_done(summarize_progress(Path(row.job_dir))) if row.state != "PENDING" else None
        return JobOnPage(row, owner, fraction, why)

    def jobs(self, since: float | None, with_why: bool = True) -> list[JobOnPage]:
        """The viewer's jobs alive or ended since ``since`` (all when None), newest first."""
        found = self.records()
        if since is not None:
            found = [(r, o, s) for r, o, s in found if not is_ended(r.state) or
                     max(r.state_at or 0.0, r.submitted_at) >= since]
        slurm = self._slurm_view([r for r, _, _ in found])
        views = []
        for record, owner, store in found:
            row = slurm.status(record, store)
            if since is not None and is_ended(row.state) and ended_at(record, read_attempts(Path(row.job_dir))) < since:
                continue
            views.append((row, owner))
        views.sort(key=lambda v: v[0].submitted_at, reverse=True)
        live = [row for row, _ in views if not is_ended(row.state)][:MAX_WHY_JOBS]
        whys = self._latest_whys(live) if with_why else {}
        return [self._view(row, owner, whys.get(row.id, "")) for row, owner in views]

    def find(self, job_id: str) -> tuple[JobRecord, str, JobStore | None] | None:
        """One of the viewer's jobs by its full dlsub id; None for anyone else's or no such job."""
        if not DLSUB_ID.match(job_id):
            return None
        own = self._own_store()
        if own is not None:
            try:
                record = own.get(job_id)
            except UnknownJob:
                pass
            else:
                if record.id == job_id:
                    return record, self.viewer.user, own
        if self.viewer.admin:
            for record, owner, store in self.records():
                if record.id == job_id:
                    return record, owner, store
        return None

    def job(self, job_id: str) -> JobDetail | None:
        found = self.find(job_id)
        if found is None:
            return None
        record, owner, store = found
        row = self._slurm_view([record]).status(record, store)
        job_dir = Path(record.job_dir)
        detail = JobDetail(self._view(row, owner), record)
        detail.loss, detail.throughput, detail.throughput_unit = curves(
            [e for raw in read_events(job_dir / PROGRESS_FILE) if (e := check_progress_event(raw)) is not None])
        detail.attempts = attempt_rows(read_attempts(job_dir), row, time.time())
        detail.decisions, detail.decisions_note = self.decisions(record)
        if detail.decisions:
            detail.view = dataclasses.replace(detail.view, why=plain_why(detail.decisions[-1]))
        detail.log_tail = tail(output_file(job_dir, record.slurm_job_id or 0))
        if record.worker_array_id is not None:
            detail.worker_log_tails = [(path.name, tail(path)) for _, path in
                                       worker_output_files(job_dir, record.worker_array_id, record.worker_tasks)]
        return detail

    # ---------------------------------------------------------------- the agent
    def decisions(self, record: JobRecord) -> tuple[list[dict[str, Any]], str]:
        """The agent's decisions about a job, through its socket; a note instead when it does not answer."""
        try:
            reply = ask(self.agent, {"op": "why", "dlsub_id": record.id}, timeout_s=3.0)
        except AgentUnavailable as exc:
            return [], f"the agent does not answer: {exc}"
        if not reply.get("ok"):
            return [], f"the agent answered: {reply.get('error')}"
        return [d for d in reply.get("decisions") or [] if isinstance(d, dict)], ""

    def _latest_whys(self, rows: list[JobStatus]) -> dict[str, str]:
        out: dict[str, str] = {}
        for row in rows:
            try:
                reply = ask(self.agent, {"op": "why", "dlsub_id": row.id}, timeout_s=2.0)
            except AgentUnavailable:
                return out  # the agent is down: say nothing rather than wait on every job
            found = [d for d in reply.get("decisions") or [] if isinstance(d, dict)] if reply.get("ok") else []
            if found:
                out[row.id] = plain_why(found[-1])
        return out

    def agent_status(self) -> dict[str, Any]:
        try:
            reply = ask(self.agent, {"op": "status"}, timeout_s=3.0)
        except AgentUnavailable as exc:
            return {"running": False, "error": str(exc)}
        status = reply.get("status")
        if not reply.get("ok") or not isinstance(status, dict):
            return {"running": False, "error": f"the agent answered: {reply.get('error')}"}
        return status

    # ---------------------------------------------------------------- the cluster
    def cluster(self) -> tuple[list[dict[str, Any]], str]:
        """Per partition: nodes and GPUs busy/idle/down, dlsub jobs waiting; an error text when Slurm fails."""
        client = self.client_factory()
        try:
            partitions = client.partitions()
            jobs = client.jobs()
        except SlurmError as exc:
            return [], str(exc)
        return partition_rows(partitions, jobs, self.policy), ""


# ---------------------------------------------------------------- pure helpers


def partition_rows(partitions: list[Partition], jobs: list[SlurmJob], policy: AgentPolicy) -> list[dict[str, Any]]:
    waiting: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in jobs:
        if job.dlsub_id is None:
            continue
        for part in job.partition.split(","):
            if job.state == "PENDING":
                waiting[part] = waiting.get(part, 0) + 1
            elif job.state == "RUNNING":
                running[part] = running.get(part, 0) + 1
    rows = []
    for p in partitions:
        usable = [n for n in p.nodes if n.usable]
        rows.append({
            "name": p.name, "up": p.up, "role": policy.role_of(p.name) or "-",
            "nodes": len(p.nodes), "nodes_down": len(p.nodes) - len(usable),
            "nodes_busy": sum(1 for n in usable if n.alloc_cpus or n.gpus_used),
            "nodes_idle": sum(1 for n in usable if not (n.alloc_cpus or n.gpus_used)),
            "gpus": sum(n.gpus for n in p.nodes),
            "gpus_busy": sum(min(n.gpus, n.gpus_used) for n in usable),
            "gpus_idle": sum(n.idle_gpus for n in usable),
            "dlsub_waiting": waiting.get(p.name, 0), "dlsub_running": running.get(p.name, 0),
            "node_names": ", ".join(n.name for n in p.nodes),
        })
    return rows


def curves(events: list[dict[str, Any]]) -> tuple[dict[str, list[tuple[float, float]]],
                                                 dict[str, list[tuple[float, float]]], str]:
    """Loss and throughput over steps, one series per attempt and, within one, per size of an elastic
    job's group (a move starts a new attempt; a resize restarts the training at another world size)."""
    loss: dict[str, list[tuple[float, float]]] = {}
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    size: dict[str, Any] = {}
    sizes = {e.get("world_size") for e in events if e["event"] in SIZE_EVENTS and e.get("world_size")}
    for e in events:
        if e["event"] in SIZE_EVENTS:
            size[str(e.get("attempt") or "attempt")] = e.get("world_size")
        if e["event"] != EVENT_PROGRESS or e.get("step") is None:
            continue
        attempt = str(e.get("attempt") or "attempt")
        if len(sizes) > 1 and size.get(attempt):
            attempt = f"{attempt} (world size {size[attempt]})"
        by_attempt.setdefault(attempt, []).append(e)
        if e.get("loss") is not None:
            loss.setdefault(attempt, []).append((float(e["step"]), float(e["loss"])))
    use_samples = any(e.get("samples") is not None for es in by_attempt.values() for e in es)
    key = "samples" if use_samples else "step"
    throughput: dict[str, list[tuple[float, float]]] = {}
    for attempt, es in by_attempt.items():
        for a, b in zip(es, es[1:], strict=False):
            dt = float(b["time"]) - float(a["time"])
            if dt <= 0 or a.get(key) is None or b.get(key) is None:
                continue
            rate = (float(b[key]) - float(a[key])) / dt
            if rate >= 0:
                throughput.setdefault(attempt, []).append((float(b["step"]), rate))
    return loss, throughput, ("samples/s" if use_samples else "steps/s")


def attempt_rows(attempts: list[dict[str, Any]], row: JobStatus, now: float) -> list[dict[str, Any]]:
    """Each attempt: where it ran, when, how it ended (a move, a resume, or the end)."""
    out: list[dict[str, Any]] = []
    for a in attempts:
        if a.get("event") == EVENT_START:
            out.append({"n": len(out) + 1, "slurm_job_id": a.get("slurm_job_id"), "restart": a.get("restart"),
                        "partition": a.get("partition") or "?", "nodes": a.get("nodes") or a.get("node") or "",
                        "start": float(a["time"]), "end": None, "ended": ""})
        elif a.get("event") == EVENT_END:
            match = [o for o in out if o["restart"] == a.get("restart") and o["end"] is None]
            if match:
                action = a.get("action")
                match[-1]["end"] = float(a["time"])
                match[-1]["ended"] = ({"move": "moved", "requeue": "checkpointed, continued",
                                                "superseded": "superseded (the job ran on elsewhere)"}.get(str(action))
                                      or (f"exit {a.get('rc')}" if a.get("rc") is not None else "ended"))
    if out and out[-1]["end"] is None:
        if row.state == JobState.RUNNING.value:
            out[-1]["end"], out[-1]["ended"] = now, "running"
        else:
            out[-1]["end"] = out[-1]["start"]
    return out


_KIND_WORDS = {
    "wait": "waiting", "move": "moving to a GPU partition", "move-done": "moved",
    "move-abandoned": "move given up", "continue": "continuing in a new attempt before its time limit",
    "continue-done": "continued", "restart": "restarting on a GPU partition from scratch",
    "restart-done": "restarted from scratch", "restart-abandoned": "restart given up",
    "backfill": "backfilled onto idle nodes", "return": "returning from backfill",
    "error": "an action failed", "ignored": "ignored",
}


def plain_why(decision: dict[str, Any]) -> str:
    kind = str(decision.get("kind") or "")
    reason = str(decision.get("reason") or "")
    words = _KIND_WORDS.get(kind, kind.replace("-", " "))
    return f"{words}: {reason}" if reason else words


