"""The agent's tick: observe → decide (a pure policy) → act → record.

``Agent.tick(now)`` is the whole loop body; ``dlsub agent run`` calls it on
an interval and at the edges of the off-hours windows, tests call it with a
fake clock. One ``squeue --json`` and one ``sinfo --json`` per tick.

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

Writes: what the tick observed and decided (moves' intents included) is
committed in one transaction before the agent acts on Slurm, which makes
it the write-ahead record; the outcome (phases, errors, meta) follows in a
second one.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsub.agent import failpoints
from dlsub.agent.agent_store import AgentStore, Binding, JobRow, ResizePhase, ResizeRow, Writes
from dlsub.agent.budget_watch import BudgetWatch
from dlsub.agent.job_mailbox import MailboxError, publish_batch
from dlsub.agent.live_models import LiveModels, sizing_policy
from dlsub.contract import (
    ATTEMPTS_FILE,
    CHECKPOINT_SIGNAL,
    MOVE_SIGNAL,
    PROGRESS_FILE,
    IllegalTransition,
    JobState,
    Tags,
)
from dlsub.job_progress import AttemptsSummary, Progress, ProgressSummary
from dlsub.jobdir import (
    Cursor,
    Unreadable,
    check_attempt_event,
    check_progress_event,
    open_dir,
    parse_line,
    read_new_lines,
)
from dlsub.policies.actions import move_rules, resize_rules
from dlsub.policies.actions.goodput_resize_rules import plan_by_policy
from dlsub.policies.actions.move_rules import (
    Action,
    JobInfo,
    MovePhase,
    MoveView,
    PartitionInfo,
    Rules,
    Usage,
    Window,
)
from dlsub.policies.actions.resize_rules import ElasticJob, Resize, Room, WorkerTask
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.models import Partition, SlurmJob, expand_nodes
from dlsub.slurm_plugins.queue_reader import QueueReader

log = logging.getLogger("dlsub.agent")

#: Seconds a worker told to leave has to checkpoint with its group and requeue itself before it is told again.
LEAVE_WAIT_S = 120.0

_LIVE = (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED)
# Pending jobs that wait for nodes, and would start on idle ones: only they hold back growth, count
# against moves, or shrink an elastic job. One pending for its QOS, association, a reservation, a
# dependency or a node that is down would not start anyway, and must not shrink anybody.
_WAITING_FOR_NODES = ("Resources", "Priority", "None", "")


# Where a test may SIGKILL the tick (dlsub.agent.failpoints): before an action is
# carried out, and once its outcome is recorded.
_BEFORE = {move_rules.SIGNAL_MOVE: "move-planned", move_rules.RETARGET: "move-retarget",
           resize_rules.GROW: "grow-planned", resize_rules.SHRINK: "shrink-planned"}
_AFTER = {move_rules.SIGNAL_MOVE: "move-signalled", move_rules.RELEASE: "move-released",
          resize_rules.GROW: "grow-recorded", resize_rules.SHRINK: "shrink-signalled"}
# Resizes written ahead (a row in the store's ``resizes``): ending an ended job's workers is not, as it is
# decided again from Slurm each tick and cancelling twice is harmless.
_WRITTEN_AHEAD = (resize_rules.GROW, resize_rules.SHRINK)


def rules_from(policy: AgentPolicy) -> Rules:
    return Rules(
        policy=policy.policy,
        moves_enabled=policy.moves.enabled,
        movable_users=policy.moves.users,
        restart_cost_s=policy.moves.restart_cost_s,
        min_saving_s=policy.moves.min_saving_s,
        checkpoint_grace_s=policy.checkpoint_grace_s,
        continue_jobs=policy.time_limits.continue_jobs,
        max_continuations=policy.time_limits.max_continuations,
        max_gpus_per_user=policy.limits.max_gpus_per_user,
        max_jobs_per_user=policy.limits.max_jobs_per_user,
        max_gpus_per_job=policy.limits.max_gpus_per_job,
        backfill_enabled=policy.backfill.enabled,
        backfill_roles=policy.backfill.roles,
        budget_period=policy.budgets.period,
    )


def job_dir_of(job: SlurmJob, dlsub_id: str) -> Path | None:
    """Where the job's directory should be, from Slurm's record of its output file (None: nowhere usable)."""
    out = job.standard_output
    if not out.startswith("/") or "\0" in out:
        return None
    directory = Path(out).parent
    return directory if directory.name == dlsub_id else None


def _request_from_record(job: SlurmJob, uid: int) -> dict[str, Any] | None:
    record = job.submit_record
    if record is None or record.uid != uid:
        return None
    tags = record.tags
    return {"source": "record", "dlsub_id": tags.dlsub_id, "mode": tags.mode, "ideal": tags.ideal,
            "gpus": tags.gpus or record.gpus_per_node, "partition": record.partition,
            "time_limit_min": record.time_limit_min, "role": tags.role,
            "nodes": list(tags.nodes) if tags.nodes else None}


def _request_from_tags(job: SlurmJob, tags: Tags) -> dict[str, Any]:
    return {"source": "comment", "dlsub_id": tags.dlsub_id, "mode": tags.mode, "ideal": tags.ideal,
            "gpus": tags.gpus, "partition": job.partition, "time_limit_min": job.time_limit_min, "role": tags.role,
            "nodes": list(tags.nodes) if tags.nodes else None}


_TAKES_GPUS = (move_rules.SIGNAL_MOVE, move_rules.BACKFILL, move_rules.RETARGET, move_rules.RELEASE)


def _reserve(rooms: list[Room], takes: Sequence[tuple[str | None, int | None]]) -> list[Room]:
    """The rooms with the GPUs these (partition, GPUs) takes will take out of their partitions' idle ones
    (on the first node with enough, in every partition that has that node)."""
    idle = {n: g for room in rooms for n, g in room.nodes}
    for partition, gpus in takes:
        room = next((r for r in rooms if r.name == partition), None)
        want = gpus or 0
        node = next((n for n, _ in room.nodes if idle[n] >= want), None) if room is not None and want else None
        if node is not None:
            idle[node] -= want
    return [dataclasses.replace(r, nodes=tuple((n, idle[n]) for n, _ in r.nodes)) for r in rooms]


def _worker_request(job: SlurmJob, uid: int) -> dict[str, Any] | None:
    """The request of an elastic job's worker task (its submit record, else its comment); None: not one."""
    if job.array_job_id is None or job.node_count > 1:
        return None  # dlsub's workers are one-node array tasks; anything else tagged so is planned as itself
    request = _request_from_record(job, uid)
    if request is None and job.tags is not None:
        request = _request_from_tags(job, job.tags)
    return request if request is not None and request.get("role") == "worker" else None


def _worker_task(job: SlurmJob) -> WorkerTask | None:
    handle = job.array_task_handle
    if handle is None:
        return None
    try:
        nodes = tuple(expand_nodes(job.nodes))
    except ValueError:
        nodes = ()  # not a list Slurm would give: the worker is known, its node is not
    return WorkerTask(handle=handle, slurm_job_id=job.job_id, state=job.state, reason=job.reason,
                      partition=job.partition, nodes=nodes,
                      restart_count=job.restart_count, start_time=float(job.start_time))


@dataclass
class _Seen:
    """One dlsub Slurm job this tick: Slurm's view, the agent's row, and what the planner gets."""

    job: SlurmJob
    row: JobRow
    request: dict[str, Any]
    info: JobInfo | None = None


@dataclass
class Observation:
    jobs: list[JobInfo]
    partitions: list[PartitionInfo]
    window: Window
    usage: dict[int, Usage] = field(default_factory=dict)
    skipped: int = 0
    late: bool = False
    elastic: list[ElasticJob] = field(default_factory=list)
    rooms: list[Room] = field(default_factory=list)
    # What each elastic main job reported, by dlsub id (an elastic policy's models are fitted from it),
    # and its job directory (where its mailbox is).
    elastic_progress: dict[str, Progress] = field(default_factory=dict)
    elastic_dirs: dict[str, str] = field(default_factory=dict)


class Agent:
    def __init__(self, client: SlurmClient, store: AgentStore, policy: AgentPolicy,
                 clock: Callable[[], float] = time.time,
                 deadline_clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.store = store
        self.policy = policy
        self.rules = rules_from(policy)
        self.clock = clock
        # Real elapsed time for the tick's deadline (the tick clock may be a test's fake one).
        self.deadline_clock = deadline_clock
        self._seen: dict[int, _Seen] = {}
        self._unread = 0  # jobs whose files could not be read this tick
        # When each job's files were last read (deadline clock): the least recently read go first.
        self._last_read: dict[tuple[int, int], float] = {}
        # Worker tasks sent MOVE_SIGNAL to leave, and when (the agent's clock): reloaded from the store's
        # resizes each tick, so a restarted agent does not tell them again.
        self._leaving: dict[str, float] = {}
        self._last_elastic: list[ElasticJob] = []
        self._elastic_dirs: dict[str, str] = {}
        # An elastic policy that learns from reports sizes elastic jobs on models fitted from them.
        self._models = LiveModels()
        self._sizing_policy = sizing_policy(policy)
        # What each budget has left (sacct at most once a minute): the planner's budget gate.
        self._budgets = BudgetWatch(client, policy)
        # Which queued jobs are dlsub's, remembered between ticks: the rest are read brief.
        self._queue = QueueReader(client)

    # ---------------------------------------------------------------- observe
    def window_at(self, now: float) -> Window:
        best = Window(False)
        for window in self.policy.backfill.windows:
            is_open, change = window.state(now)
            if is_open and (not best.open or (change or 1e18) < (best.closes_at or 1e18)):
                best = Window(True, window.name, change)
        return best

    def observe(self, now: float, slurm_jobs: list[SlurmJob], partitions: list[Partition], writes: Writes,
                deadline: float) -> Observation:
        rows = self.store.jobs()
        bindings = self.store.bindings()
        moves = {(int(m["uid"]), int(m["slurm_job_id"])): m for m in self.store.moves()}
        known = {p.name: p for p in partitions}
        usage: dict[int, Usage] = {}
        candidates: list[_Seen] = []
        workers: dict[tuple[int, str], list[WorkerTask]] = {}
        worker_ids: set[int] = set()
        # Who may own each id: (not backed by a record, submit time, Slurm id, uid, source). dlsub submits an
        # elastic job's worker array before its main job, so the workers' claim counts too: their public
        # comment shows the id first, and another user must not take it with a main job of their own.
        claims: dict[str, list[tuple[bool, int, int, int, str]]] = {}
        for job in slurm_jobs:
            uid = job.user_id
            if uid is None:
                continue
            state = job.dlsub_state
            worker = _worker_request(job, uid)
            if worker is not None:
                # An elastic job's worker task: part of its main job (same uid, same id), never planned alone.
                worker_ids.add(job.job_id)
                task = _worker_task(job)
                if task is not None:
                    workers.setdefault((uid, str(worker["dlsub_id"])), []).append(task)
                if state in _LIVE and not job.held:
                    old = usage.get(uid, Usage())
                    usage[uid] = Usage(old.gpus + job.gpus_per_node * max(1, job.node_count), old.jobs + 1)
                dlsub_id = str(worker["dlsub_id"])
                if worker.get("source") == "record" and self._may_claim(bindings.get(dlsub_id), worker):
                    claims.setdefault(dlsub_id, []).append((False, job.submit_time, job.job_id, uid, "record"))
                continue
            if state in _LIVE:
                gpus = job.gpus_per_node * max(1, job.node_count)
                move = moves.get((uid, job.job_id))
                if move is not None:
                    gpus = max(gpus, int(move["target_gpus"] or 0) * max(1, job.node_count))
                old = usage.get(uid, Usage())
                usage[uid] = Usage(old.gpus + gpus, old.jobs + 1)
            seen = self._identify(job, uid, rows, now, writes)
            if seen is not None:
                candidates.append(seen)
        # Bind each dlsub id to the uid that submitted it. A submit record (job_submit.lua) is the proof
        # of that; a comment is only a claim, which anyone can edit into an old job of theirs the moment
        # they see a new id in squeue. So a record-backed claim takes an id from a comment-only owner,
        # never the other way round; among equals the earliest submit (then the lowest job id) wins.
        for seen in candidates:
            dlsub_id = seen.request["dlsub_id"]
            if self._may_claim(bindings.get(dlsub_id), seen.request):
                record = seen.request.get("source") == "record"
                source = "record" if record else "comment"
                claims.setdefault(dlsub_id, []).append(
                    (not record, seen.job.submit_time, seen.job.job_id, seen.row.uid, source))
        for dlsub_id, group in claims.items():
            _, _, job_id, uid, source = min(group)
            bindings[dlsub_id] = Binding(uid, source)
            writes.bindings.append((dlsub_id, uid, job_id, now, source))
        observed: list[_Seen] = []
        skipped, late = 0, False
        self._unread = 0
        followed: list[_Seen] = []
        for seen in candidates:
            owner = bindings[seen.request["dlsub_id"]].uid
            if owner != seen.row.uid:
                self._ignore(seen, owner, now, writes)
            else:
                followed.append(seen)
        live = {seen.row.key() for seen in followed}
        self._last_read = {key: at for key, at in self._last_read.items() if key in live}
        for seen in self._fair_order(followed):
            try:
                # A job that has never run has written nothing yet: its files are not worth a read.
                ran = seen.job.state != "PENDING" or seen.job.restart_count > 0
                if not ran:
                    read = False
                elif self.deadline_clock() > deadline:
                    late = True
                    skipped += 1
                    read = False
                else:
                    read = True
                    self._last_read[seen.row.key()] = self.deadline_clock()
                info = self._observe_job(seen, moves.get(seen.row.key()), known, now, writes, read)
            except Exception as exc:
                log.exception("observing Slurm job %s failed", seen.job.job_id)
                self._once(seen.row, "failed", f"observing this job failed ({type(exc).__name__}: {exc}); "
                           "skipped this tick", now, writes, "skipped")
                skipped += 1
                continue
            if info is not None:
                seen.info = info
                observed.append(seen)
        self._seen = {s.job.job_id: s for s in observed}
        # What jobs waiting for nodes want, per partition; one user counts for at most the per-user GPU
        # limit, so that a user's queue of jobs cannot shrink (or keep from growing) everybody else's.
        by_user: dict[tuple[str, int], int] = {}
        pending_per_node: dict[str, int] = {}
        for job in slurm_jobs:
            if (job.state == "PENDING" and not job.held and job.gpus_per_node and job.user_id is not None
                    and (job.user_id, job.job_id) not in moves and job.job_id not in worker_ids
                    and job.reason in _WAITING_FOR_NODES and self._could_run(job, known)):
                wanted = job.gpus_per_node * max(1, job.node_count)
                for name in job.partition.split(","):
                    by_user[(name, job.user_id)] = by_user.get((name, job.user_id), 0) + wanted
                    pending_per_node[name] = max(pending_per_node.get(name, 0), job.gpus_per_node)
        pending_gpus: dict[str, int] = {}
        for (name, _), wanted in by_user.items():
            pending_gpus[name] = pending_gpus.get(name, 0) + min(wanted, self.rules.max_gpus_per_user)
        parts = []
        for p in partitions:
            up_nodes = tuple((n.name, n.idle_gpus, n.idle_cpus) for n in p.nodes if n.usable)
            parts.append(PartitionInfo(
                name=p.name, role=self.policy.role_of(p.name), speed=self.policy.speed_of(p.name),
                nodes=up_nodes, pending_gpus=pending_gpus.get(p.name, 0),
                max_time_s=p.max_time_min * 60.0 if p.max_time_min else None,
                cost_per_node_hour=self._price(p.name),
            ))
        infos = [s.info for s in observed if s.info is not None]
        infos = self._budgets.attach(infos, {s.job.job_id: str(s.job.extra.get("account") or "") for s in observed},
                                     now)
        elastic = self._elastic_jobs(followed, workers, rows, bindings, moves)
        mains = [s for s in followed if s.request.get("nodes") and s.request.get("role", "main") == "main"]
        elastic_progress = {str(s.request["dlsub_id"]): ProgressSummary.from_dict(s.row.data.get("progress")).progress()
                            for s in mains}
        elastic_dirs = {str(s.request["dlsub_id"]): str(s.row.data["job_dir"])
                        for s in mains if s.row.data.get("job_dir")}
        rooms = [Room(p.name, tuple((n.name, n.idle_gpus) for n in p.nodes if n.usable), pending_gpus.get(p.name, 0),
                      pending_per_node.get(p.name, 0),
                      tuple((n.name, n.idle_cpus, n.free_memory_mb) for n in p.nodes if n.usable)) for p in partitions]
        return Observation(infos, parts, self.window_at(now), usage, skipped + self._unread, late, elastic, rooms,
                           elastic_progress, elastic_dirs)

    def _price(self, partition: str) -> float:
        role = self.policy.partitions.get(partition)
        return role.cost_per_node_hour if role else 0.0

    @staticmethod
    def _elastic_jobs(followed: list[_Seen], workers: dict[tuple[int, str], list[WorkerTask]],
                      rows: dict[tuple[int, int], JobRow], bindings: dict[str, Binding],
                      moves: dict[tuple[int, int], dict[str, Any]]) -> list[ElasticJob]:
        """Elastic main jobs with their worker tasks (same uid and id only); and workers whose main job
        has ended, even when Slurm no longer lists it."""
        out: list[ElasticJob] = []
        mains: set[tuple[int, str]] = set()
        for seen in followed:
            rng = seen.request.get("nodes")
            if not rng or seen.request.get("role", "main") != "main":
                continue
            key = (seen.row.uid, str(seen.request["dlsub_id"]))
            mains.add(key)
            job = seen.job
            tasks = tuple(workers.get(key, ()))
            arrays = {int(t.handle.split("_")[0]) for t in tasks}
            out.append(ElasticJob(
                dlsub_id=key[1], slurm_job_id=job.job_id, uid=key[0], user=job.user, state=job.state,
                ended=job.dlsub_state.terminal, partition=job.partition,
                gpus_per_node=job.gpus_per_node, min_nodes=int(rng[0]), max_nodes=int(rng[1]),
                submit_time=float(job.submit_time), worker_arrays=tuple(sorted(arrays)),
                workers=tasks, moving=seen.row.key() in moves, cpus_per_node=job.cpus_per_node,
                memory_per_node_mb=job.memory_per_node_mb))
        ended = {(r.uid, r.dlsub_id): r for r in rows.values()
                 if r.state is not None and JobState(r.state).terminal and not r.data.get("ignored")}
        for key, orphans in workers.items():
            row = ended.get(key)
            bound = bindings.get(key[1])
            if key in mains or row is None or bound is None or bound.uid != key[0]:
                continue
            arrays = {int(t.handle.split("_")[0]) for t in orphans}
            out.append(ElasticJob(
                dlsub_id=key[1], slurm_job_id=row.slurm_job_id, uid=key[0], user=row.user, state=str(row.state),
                ended=True, partition="", gpus_per_node=0, min_nodes=1, max_nodes=2, submit_time=0.0,
                worker_arrays=tuple(sorted(arrays)), workers=tuple(orphans)))
        return out

    @staticmethod
    def _could_run(job: SlurmJob, known: dict[str, Partition]) -> bool:
        """Whether some partition the job names has enough up nodes with as many GPUs as it wants per node."""
        for name in job.partition.split(","):
            part = known.get(name)
            if part is not None and sum(1 for n in part.nodes if n.usable and n.gpus >= job.gpus_per_node) \
                    >= max(1, job.node_count):
                return True
        return False

    @staticmethod
    def _may_claim(bound: Binding | None, request: dict[str, Any]) -> bool:
        """Whether a job's request may (re)bind its id: an unbound id, or a record-backed claim on an id
        bound by a comment alone."""
        return bound is None or (bound.source != "record" and request.get("source") == "record")

    def _fair_order(self, jobs: list[_Seen]) -> list[_Seen]:
        """The order to read jobs' files in: one job of each user in turn, each user's least recently read
        first, so that many jobs of one user (or a few slow ones) cannot use up the deadline every tick."""
        by_uid: dict[int, list[_Seen]] = {}
        for seen in sorted(jobs, key=lambda s: self._last_read.get(s.row.key(), 0.0)):
            by_uid.setdefault(seen.row.uid, []).append(seen)
        queues = sorted(by_uid.values(), key=lambda q: self._last_read.get(q[0].row.key(), 0.0))
        return [seen for turn in itertools.zip_longest(*queues) for seen in turn if seen is not None]

    def _identify(self, job: SlurmJob, uid: int, rows: dict[tuple[int, int], JobRow], now: float,
                  writes: Writes) -> _Seen | None:
        """The job's trusted request, if it is a dlsub job the agent may follow; None otherwise."""
        row = rows.get((uid, job.job_id))
        request = _request_from_record(job, uid)
        if row is not None and request is not None and request["dlsub_id"] != row.dlsub_id:
            # Slurm has given this id to another job of the same user (its state was reset, as when a
            # site moves to a new Slurm, or ids wrapped round at MaxJobId): a new job, not the row's.
            log.info("Slurm job %s (uid %s) is now dlsub job %s, no longer %s: a reused id", job.job_id, uid,
                     request["dlsub_id"], row.dlsub_id)
            row = None
        if row is not None and row.data.get("ignored"):
            return None  # decided once: never acted on, never read
        first_note = None
        if request is None:
            frozen = row.data.get("request") if row is not None else None
            if isinstance(frozen, dict) and frozen.get("dlsub_id"):
                request = frozen  # the tags first seen; the comment is not read again
            else:
                tags = job.tags
                if tags is None:
                    return None  # not dlsub's
                request = _request_from_tags(job, tags)
                first_note = ("no submit record from job_submit.lua: the agent trusts the tags it saw first "
                              f"({tags.comment()}) and will not read this job's comment again")
        # What the record leaves open (the default partition, its default time) is fixed at first sight.
        frozen = (row.data.get("request") if row is not None else None) or {}
        for key, now_value in (("partition", job.partition), ("time_limit_min", job.time_limit_min)):
            if request.get(key) is None:
                request = {**request, key: frozen.get(key) if row is not None else now_value}
        if row is None:
            row = JobRow(uid, job.job_id, request["dlsub_id"], job.user, None, {})
        elif row.data.get("request") != request:
            row = JobRow(row.uid, row.slurm_job_id, row.dlsub_id, row.user, row.state, dict(row.data))
        seen = _Seen(job, row, request)
        if first_note is not None:
            seen.row.data["first_note"] = first_note
        return seen

    def _ignore(self, seen: _Seen, owner: int, now: float, writes: Writes) -> None:
        row = JobRow(seen.row.uid, seen.job.job_id, seen.request["dlsub_id"], seen.job.user, seen.row.state,
                     {"ignored": True})
        writes.jobs[row.key()] = row
        writes.decide(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, "ignored",
                      f"this Slurm job's comment names dlsub job {row.dlsub_id}, which belongs to another user: "
                      "the agent ignores this job (it never acts on it or reads its files)")
        log.warning("Slurm job %s (uid %s) claims dlsub id %s of uid %s: ignored", row.slurm_job_id, row.uid,
                    row.dlsub_id, owner)

    def _once(self, row: JobRow, slot: str, reason: str, now: float, writes: Writes, kind: str = "wait") -> None:
        """Record ``reason`` as a decision unless it is the last one recorded in ``slot``."""
        notes = dict(row.data.get("said") or {})
        if notes.get(slot) == reason:
            return
        notes[slot] = reason
        row.data["said"] = notes
        writes.jobs[row.key()] = row
        writes.decide(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, kind, reason)

    def _observe_job(self, seen: _Seen, move_row: dict[str, Any] | None, known: dict[str, Partition], now: float,
                     writes: Writes, read: bool) -> JobInfo | None:
        job, request = seen.job, seen.request
        row = seen.row
        # Nested values are replaced, never changed in place, so a shallow copy tells what changed.
        before = dict(row.data), row.state
        data = row.data
        data["request"] = request
        note = data.pop("first_note", None)
        if note:
            writes.decide(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, "trust", note)
        new_state = job.dlsub_state
        try:
            row.set_state(new_state)
        except IllegalTransition as exc:
            self._once(row, "state", f"Slurm shows this job {new_state.value} after {row.state}: {exc}; "
                       "the agent leaves it alone", now, writes)
            self._changed(row, before, writes)
            return None
        if new_state.terminal and move_row is None:
            self._changed(row, before, writes)
            return None
        if read and not self._read_files(row, job, request["dlsub_id"], now, writes):
            self._unread += 1
        progress = ProgressSummary.from_dict(data.get("progress")).progress()
        attempts = AttemptsSummary.from_dict(data.get("attempts"), job.job_id)
        ideal_name = request.get("ideal") or request.get("partition") or job.partition
        if ideal_name not in known:
            ideal_name = job.partition
        ideal = known.get(ideal_name)
        per_node = ideal.max_gpus_per_node if ideal is not None else 0
        gpus_wanted = max(0, min(int(request.get("gpus") or 0), self.policy.limits.max_gpus_per_job, per_node))
        move = None
        if move_row is not None:
            restart = move_row.get("restart_count")
            if restart is None:
                # A move recorded before restart counts were (a migrated database): adopt Slurm's now.
                restart = job.restart_count - (1 if job.state == "PENDING" else 0)
                writes.moves[row.key()] = {**move_row, "restart_count": restart}
            move = MoveView(move_row["kind"], MovePhase(move_row["phase"]), move_row["target_partition"],
                            int(move_row["target_gpus"] or 0), float(move_row["since"]),
                            int(move_row["signals"] or 0), move_row.get("time_limit_min"), int(restart))
        info = JobInfo(
            dlsub_id=row.dlsub_id, slurm_job_id=job.job_id, user=job.user, state=job.state,
            reason=job.reason, ended=new_state.terminal, partition=job.partition, mode=str(request.get("mode")),
            ideal_partition=ideal_name, gpus_wanted=gpus_wanted, gpus_now=job.gpus_per_node,
            submit_time=float(job.submit_time), start_time=float(job.start_time),
            end_time=float(job.end_time) if job.state == "RUNNING" else 0.0, held=job.held,
            checkpointable=progress.checkpoints > 0, last_checkpoint_time=progress.last_checkpoint_time,
            eta_s=progress.eta_s(), finished=bool(progress.finished and job.state != "RUNNING"),
            last_attempt_action=attempts.last_end_action,
            continuations=int(data.get("continuations") or 0),
            backfilled_from=data.get("backfilled_from"), backfilled_limit_min=data.get("backfilled_limit_min"),
            time_limit_min=request.get("time_limit_min"), move=move, uid=row.uid,
            restart_count=job.restart_count, requeues=attempts.requeues, ran_s=progress.ran_s,
            gang=job.node_count > 1 or bool(request.get("nodes")) or bool(job.extra.get("het_job_id")),
        )
        data["partition"] = job.partition
        if job.state == "RUNNING" and data.get("attempt_seen") != job.restart_count:
            data["attempt_seen"] = job.restart_count
            writes.attempts.append({
                "uid": row.uid, "slurm_job_id": job.job_id, "restart": job.restart_count, "dlsub_id": row.dlsub_id,
                "partition": job.partition, "nodes": job.nodes, "first_seen": now,
                "start_time": float(job.start_time), "state": job.state,
            })
        sample = [progress.step, progress.last_checkpoint_step, progress.checkpoints]
        if progress.step is not None and data.get("sample") != sample:
            data["sample"] = sample
            writes.progress.append({
                "uid": row.uid, "slurm_job_id": job.job_id, "dlsub_id": row.dlsub_id, "time": now,
                "step": progress.step, "eta_s": info.eta_s, "steps_per_s": progress.steps_per_s,
                "checkpoint_step": progress.last_checkpoint_step, "partition": job.partition,
            })
        self._changed(row, before, writes)
        return info

    @staticmethod
    def _changed(row: JobRow, before: tuple[dict[str, Any], str | None], writes: Writes) -> None:
        if (row.data, row.state) != before:
            writes.jobs[row.key()] = row

    def _read_files(self, row: JobRow, job: SlurmJob, dlsub_id: str, now: float, writes: Writes) -> bool:
        """Fold what was appended to the job's progress and attempt files since last time into its row.

        False: they could not be read (the reason is recorded once); the row keeps its last summary.
        """
        data = row.data
        if "job_dir" not in data:
            found = job_dir_of(job, dlsub_id)
            data["job_dir"] = str(found) if found else None  # fixed at first sight
        job_dir = data.get("job_dir")
        if not job_dir:
            self._once(row, "files", "Slurm's record of this job names no job directory called "
                       f"{dlsub_id} for its output: progress is not read", now, writes, "skipped")
            return False
        cursors = dict(data.get("files") or {})
        progress = ProgressSummary.from_dict(data.get("progress"))
        attempts = AttemptsSummary.from_dict(data.get("attempts"), job.job_id)
        fed = {PROGRESS_FILE: False, ATTEMPTS_FILE: False}
        dropped: list[str] = []
        try:
            dir_fd = open_dir(Path(job_dir), row.uid)
            try:
                for name, check, summary in ((PROGRESS_FILE, check_progress_event, progress),
                                             (ATTEMPTS_FILE, check_attempt_event, attempts)):
                    chunk = read_new_lines(dir_fd, name, row.uid, Cursor.from_dict(cursors.get(name)))
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
                    cursors[name] = cursor.to_dict() if cursor else None
            finally:
                os.close(dir_fd)
        except Unreadable as exc:
            self._once(row, "files", f"not read this tick: {exc.reason}", now, writes, "skipped")
            return False
        if cursors != data.get("files"):
            data["files"] = cursors
        if fed[PROGRESS_FILE] or "progress" not in data:
            data["progress"] = progress.to_dict()
        if fed[ATTEMPTS_FILE] or "attempts" not in data:
            data["attempts"] = attempts.to_dict()
        if dropped:
            self._once(row, "dropped", "read in part: " + "; ".join(dropped), now, writes, "skipped")
        said = data.get("said") or {}
        if said.get("files"):
            # Readable again: the same trouble later is worth saying again.
            data["said"] = {k: v for k, v in said.items() if k != "files"}
        return True

    # ---------------------------------------------------------------- act
    def _prepare(self, action: Action, now: float, writes: Writes) -> bool:
        """Write-ahead: record the decision (and a move's intent) before acting. False: nothing to do in Slurm."""
        seen = self._seen[action.slurm_job_id]
        row, job = seen.row, seen.job
        key = row.key()
        if action.kind == move_rules.NOTE:
            if row.data.get("last_note") != action.reason:
                row.data["last_note"] = action.reason
                writes.jobs[key] = row
                writes.decide(now, row.uid, row.dlsub_id, job.job_id, row.user, "wait", action.reason, action.details)
            return False
        if action.kind in (move_rules.SIGNAL_MOVE, move_rules.SIGNAL_CONTINUE):
            if seen.info is not None and seen.info.move is None:
                kind = (
                    "continue"
                    if action.kind == move_rules.SIGNAL_CONTINUE
                    else str(action.details.get("kind") or "move")
                )
                writes.moves[key] = {
                    "uid": row.uid, "slurm_job_id": job.job_id, "dlsub_id": row.dlsub_id, "kind": kind,
                    "phase": MovePhase.PLANNED.value, "target_partition": action.partition or "",
                    "target_gpus": action.gpus or 0, "since": now, "signals": 0, "created": now,
                    "time_limit_min": action.time_limit_min, "restart_count": job.restart_count,
                }
                if kind == "continue":
                    row.data["continuations"] = int(row.data.get("continuations") or 0) + 1
                    writes.jobs[key] = row
                writes.decide(now, row.uid, row.dlsub_id, job.job_id, row.user, kind, action.reason, action.details)
            return True
        if action.kind in (move_rules.FINISH_MOVE, move_rules.ABANDON_MOVE):
            move = seen.info.move if seen.info is not None else None
            writes.ended_moves.add(key)
            writes.moves.pop(key, None)
            if move is not None and move.kind == "return":
                row.data["backfilled_from"] = None
                writes.jobs[key] = row
            what = "done" if action.kind == move_rules.FINISH_MOVE else "abandoned"
            writes.decide(now, row.uid, row.dlsub_id, job.job_id, row.user,
                          f"{move.kind if move else 'move'}-{what}", action.reason)
            return False
        if action.kind == move_rules.BACKFILL:
            # Where it came from and its own limit are known before it leaves.
            row.data["backfilled_from"] = job.partition
            row.data["backfilled_limit_min"] = seen.request.get("time_limit_min")
            writes.jobs[key] = row
            writes.decide(now, row.uid, row.dlsub_id, job.job_id, row.user, "backfill", action.reason,
                          action.details)
            return True
        return action.kind in (move_rules.RETARGET, move_rules.RELEASE)

    def _perform(self, action: Action, now: float, writes: Writes) -> None:
        """Carry out one action in Slurm and note the move's new phase."""
        seen = self._seen[action.slurm_job_id]
        key, job_id = seen.row.key(), action.slurm_job_id
        move = self.store.move(*key) if action.kind != move_rules.BACKFILL else None
        if action.kind in (move_rules.SIGNAL_MOVE, move_rules.SIGNAL_CONTINUE):
            signal = CHECKPOINT_SIGNAL if action.kind == move_rules.SIGNAL_CONTINUE else MOVE_SIGNAL
            self.client.cancel(job_id, signal=signal, batch=True)
            if action.kind == move_rules.SIGNAL_MOVE:
                failpoints.reach("move-signal-sent")
            if move is not None:
                writes.moves[key] = {**move, "phase": MovePhase.SIGNALLED.value, "since": now,
                                     "signals": int(move["signals"] or 0) + 1}
        elif action.kind in (move_rules.RETARGET, move_rules.BACKFILL):
            self.client.retarget(job_id, action.partition or "", action.gpus or 0, action.time_limit_min)
            if action.kind == move_rules.RETARGET:
                failpoints.reach("move-updated")
            if move is not None:
                writes.moves[key] = {**move, "phase": MovePhase.UPDATED.value}
        elif action.kind == move_rules.RELEASE:
            self.client.release(job_id)
            if move is not None:
                writes.moves[key] = {**writes.moves.get(key, move), "phase": MovePhase.RELEASED.value, "since": now}
        else:
            raise ValueError(f"unknown action {action.kind}")

    # ---------------------------------------------------------------- resize
    def _plan_resizes(self, seen: Observation, now: float, writes: Writes) -> list[Resize]:
        """This tick's grow/shrink/end-workers actions, each recorded (write-ahead) with its reason: first
        the ones a crash left planned and not done, then the new ones."""
        resumed, jobs = self._recover_resizes(seen, now, writes)
        # Still running while it checkpoints with its group: its GPUs count as given back already.
        jobs = [dataclasses.replace(j, workers=tuple(dataclasses.replace(w, leaving=w.handle in self._leaving)
                                                     for w in j.workers)) for j in jobs]
        planned = list(resumed)
        by_id = {(j.uid, j.dlsub_id): j for j in jobs}
        for resize in resize_rules.plan_resizes(jobs, seen.rooms, self.rules.policy, self._size_by_policy(seen, now)):
            job = next(j for (uid, did), j in by_id.items() if did == resize.dlsub_id)
            writes.decide(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, resize.kind, resize.reason,
                          {"worker": resize.worker, "partition": resize.partition, "nodes_before": job.nodes_now})
            if resize.kind in _WRITTEN_AHEAD and resize.worker is not None:
                writes.resizes[resize.worker] = ResizeRow(
                    resize.worker, job.uid, job.dlsub_id, job.slurm_job_id, resize.kind, ResizePhase.PLANNED, now,
                    resize.reason, resize.partition, resize.batch_size, resize.accumulation_steps)
            planned.append(resize)
        return planned

    def _recover_resizes(self, seen: Observation, now: float,
                         writes: Writes) -> tuple[list[Resize], list[ElasticJob]]:
        """The resizes in flight from the store: the workers still leaving (``_leaving``, kept across a
        restart), and the grows a crash left written ahead and not done, to be done now (and not planned
        again). Returns those grows and the elastic jobs as the planner must see them (a resumed grow's
        worker counted as released already, its GPUs as taken)."""
        rows = self.store.resizes()
        self._leaving = {}
        tasks = {w.handle: (j, w) for j in seen.elastic for w in j.workers}
        resumed: list[Resize] = []
        taken: list[tuple[str, int]] = []
        for worker, row in rows.items():
            job, task = tasks.get(worker, (None, None))
            if row.phase == ResizePhase.PLANNED and row.kind == resize_rules.SHRINK:
                # The signal may or may not have gone before the crash: counted as leaving since it was
                # planned, so it is never sent twice within the wait, and sent again after it if still needed.
                row = dataclasses.replace(row, phase=ResizePhase.LEAVING)
                writes.resizes[worker] = row
            if row.phase == ResizePhase.LEAVING:
                if now - row.since < LEAVE_WAIT_S:
                    self._leaving[worker] = row.since
                else:
                    writes.ended_resizes.add(worker)
                continue
            if (job is None or task is None or job.uid != row.uid or job.state != "RUNNING" or job.ended
                    or job.moving or not resize_rules.usable_worker(task, job)):
                # Released before the crash (no longer held), or moot now: nothing left to do.
                writes.ended_resizes.add(worker)
                continue
            resumed.append(Resize(row.kind, row.dlsub_id, row.slurm_job_id, row.reason, worker, row.partition,
                                  row.batch_size, row.accumulation_steps))
            taken.append((job.partition, job.gpus_per_node))
        if resumed:
            seen.rooms = _reserve(seen.rooms, taken)
        on_way = {r.worker for r in resumed}
        jobs = [dataclasses.replace(j, workers=tuple(dataclasses.replace(w, reason="None") if w.handle in on_way
                                                     else w for w in j.workers)) for j in seen.elastic]
        return resumed, jobs

    def _size_by_policy(self, seen: Observation, now: float) -> resize_rules.SizeByPolicy | None:
        """With an elastic policy that learns from what jobs report (``goodput``), the sizing step that
        runs it on each elastic job's fitted model; None otherwise (the policy only orders growth)."""
        if self._sizing_policy is None:
            return None
        policy = self._sizing_policy
        self._models.forget_except({j.dlsub_id for j in seen.elastic})
        limit = self.rules.max_gpus_per_user
        headroom = {uid: max(0, limit - usage.gpus) for uid, usage in seen.usage.items()}

        def size(jobs: Sequence[ElasticJob], room: Room) -> list[Resize]:
            scaled = []
            for job in jobs:
                try:
                    scaled.append(self._models.scaled(job, seen.elastic_progress.get(job.dlsub_id) or Progress(),
                                                      now, headroom.get(job.uid, limit)))
                except Exception:  # one job's reports cost that job its resizes, never the others'
                    log.exception("job %s: no model from its reports this tick; it keeps its size", job.dlsub_id)
            try:
                return plan_by_policy(scaled, room, policy, now, headroom)
            except Exception:  # a bad model costs this partition its resizes this tick, never the tick
                log.exception("sizing the elastic jobs of %s failed; no resizes there this tick", room.name)
                return []
        return size

    def _tell_batch(self, job: ElasticJob, resize: Resize, now: float, outcome: Writes) -> None:
        """Leave the batch the policy picked in the job's mailbox before it resizes (it reads it as it
        restarts); a mailbox that cannot be written costs the job only the new batch."""
        assert resize.batch_size is not None and resize.accumulation_steps is not None
        job_dir = self._elastic_dirs.get(job.dlsub_id)
        try:
            if not job_dir:
                raise MailboxError("no job directory is known for it")
            publish_batch(Path(job_dir), job.uid, resize.batch_size, resize.accumulation_steps, resize.reason)
        except (MailboxError, ValueError) as exc:
            outcome.decide(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, "skipped",
                           f"the new batch size ({resize.batch_size}) was not told to the job: {exc}; it "
                           "keeps the batch it has")

    def _resize(self, resize: Resize, now: float, outcome: Writes) -> bool:
        """Carry out one resize in Slurm and note its outcome; False: it failed (recorded as an error)."""
        job = next(j for j in self._last_elastic if j.dlsub_id == resize.dlsub_id)
        try:
            assert resize.worker is not None
            if resize.batch_size is not None and resize.accumulation_steps is not None:
                self._tell_batch(job, resize, now, outcome)
            if resize.kind == resize_rules.GROW:
                self.client.release(resize.worker)
                failpoints.reach("grow-released")
                outcome.ended_resizes.add(resize.worker)  # Slurm shows it released from now on
            elif resize.kind == resize_rules.SHRINK:
                self.client.signal_task(resize.worker, MOVE_SIGNAL)
                failpoints.reach("shrink-signal-sent")
                self._leaving[resize.worker] = now
                outcome.resizes[resize.worker] = ResizeRow(
                    resize.worker, job.uid, job.dlsub_id, job.slurm_job_id, resize.kind, ResizePhase.LEAVING, now,
                    resize.reason, resize.partition)
            elif resize.kind == resize_rules.END_WORKERS:
                self.client.cancel(int(resize.worker))
            log.info("%s %s (worker %s): %s", resize.kind, resize.dlsub_id, resize.worker, resize.reason)
            return True
        except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
            if resize.kind in _WRITTEN_AHEAD and resize.worker is not None:
                outcome.ended_resizes.add(resize.worker)  # not done: decided afresh next tick
            outcome.decide(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, "error",
                           f"{resize.kind} failed: {exc}")
            log.warning("%s %s failed: %s", resize.kind, resize.dlsub_id, exc)
            return False

    # ---------------------------------------------------------------- tick
    def tick(self, now: float | None = None) -> list[Action]:
        now = self.clock() if now is None else now
        started = self.deadline_clock()
        deadline = started + self.policy.tick_deadline_s
        self.store.set_meta(last_tick_started=now, doing="observing")
        try:
            # The queue brief, dlsub's jobs (and the ones it has rows or moves for) whole.
            follow = {key[1] for key in self.store.jobs()} | {int(m["slurm_job_id"]) for m in self.store.moves()}
            slurm_jobs = self._queue.read(follow)
            partitions = self.client.partitions()
        except SlurmError as exc:
            # Stale data: decide nothing this tick; the loop goes on.
            self.store.set_meta(doing=f"waiting for Slurm: {exc}", last_tick=now, last_error=str(exc))
            log.warning("observe failed: %s", exc)
            return []
        writes = Writes()
        seen = self.observe(now, slurm_jobs, partitions, writes, deadline)
        self._last_elastic = seen.elastic
        self._elastic_dirs = seen.elastic_dirs
        actions = move_rules.plan(seen.jobs, seen.partitions, self.rules, now, seen.window, seen.usage)
        todo: list[Action] = []
        done: list[Action] = []
        for action in actions:
            if action.slurm_job_id not in self._seen:
                continue
            if self._prepare(action, now, writes):
                todo.append(action)
            else:
                done.append(action)
        # GPUs this tick's moves and backfills are about to take are not idle for growth.
        seen.rooms = _reserve(seen.rooms, [(a.partition, a.gpus) for a in actions if a.kind in _TAKES_GPUS])
        resizes = self._plan_resizes(seen, now, writes)
        self.store.write(writes)  # what was observed and decided, before anything is done about it
        outcome = Writes()
        resized: list[Resize] = []
        for resize in resizes:
            failpoints.reach(_BEFORE.get(resize.kind, ""))
            if self._resize(resize, now, outcome):
                resized.append(resize)
        for action in todo:
            seen_job = self._seen[action.slurm_job_id]
            failpoints.reach(_BEFORE.get(action.kind, ""))
            try:
                self._perform(action, now, outcome)
                done.append(action)
                log.info("%s %s (Slurm %s): %s", action.kind, action.dlsub_id, action.slurm_job_id, action.reason)
            except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
                row = seen_job.row
                outcome.decide(now, row.uid, row.dlsub_id, action.slurm_job_id, row.user, "error",
                               f"{action.kind} failed: {exc}")
                log.warning("%s %s failed: %s", action.kind, action.dlsub_id, exc)
        in_flight = self.store.moves()
        # Every user reads this through `dlsub agent status`: counts only, no job of anyone's by name
        # (each user sees their own moves in moves_in_flight).
        kinds = collections.Counter(str(m["kind"]) for m in in_flight)
        doing = f"watching {len(seen.jobs)} dlsub job(s)"
        if kinds:
            doing += "; in flight: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        if seen.window.open:
            doing += f"; off-hours window '{seen.window.name}' open"
        if seen.late:
            doing += f"; late: {seen.skipped} job(s) left for the next tick"
        if self._queue.unseen:
            doing += f"; {self._queue.unseen} queued job(s) not read yet (a few hundred a tick)"
        outcome.meta = {"last_tick": now, "doing": doing, "jobs": len(seen.jobs), "last_error": None,
                        "late": seen.late, "skipped": seen.skipped,
                        "last_tick_duration_s": round(self.deadline_clock() - started, 3)}
        self.store.write(outcome)
        for action in done:
            failpoints.reach(_AFTER.get(action.kind, ""))
        for resize in resized:
            failpoints.reach(_AFTER.get(resize.kind, ""))
        try:
            self.store.prune(now, self.policy.retention.progress_days, self.policy.retention.decisions_days)
        except Exception as exc:  # noqa: BLE001 - pruning can wait for the next hour
            log.warning("pruning old progress and decisions failed: %s", exc)
        return done
