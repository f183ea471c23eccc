"""Whose job this is and what it asked for, and reading its files: the trusted view of one job.

Trust. The agent runs as a Slurm Operator, so everything a user can write
is hostile input to it:

* Identity: everything is keyed by (uid, Slurm job id), the uid being
  Slurm's ``user_id`` of the job. A dlsub id belongs to the first uid seen
  with it (``bindings``); a Slurm job of another uid that claims it is
  ignored: one decision, no action, its files never read.
* The request: trusted only from the submit record job_submit.lua froze in
  AdminComment (users cannot update it) when its uid is the job's. Without
  one, the tags the agent first saw are frozen and the comment is never
  read again. The agent changes partition, GPUs, time limit and holds only
  within that request and the policy.
* Files: read through :mod:`dlsub.jobdir` (no symlinks, regular files
  owned by the job's uid, bounded and incremental, every field checked). A
  bad file or a failure costs that one job its observation, with a
  recorded reason; the tick has a deadline past which remaining jobs keep
  their last summary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dlsub.agent.job_data import JobData, TrustedRequest
from dlsub.agent.store_rows import Binding, JobRow, Writes
from dlsub.contract import ATTEMPTS_FILE, PROGRESS_FILE, Tags
from dlsub.jobdir import (
    Unreadable,
    check_attempt_event,
    check_progress_event,
    open_dir,
    parse_line,
    read_new_lines,
)
from dlsub.policies.actions.move_views import JobInfo
from dlsub.policies.actions.resize_rules import WorkerTask
from dlsub.slurm_plugins.models import SlurmJob, expand_nodes

log = logging.getLogger("dlsub.agent")


def job_dir_of(job: SlurmJob, dlsub_id: str) -> Path | None:
    """Where the job's directory should be, from Slurm's record of its output file (None: nowhere usable)."""
    out = job.standard_output
    if not out.startswith("/") or "\0" in out:
        return None
    directory = Path(out).parent
    return directory if directory.name == dlsub_id else None


def _request_from_record(job: SlurmJob, uid: int) -> TrustedRequest | None:
    record = job.submit_record
    if record is None or record.uid != uid:
        return None
    tags = record.tags
    return TrustedRequest("record", tags.dlsub_id, tags.mode, tags.ideal, tags.gpus or record.gpus_per_node,
                   record.partition, record.time_limit_min, tags.role,
                   (tags.nodes[0], tags.nodes[1]) if tags.nodes else None, tags.step, tags.plain, tags.application,
                   record.gpu_type or tags.gpu_type, tags.pinned)


def _request_from_tags(job: SlurmJob, tags: Tags) -> TrustedRequest:
    return TrustedRequest("comment", tags.dlsub_id, tags.mode, tags.ideal, tags.gpus, job.partition, job.time_limit_min,
                   tags.role, (tags.nodes[0], tags.nodes[1]) if tags.nodes else None, tags.step, tags.plain,
                   tags.application, job.gpu_type_asked or tags.gpu_type, tags.pinned)


def worker_request(job: SlurmJob, uid: int) -> TrustedRequest | None:
    """The request of an elastic job's worker task (its submit record, else its comment); None: not one."""
    if job.array_job_id is None or job.node_count > 1:
        return None  # dlsub's workers are one-node array tasks; anything else tagged so is planned as itself
    request = _request_from_record(job, uid)
    if request is None and job.tags is not None:
        request = _request_from_tags(job, job.tags)
    return request if request is not None and request.role == "worker" else None


def nodes_of(job: SlurmJob) -> tuple[str, ...]:
    """The nodes a job runs on; () when none, or when Slurm's list is not one it would give."""
    try:
        return tuple(expand_nodes(job.nodes))
    except ValueError:
        return ()


def worker_task(job: SlurmJob) -> WorkerTask | None:
    handle = job.array_task_handle
    if handle is None:
        return None
    return WorkerTask(handle=handle, slurm_job_id=job.job_id, state=job.state, reason=job.reason,
                      partition=job.partition, nodes=nodes_of(job),
                      restart_count=job.restart_count, start_time=float(job.start_time), gpus=job.gpus_per_node)


@dataclass(frozen=True)
class Seen:
    """One dlsub Slurm job this tick: Slurm's view, the agent's row, and what the planner gets."""

    job: SlurmJob
    row: JobRow
    request: TrustedRequest
    info: JobInfo | None = None


# ---------------------------------------------------------------- whose job it is, and its files
def may_claim(bound: Binding | None, request: TrustedRequest) -> bool:
    """Whether a job's request may (re)bind its id: an unbound id, or a record-backed claim on an id
    bound by a comment alone."""
    return bound is None or (bound.source != "record" and request.source == "record")


def identify(job: SlurmJob, uid: int, rows: Mapping[tuple[int, int], JobRow]) -> Seen | None:
    """The job's trusted request, if it is a dlsub job the agent may follow; None otherwise."""
    row = rows.get((uid, job.job_id))
    request = _request_from_record(job, uid)
    if row is not None and request is not None and request.dlsub_id != row.dlsub_id:
        # Slurm has given this id to another job of the same user (its state was reset, as when a
        # site moves to a new Slurm, or ids wrapped round at MaxJobId): a new job, not the row's.
        log.info("Slurm job %s (uid %s) is now dlsub job %s, no longer %s: a reused id", job.job_id, uid,
                 request.dlsub_id, row.dlsub_id)
        row = None
    if row is not None and row.data.ignored:
        return None  # decided once: never acted on, never read
    first_note = None
    frozen = row.data.request if row is not None else None
    if request is None:
        if frozen is not None and frozen.dlsub_id:
            request = frozen  # the tags first seen; the comment is not read again
        else:
            tags = job.tags
            if tags is None:
                return None  # not dlsub's
            request = _request_from_tags(job, tags)
            first_note = ("no submit record from job_submit.lua: the agent trusts the tags it saw first "
                          f"({tags.comment()}) and will not read this job's comment again")
    # What the record leaves open (the default partition, its default time) is fixed at first sight.
    if request.partition is None:
        request = dataclasses.replace(
            request, partition=(frozen.partition if frozen else None) if row is not None else job.partition)
    if request.time_limit_min is None:
        request = dataclasses.replace(
            request, time_limit_min=(frozen.time_limit_min if frozen else None) if row is not None
            else job.time_limit_min)
    if row is None:
        row = JobRow(uid, job.job_id, request.dlsub_id, job.user, None, JobData())
    else:
        # The tick's own copy: observing changes it, never the row as the store was read.
        row = JobRow(row.uid, row.slurm_job_id, row.dlsub_id, row.user, row.state, row.data.copy())
    if first_note is not None:
        row.data.first_note = first_note
    return Seen(job, row, request)


def ignore(seen: Seen, owner: int, now: float, writes: Writes) -> None:
    row = JobRow(seen.row.uid, seen.job.job_id, seen.request.dlsub_id, seen.job.user, seen.row.state,
                 JobData(ignored=True))
    writes.jobs[row.key()] = row
    writes.record_decision(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, "ignored",
                           f"this Slurm job's comment names dlsub job {row.dlsub_id}, which belongs to another user: "
                           "the agent ignores this job (it never acts on it or reads its files)")
    log.warning("Slurm job %s (uid %s) claims dlsub id %s of uid %s: ignored", row.slurm_job_id, row.uid,
                row.dlsub_id, owner)


def once(row: JobRow, slot: str, reason: str, now: float, writes: Writes, kind: str = "wait") -> None:
    """Record ``reason`` as a decision unless it is the last one recorded in ``slot``."""
    if row.data.said.get(slot) == reason:
        return
    row.data.said = {**row.data.said, slot: reason}
    writes.jobs[row.key()] = row
    writes.record_decision(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, kind, reason)


def read_files(row: JobRow, job: SlurmJob, dlsub_id: str, now: float, writes: Writes) -> bool:
    """Fold what was appended to the job's progress and attempt files since last time into its row.

    False: they could not be read (the reason is recorded once); the row keeps its last summary.
    """
    data = row.data
    if not data.job_dir_fixed:
        found = job_dir_of(job, dlsub_id)
        data.job_dir, data.job_dir_fixed = (str(found) if found else None), True  # fixed at first sight
    job_dir = data.job_dir
    if not job_dir:
        once(row, "files", "Slurm's record of this job names no job directory called "
                   f"{dlsub_id} for its output: progress is not read", now, writes, "skipped")
        return False
    cursors = dict(data.files)
    progress = data.progress_summary()
    attempts = data.attempts_summary(job.job_id)
    fed = {PROGRESS_FILE: False, ATTEMPTS_FILE: False}
    dropped: list[str] = []
    try:
        dir_fd = open_dir(Path(job_dir), row.uid)
        try:
            for name, check, summary in ((PROGRESS_FILE, check_progress_event, progress),
                                         (ATTEMPTS_FILE, check_attempt_event, attempts)):
                chunk = read_new_lines(dir_fd, name, row.uid, cursors.get(name))
                if chunk.dropped:
                    dropped.append(f"{name}: {chunk.dropped} bytes passed over (lines over 64 KiB, or more "
                                   "than 1 MiB behind)")
                cursor = chunk.cursor
                fed[name] = bool(chunk.lines)
                for line in chunk.lines:
                    raw = parse_line(line)
                    event = check(raw) if raw is not None else None
                    if event is None:
                        summary.bad_events += 1
                    else:
                        summary.feed(event)
                cursors[name] = cursor
        finally:
            os.close(dir_fd)
    except Unreadable as exc:
        once(row, "files", f"not read this tick: {exc.reason}", now, writes, "skipped")
        return False
    if cursors != data.files:
        data.files = cursors
    if fed[PROGRESS_FILE] or data.progress is None:
        data.progress = progress
    if fed[ATTEMPTS_FILE] or data.attempts is None:
        data.attempts = attempts
    if dropped:
        once(row, "dropped", "read in part: " + "; ".join(dropped), now, writes, "skipped")
    if data.said.get("files"):
        # Readable again: the same trouble later is worth saying again.
        data.said = {k: v for k, v in data.said.items() if k != "files"}
    return True
