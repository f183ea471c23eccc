"""What ``dlsub status`` shows: Slurm's view and the job directory's, merged (pure)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlsub.contract import (
    ACTION_MOVE,
    ACTION_NEEDS_GPU,
    ACTION_REQUEUE,
    ACTION_SUPERSEDED,
    EVENT_END,
    EVENT_START,
    SIZE_EVENTS,
    JobState,
    StateSource,
    output_file,
)
from dlsub.job.output_files import tail
from dlsub.job.status_extra import job_extra
from dlsub.job.user_store import JobRecord, JobStore
from dlsub.job_progress import Progress, read_attempts, read_progress_events, summarize_progress
from dlsub.slurm_plugins.models import SlurmJob, expand_nodes

if TYPE_CHECKING:
    from dlsub.slurm_plugins.client import SlurmClient


@dataclass(frozen=True)
class JobStatus:
    id: str
    slurm_job_id: int | None
    name: str
    state: str
    partition: str
    nodes: str
    step: int | None
    epoch: float | None
    loss: float | None
    samples_per_s: float | None
    steps_per_s: float | None
    eta_s: float | None
    attempts: int
    last_checkpoint_step: int | None
    reason: str
    job_dir: str
    submitted_at: float
    # Cost so far and the loss-curve ETA (dlsub.job.status_extra).
    node_hours: float | None = None
    cost: float | None = None
    target_loss: float | None = None
    target_step: int | None = None
    loss_eta_s: float | None = None
    eta_confidence: float | None = None
    # A gang's size now (training processes), every node it runs on (the main
    # job's and its running workers'), an elastic job's range, and each time
    # its training started at another size than before.
    world_size: int | None = None
    node_list: tuple[str, ...] = ()
    min_nodes: int | None = None
    max_nodes: int | None = None
    resizes: tuple[dict[str, Any], ...] = ()
    # A job elastic in GPUs (--gpus MIN:MAX): its range in GPUs (None otherwise).
    min_gpus: int | None = None
    max_gpus: int | None = None
    # What the container sees besides its own directories: the site's shared file systems and the user's
    # --mount/--mount-rw paths ({"path", "source", "read_only", "origin"}).
    mounts: tuple[dict[str, Any], ...] = ()
    # Whether its training uses dlsub's library: it wrote the library's start event (checkpointing.init()).
    # False once an attempt has run PLAIN_GRACE_S without one (a script that uses no library: it never
    # checkpoints); None while that is not known yet.
    uses_library: bool | None = None
    # The type of the GPUs its newest attempt runs (or ran) on, as Slurm's GRES names it (gpu:a100:4 -> "a100";
    # several, comma-separated); None on CPU nodes and untyped GPUs.
    gpu_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: How long an attempt may run before its missing start event means a script that uses no library (the
#: agent's [moves] plain_grace_s says when it acts on that; this is only what ``dlsub status`` says).
PLAIN_GRACE_S = 120.0

#: What ``dlsub status`` says under its table about a job whose script uses no library.
PLAIN_NOTE = ("note: its script uses no dlsub library (no start event from checkpointing.init()): it never "
              "checkpoints, so a move to its GPUs, a continuation past a time limit or a resize starts it from "
              "scratch (`dlsub why` says what the agent does with it)")


def _uses_library(starts: list[dict[str, Any]], slurm: SlurmJob | None, ran: bool, now: float) -> bool | None:
    """True: its training wrote a start event; False: an attempt ran PLAIN_GRACE_S (or ended) without one."""
    if starts:
        return True
    if slurm is not None and slurm.state == "RUNNING" and slurm.start_time:
        return False if now - slurm.start_time >= PLAIN_GRACE_S else None
    return False if ran else None


def _state_without_slurm(record: JobRecord, attempts: list[dict[str, Any]], progress: Progress) -> JobState:
    """Slurm has forgotten the job (MinJobAge passed): read the job directory's record."""
    if record.cancelled_at:
        return JobState.CANCELLED
    # A superseded attempt's end may come last (its node came back after the newer attempt ended): not the job's.
    ends = [a for a in attempts if a.get("event") == EVENT_END and a.get("action") != ACTION_SUPERSEDED]
    if ends:
        last = ends[-1]
        if last.get("rc") == 0:
            return JobState.COMPLETED
        if last.get("action") not in (ACTION_REQUEUE, ACTION_MOVE, ACTION_NEEDS_GPU):
            return JobState.FAILED
    if progress.finished:
        return JobState.COMPLETED
    return JobState.UNKNOWN


#: How a line of dlsub's own that says why a job could not start or run begins (the batch script's checks and
#: the launcher's, on the job's stderr, which Slurm writes into the job's output file).
ERROR_PREFIX = "dlsub: error: "
#: How much of the output file's end is read for it, and how much of the line is shown.
ERROR_TAIL_BYTES = 64 * 1024
ERROR_SHOWN_CHARS = 400


def launcher_error(job_dir: Path, slurm_job_id: int | None) -> str:
    """The last ``dlsub: error: ...`` line in the job's output file (its end only, read as the dashboard reads
    it: no link followed, a regular file only), without the prefix and without control characters; "" where
    there is none. The file is the user's own job's: what it says is shown only to them."""
    if slurm_job_id is None:
        return ""
    end = tail(output_file(job_dir, slurm_job_id), ERROR_TAIL_BYTES)
    said = [line[len(ERROR_PREFIX):] for line in end.splitlines() if line.startswith(ERROR_PREFIX)]
    if not said:
        return ""
    return "".join(c for c in said[-1] if c.isprintable()).strip()[:ERROR_SHOWN_CHARS]


def out_of_memory_reason(mem_mb: int) -> str:
    """What to tell a user whose job Slurm stopped for going past its memory (task/cgroup's limit)."""
    return (f"out of memory: the job used more than the {mem_mb} MB it asked for (--mem), and Slurm stopped it; "
            f"resubmit with a larger --mem (e.g. --mem {math.ceil(2 * mem_mb / 1024)}G), or `dlsub estimate` it")


def resize_history(starts: list[dict[str, Any]]) -> tuple[int | None, tuple[dict[str, Any], ...]]:
    """The world size of the last training start (or re-formation in process), and every one at another size
    than the one before."""
    sized = [e for e in starts if e.get("world_size")]
    history = []
    for before, after in zip(sized, sized[1:], strict=False):
        if after["world_size"] != before["world_size"] or after.get("nodes") != before.get("nodes"):
            history.append({"time": after["time"], "world_size": after["world_size"], "nodes": after.get("nodes"),
                            "from_world_size": before["world_size"], "from_nodes": before.get("nodes")})
    return (sized[-1]["world_size"] if sized else None), tuple(history)


def gpu_type_of(attempts: list[dict[str, Any]]) -> str | None:
    """The GPU types of the newest attempt: its main job's start record's and those of workers started since."""
    starts = [a for a in attempts if a.get("event") == EVENT_START]
    mains = [a for a in starts if a.get("role", "main") == "main"]
    if not mains:
        return None
    since = mains[-1]["time"]  # checked records (read_attempts): every time is a number
    types: list[str] = []
    for start in starts:
        if start["time"] >= since:
            types += [t for t in str(start.get("gpu_type") or "").split(",") if t and t not in types]
    return ",".join(types) or None


def job_status(record: JobRecord, slurm: SlurmJob | None, workers: list[SlurmJob] | None = None) -> JobStatus:
    """``workers``: Slurm's view of an elastic job's worker tasks (its nodes count as the job's)."""
    job_dir = Path(record.job_dir)
    progress = summarize_progress(job_dir)
    attempts = read_attempts(job_dir)
    started = {(a.get("slurm_job_id"), a.get("restart")) for a in attempts
               if a.get("event") == EVENT_START and a.get("role", "main") == "main"}
    if slurm is not None:
        state = JobState.from_slurm(slurm.state)
        if record.cancelled_at and state in (JobState.CANCELLED, JobState.FAILED, JobState.UNKNOWN):
            state = JobState.CANCELLED
        partition, nodes, reason = slurm.partition, slurm.nodes, slurm.reason
        attempt_count = max(len(started), slurm.restart_count + (1 if state == JobState.RUNNING else 0))
    else:
        state = _state_without_slurm(record, attempts, progress)
        last_start = [a for a in attempts if a.get("event") == EVENT_START][-1:]
        partition = last_start[0].get("partition", record.partition) if last_start else record.partition
        nodes = last_start[0].get("node", "") if last_start else ""
        reason = "" if state != JobState.UNKNOWN else "Slurm no longer lists the job and it left no end record"
        attempt_count = len(started)
    if state == JobState.RUNNING and reason == "None":
        reason = ""
    if slurm is not None and slurm.state == "OUT_OF_MEMORY":
        reason = out_of_memory_reason(record.mem_mb)
    elif state == JobState.FAILED:
        # Slurm says only "NonZeroExitCode"; dlsub's own checks said why (dlsub's installation missing on the
        # node, its package gone after an uninstall, an image that cannot run): the user is told that.
        reason = launcher_error(job_dir, record.slurm_job_id) or reason
    eta = progress.eta_s() if state in (JobState.RUNNING, JobState.COMPLETED) else None
    if state == JobState.RUNNING and eta is not None and progress.last_time:
        # The last report is a little old by now; count that time as done.
        eta = max(0.0, eta - max(0.0, time.time() - progress.last_time))
    extra = job_extra(job_dir, attempts, record.nodes, progress.steps_per_s)
    training_starts = [e for e in read_progress_events(job_dir) if e["event"] in SIZE_EVENTS]
    world_size, resizes = resize_history(training_starts)
    # An attempt that ended (its batch script's end record) ran long enough to have said it started.
    ended = any(a.get("event") == EVENT_END for a in attempts)
    uses_library = _uses_library(training_starts, slurm, ended, time.time())
    running = [nodes] if state == JobState.RUNNING else []
    running += [w.nodes for w in workers or () if w.state == "RUNNING"]
    node_list = []
    for hostlist in running:
        try:
            node_list += expand_nodes(hostlist)
        except ValueError:
            node_list.append(hostlist)  # shown as Slurm gave it
    return JobStatus(
        id=record.id,
        slurm_job_id=record.slurm_job_id,
        name=record.name,
        state=state.value,
        partition=partition,
        nodes=nodes,
        step=progress.step,
        epoch=progress.epoch,
        loss=progress.loss,
        samples_per_s=round(progress.samples_per_s, 2) if progress.samples_per_s else None,
        steps_per_s=round(progress.steps_per_s, 3) if progress.steps_per_s else None,
        eta_s=round(eta, 1) if eta is not None else None,
        attempts=attempt_count,
        last_checkpoint_step=progress.last_checkpoint_step,
        reason=reason,
        job_dir=record.job_dir,
        submitted_at=record.submitted_at,
        node_hours=extra.node_hours,
        cost=extra.cost,
        target_loss=extra.target_loss,
        target_step=extra.target_step,
        loss_eta_s=extra.loss_eta_s if state == JobState.RUNNING else None,
        eta_confidence=extra.eta_confidence,
        world_size=world_size,
        node_list=tuple(node_list),
        min_nodes=record.nodes,
        max_nodes=record.max_nodes,
        resizes=resizes,
        min_gpus=record.gpu_range[0] if record.gpu_range else None,
        max_gpus=record.gpu_range[1] if record.gpu_range else None,
        mounts=tuple(record.mounts),
        uses_library=uses_library,
        gpu_type=gpu_type_of(attempts),
    )


@dataclass(frozen=True)
class SlurmView:
    """What Slurm says of some of a user's jobs, read once for all of them (:meth:`read`)."""

    jobs: dict[int, SlurmJob] = field(default_factory=dict)
    workers: dict[int, list[SlurmJob]] = field(default_factory=dict)  # by an elastic job's worker array id

    @classmethod
    def read(cls, client: SlurmClient, records: list[JobRecord]) -> SlurmView:
        """One squeue call for the jobs and their worker arrays; sacct for those squeue no longer lists
        (purged after MinJobAge). A Slurm job of another user under one of these ids (Slurm reuses ids,
        e.g. after losing its state) is not the record's job, and is left out."""
        owners = {r.slurm_job_id: r.user for r in records if r.slurm_job_id is not None}
        arrays = {r.worker_array_id for r in records if r.worker_array_id is not None}
        if not owners:
            return cls()

        def owned(job: SlurmJob) -> bool:
            owner = owners.get(job.job_id)
            return owner is not None and (not owner or not job.user or job.user == owner)

        listed = client.jobs_by_id(set(owners) | arrays)
        jobs = {j.job_id: j for j in listed if owned(j)}
        workers: dict[int, list[SlurmJob]] = {}
        for job in listed:
            if job.array_job_id in arrays:
                workers.setdefault(job.array_job_id or 0, []).append(job)
        gone = sorted(set(owners) - set(jobs))
        if gone:
            jobs.update({j.job_id: j for j in client.accounting(gone) if owned(j)})
        return cls(jobs, workers)

    def status(self, record: JobRecord, store: JobStore | None) -> JobStatus:
        """The record's status, its state recorded in ``store`` (None: not the viewer's store, not
        recorded) and shown as the store allows: a state seen is a sample (a job may run and end between
        two looks), but an ended job is never shown UNKNOWN once Slurm forgets it, nor a lagging record's
        older state (:func:`dlsub.contract.check_transition`)."""
        slurm = self.jobs.get(record.slurm_job_id or -1)
        row = job_status(record, slurm, self.workers.get(record.worker_array_id or -1))
        if store is None:
            return row
        shown = store.observed(record.id, row.state, slurm.seen_by if slurm is not None else StateSource.JOB_FILES)
        return row if shown.value == row.state else dataclasses.replace(row, state=shown.value)


def describe_mounts(row: JobStatus) -> str:
    """One line: each extra mount, how, and whose ("" when there are none)."""
    words = []
    for m in row.mounts:
        how = "read-only" if m.get("read_only", True) else "read-write"
        whose = "the site's" if m.get("origin") == "site" else "yours"
        behind = f" from {m['source']}" if m.get("source") and m.get("source") != m.get("path") else ""
        words.append(f"{m.get('path')}{behind} ({how}, {whose})")
    return f"{row.id}: mounts {', '.join(words)}" if words else ""


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _eta_cell(r: JobStatus) -> str:
    """The declared-total ETA; with a target loss, the loss-curve one and its confidence once stable."""
    if r.loss_eta_s is not None and r.eta_confidence is not None:
        return f"~{_fmt_duration(r.loss_eta_s)} ({r.eta_confidence:.0%})"
    return _fmt_duration(r.eta_s)


def render_table(rows: list[JobStatus], bars: list[str] | None = None) -> str:
    """The table; ``bars`` (one per row, e.g. progress bars on a terminal) adds a PROGRESS column."""
    header = [
        "ID", "SLURM", "NAME", "STATE", "PARTITION", "GPU", "NODES", "STEP", "EPOCH", "LOSS", "SAMPLES/S", "ETA",
        "TRIES", "COST"
    ]
    body = [
        [
            r.id,
            _fmt(r.slurm_job_id),
            r.name[:20],
            r.state + (f" ({r.reason})" if r.reason and r.state in ("PENDING", "UNKNOWN") else ""),
            r.partition,
            r.gpu_type or "-",
            r.nodes or "-",
            _fmt(r.step),
            _fmt(r.epoch),
            _fmt(r.loss, ".4f"),
            _fmt(r.samples_per_s, ".1f"),
            _eta_cell(r),
            str(r.attempts),
            _fmt(r.cost, ".3f"),
        ]
        for r in rows
    ]
    if bars is not None:
        header.append("PROGRESS")
        body = [[*line, bar] for line, bar in zip(body, bars, strict=True)]
    # Every body row has one cell per header column.
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    table = "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *body]
    )
    # Why a job failed, where dlsub knows (too long for a cell): one line each under the table.
    failures = [f"{r.id}: {r.reason}" for r in rows if r.state == "FAILED" and r.reason]
    plain = [f"{r.id}: {PLAIN_NOTE}" for r in rows if r.uses_library is False and r.state in ("RUNNING", "PENDING")]
    return "\n".join([table, *failures, *plain])
