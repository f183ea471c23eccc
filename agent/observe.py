"""Observe: every job from one ``squeue`` and the partitions from one ``sinfo``, and what the planners get.

Who may own each dlsub id, which jobs are followed, their files read in a
fair order within the tick's deadline, what waiting jobs want per partition,
and the elastic jobs with their workers (see :mod:`dlsub.agent.identify`
for what the agent trusts).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dlsub.agent.budget_watch import BudgetWatch
from dlsub.agent.identify import (
    Seen,
    identify,
    ignore,
    may_claim,
    nodes_of,
    once,
    read_files,
    worker_request,
    worker_task,
)
from dlsub.agent.job_data import JobData
from dlsub.agent.records import MoveRow
from dlsub.agent.store_rows import Binding, JobRow, NewBinding, StoreSnapshot, Writes
from dlsub.contract import IllegalTransition, JobState
from dlsub.job_progress import MeasuredConfig, Progress, ProgressSummary
from dlsub.policies.actions.gpu_kind_rules import kinds_to_choose
from dlsub.policies.actions.move_views import Asked, History, JobInfo, Reported, Rules, Usage, WindowState
from dlsub.policies.actions.partition_per_model import model_partitions
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob, WorkerTask
from dlsub.policies.api import IdleNode
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.models import Partition, SlurmJob, user_groups

log = logging.getLogger("dlsub.agent")

_LIVE = (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED)
# Pending jobs that wait for nodes, and would start on idle ones: only they hold back growth, count
# against moves, or shrink an elastic job. One pending for its QOS, association, a reservation, a
# dependency or a node that is down would not start anyway, and must not shrink anybody.
_WAITING_FOR_NODES = ("Resources", "Priority", "None", "")


@dataclass(frozen=True)
class Observation:
    """What one tick saw: Slurm's answers, the job files and the store as read at its start. Nothing after the
    observe step changes it (its collections are read-only types, so mypy says where something tries)."""

    jobs: tuple[JobInfo, ...]
    # Each partition as the move and resize rules see it (its idle nodes, what waits there, its policy).
    partitions: tuple[PartitionView, ...]
    window: WindowState
    # The store as the tick read it (once, at its start), and what observing changed in the agent's rows:
    # the first part of the tick's write-ahead (prepare adds the plan's to a copy of it).
    store: StoreSnapshot
    changes: Writes
    usage: Mapping[int, Usage] = field(default_factory=dict)
    skipped: int = 0
    late: bool = False
    elastic: tuple[ElasticJob, ...] = ()
    # What each elastic main job reported, by dlsub id (an elastic policy's models are fitted from it),
    # and its job directory (where its mailbox is).
    elastic_progress: Mapping[str, Progress] = field(default_factory=dict)
    elastic_dirs: Mapping[str, str] = field(default_factory=dict)
    # The jobs followed and observed this tick, by Slurm job id (what the act step writes ahead about).
    followed: Mapping[int, Seen] = field(default_factory=dict)
    # Rows the agent no longer needs (forgotten_rows), dropped once the tick is written.
    forgettable: tuple[tuple[int, int], ...] = ()
    # The kind of GPU of each node whose GRES names one kind (``gpu:a100:4``), by node name; untyped nodes
    # are not in it.
    node_types: Mapping[str, str] = field(default_factory=dict)
    # What the followed jobs that are not elastic measured on a named kind of GPU (:func:`kind_runs`).
    kind_runs: tuple[KindRun, ...] = ()


@dataclass(frozen=True)
class KindRun:
    """What one followed job that is not elastic measured on GPUs of a named kind: a `dlsub estimate`
    profiling run of a partition's kind, or any fixed-size run. Its command's later elastic jobs learn a kind
    from it as from an earlier elastic run (:meth:`~dlsub.agent.live_models.LiveModels.learn`)."""

    uid: int
    partition: str
    dlsub_id: str
    application: str  # the command's digest, from its start event
    configs: tuple[MeasuredConfig, ...]  # the configurations it measured on a named kind only
    grads: tuple[float, float] | None


def kind_runs(followed: list[Seen], typed_partitions: set[str]) -> tuple[KindRun, ...]:
    """The followed jobs that are not elastic and measured something on a named kind of GPU in one of
    ``typed_partitions`` (those whose nodes name two or more kinds, and a site's partitions of one model each),
    with their command (what their start event digested). Untyped runs, and runs elsewhere, are left out: a
    fixed-size run lends only to the kinds a typed policy chooses among."""
    out = []
    for seen in followed:
        summary = seen.row.data.progress
        if (seen.job.partition not in typed_partitions or seen.request.elastic_main or seen.request.role != "main"
                or summary is None or summary.application is None
                or not any("@" in key for key in summary.measured)):
            continue  # the cheap checks first: this runs for every followed job each tick
        configs = tuple(c for c in summary.measured_configs() if c.gpu_type)
        grads = None if summary.grads is None else (summary.grads[0], summary.grads[1])
        if configs:
            out.append(KindRun(seen.row.uid, seen.job.partition, seen.request.dlsub_id, summary.application,
                               configs, grads))
    return tuple(out)


@dataclass(frozen=True, order=True)
class _Claim:
    """One job's claim on a dlsub id. Ordered by who wins it: a record-backed claim before a comment-only one,
    then the earliest submit, then the lowest Slurm job id."""

    comment_only: bool
    submit_time: int
    slurm_job_id: int
    uid: int
    source: str  # "record" or "comment"


@dataclass
class _Queue:
    """The queue of one tick, sorted (see :func:`_sort_queue`)."""

    candidates: list[Seen] = field(default_factory=list)  # dlsub jobs the agent may follow, identified
    workers: dict[tuple[int, str], list[WorkerTask]] = field(default_factory=dict)  # by (uid, dlsub id)
    worker_ids: set[int] = field(default_factory=set)
    usage: dict[int, Usage] = field(default_factory=dict)  # every live job's GPUs, by uid
    # Who may own each id. dlsub submits an elastic job's worker array before its main job, so the workers'
    # claim counts too: their public comment shows the id first, and another user must not take it with a
    # main job of their own.
    claims: dict[str, list[_Claim]] = field(default_factory=dict)


@dataclass(frozen=True)
class ObserveWith:
    """What the observe step reads besides Slurm's answers and the store, and what it keeps from one tick to the
    next."""

    policy: AgentPolicy
    rules: Rules
    budgets: BudgetWatch
    deadline_clock: Callable[[], float]  # real elapsed time, for the tick's deadline
    # When each followed job's files were last read (deadline clock): the least recently read go first.
    # The agent's memory (a restart starts it afresh); the entries of jobs no longer followed are dropped.
    last_read: dict[tuple[int, int], float]


def window_at(policy: AgentPolicy, now: float) -> WindowState:
    best = WindowState(False)
    for window in policy.backfill.windows:
        is_open, change = window.state(now)
        if is_open and (not best.open or (change or 1e18) < (best.closes_at or 1e18)):
            best = WindowState(True, window.name, change)
    return best


def observe(ctx: ObserveWith, store: StoreSnapshot, slurm_jobs: list[SlurmJob], partitions: list[Partition],
            now: float, deadline: float) -> Observation:
    """What Slurm and the job files show this tick, beside the store as the tick read it (``store``); what
    changed in the agent's rows is the observation's ``changes``."""
    writes = Writes()
    rows = store.jobs
    bindings = dict(store.bindings)  # this tick's bindings are added to it
    moves = store.moves
    known = {p.name: p for p in partitions}
    queue = _sort_queue(slurm_jobs, rows, bindings, moves)
    _bind(queue, bindings, now, writes)
    followed: list[Seen] = []
    for seen in queue.candidates:
        owner = bindings[seen.request.dlsub_id].uid
        if owner != seen.row.uid:
            ignore(seen, owner, now, writes)
        else:
            followed.append(seen)
    observed, skipped, late = _observe_followed(ctx, followed, moves, known, now, writes, deadline)
    waiting = _waiting(ctx.rules, slurm_jobs, moves, queue.worker_ids, known)
    views = tuple(waiting.view(p, ctx.policy) for p in partitions)
    infos = [s.info for s in observed if s.info is not None]
    accounts = {s.job.job_id: str(s.job.extra.get("account") or "") for s in observed}
    infos = _barred(ctx.budgets.attach(infos, accounts, now), accounts, partitions)
    node_types = {n.name: n.gpu_type for p in partitions for n in p.nodes if n.gpu_type}
    elastic = _elastic_jobs(followed, queue.workers, rows, bindings, moves, node_types)
    mains = [s for s in followed if s.request.elastic_main]
    elastic_progress = {s.request.dlsub_id: (s.row.data.progress or ProgressSummary()).progress() for s in mains}
    elastic_dirs = {s.request.dlsub_id: s.row.data.job_dir for s in mains if s.row.data.job_dir}
    # Only where the site sizes jobs across kinds is what fixed-size runs measured on a kind of any use.
    typed: set[str] = set()
    if ctx.policy.goodput.across_gpu_types:
        site = model_partitions(views)
        typed = {v.name for v in views if kinds_to_choose(v)} | (set(site.names) if site is not None else set())
    _mark_lost(rows, slurm_jobs, moves, queue.workers, writes)
    return Observation(
        jobs=tuple(infos), partitions=views, window=window_at(ctx.policy, now), store=store, changes=writes,
        usage=queue.usage, skipped=skipped, late=late, elastic=tuple(elastic),
        elastic_progress=elastic_progress, elastic_dirs=elastic_dirs, followed={s.job.job_id: s for s in observed},
        forgettable=tuple(forgotten_rows(rows, slurm_jobs, moves, queue.workers)), node_types=node_types,
        kind_runs=kind_runs(followed, typed))


def forgotten_rows(rows: Mapping[tuple[int, int], JobRow], slurm_jobs: list[SlurmJob],
                   moves: Mapping[tuple[int, int], MoveRow],
                   workers: dict[tuple[int, str], list[WorkerTask]]) -> list[tuple[int, int]]:
    """The rows of jobs that ended and that Slurm no longer lists (it purges an ended job after MinJobAge),
    with no move in flight and no worker task of their dlsub id still queued (those are ended through the
    row, _elastic_jobs): nothing the agent decides reads them again. Kept, every tick loaded them all (0.16 s
    of a 0.22 s tick with 1,254 rows), so a tick grew with every job the agent ever followed. What users read
    of an ended job stays: its decisions (`dlsub why`, pruned by their own retention) and their own store
    (`dlsub status`). A row whose job Slurm lost before the agent saw it end is kept (it never ended here)."""
    listed = {(job.user_id, job.job_id) for job in slurm_jobs if job.user_id is not None}
    return [key for key, row in rows.items()
            if row.state is not None and row.state.terminal and key not in listed and key not in moves
            and (row.uid, row.dlsub_id) not in workers]


def _mark_lost(rows: Mapping[tuple[int, int], JobRow], slurm_jobs: list[SlurmJob],
               moves: Mapping[tuple[int, int], MoveRow],
               workers: dict[tuple[int, str], list[WorkerTask]], writes: Writes) -> None:
    """Rows last seen live whose job Slurm no longer lists under any user (the agent was down longer than
    MinJobAge, or the job ran and was purged between two ticks) become UNKNOWN: the metrics and pages
    count them so, not as the PENDING or RUNNING of their last sight. Kept, as forgotten_rows says."""
    listed = {job.job_id for job in slurm_jobs}
    for key, row in rows.items():
        if (row.state is not None and row.state.live and row.slurm_job_id not in listed and key not in moves
                and (row.uid, row.dlsub_id) not in workers):
            writes.jobs[key] = JobRow(row.uid, row.slurm_job_id, row.dlsub_id, row.user, JobState.UNKNOWN, row.data)


def _idle_nodes(partition: Partition) -> tuple[IdleNode, ...]:
    """What each usable node of the partition has idle."""
    return tuple(IdleNode(n.name, n.idle_gpus, n.idle_cpus, n.free_memory_mb, n.gpu_type)
                 for n in partition.nodes if n.usable)


def _sort_queue(slurm_jobs: list[SlurmJob], rows: Mapping[tuple[int, int], JobRow], bindings: Mapping[str, Binding],
                moves: Mapping[tuple[int, int], MoveRow]) -> _Queue:
    """The queue sorted: elastic jobs' worker tasks apart, the other dlsub jobs identified, every live
    job's GPUs charged to its user, and the workers' record-backed claims on their ids."""
    queue = _Queue()
    usage = queue.usage
    for job in slurm_jobs:
        uid = job.user_id
        if uid is None:
            continue
        state = job.dlsub_state
        worker = worker_request(job, uid)
        if worker is not None:
            # An elastic job's worker task: part of its main job (same uid, same id), never planned alone.
            queue.worker_ids.add(job.job_id)
            task = worker_task(job)
            if task is not None:
                queue.workers.setdefault((uid, worker.dlsub_id), []).append(task)
            if state in _LIVE and not job.held:
                old = usage.get(uid, Usage())
                usage[uid] = Usage(old.gpus + job.gpus_per_node * max(1, job.node_count), old.jobs + 1)
            dlsub_id = worker.dlsub_id
            if worker.source == "record" and may_claim(bindings.get(dlsub_id), worker):
                claim = _Claim(False, job.submit_time, job.job_id, uid, "record")
                queue.claims.setdefault(dlsub_id, []).append(claim)
            continue
        if state in _LIVE:
            gpus = job.gpus_per_node * max(1, job.node_count)
            move = moves.get((uid, job.job_id))
            if move is not None:
                gpus = max(gpus, move.target_gpus * max(1, job.node_count))
            old = usage.get(uid, Usage())
            usage[uid] = Usage(old.gpus + gpus, old.jobs + 1)
        seen = identify(job, uid, rows)
        if seen is not None:
            queue.candidates.append(seen)
    return queue


def _bind(queue: _Queue, bindings: dict[str, Binding], now: float, writes: Writes) -> None:
    """Bind each dlsub id to the uid that submitted it (``bindings`` updated, the new ones written).

    A submit record (job_submit.lua) is the proof of that; a comment is only a claim, which anyone can
    edit into an old job of theirs the moment they see a new id in squeue. So a record-backed claim takes
    an id from a comment-only owner, never the other way round; among equals the earliest submit (then
    the lowest job id) wins.
    """
    for seen in queue.candidates:
        dlsub_id = seen.request.dlsub_id
        if may_claim(bindings.get(dlsub_id), seen.request):
            record = seen.request.source == "record"
            source = "record" if record else "comment"
            queue.claims.setdefault(dlsub_id, []).append(
                _Claim(not record, seen.job.submit_time, seen.job.job_id, seen.row.uid, source))
    for dlsub_id, group in queue.claims.items():
        won = min(group)
        bindings[dlsub_id] = Binding(won.uid, won.source)
        writes.bindings.append(NewBinding(dlsub_id, won.uid, won.slurm_job_id, now, won.source))


def _observe_followed(ctx: ObserveWith, followed: list[Seen], moves: Mapping[tuple[int, int], MoveRow],
                      known: dict[str, Partition], now: float, writes: Writes,
                      deadline: float) -> tuple[list[Seen], int, bool]:
    """Each followed job observed, its files read in a fair order until the deadline. Returns the jobs
    observed, how many were skipped (those whose files could not be read included), and whether the
    deadline passed."""
    observed: list[Seen] = []
    skipped, unread, late = 0, 0, False
    live = {seen.row.key() for seen in followed}
    for key in [key for key in ctx.last_read if key not in live]:
        del ctx.last_read[key]
    for seen in _fair_order(ctx.last_read, followed):
        try:
            # A job that has never run has written nothing yet: its files are not worth a read.
            ran = seen.job.state != "PENDING" or seen.job.restart_count > 0
            if not ran:
                read = False
            elif ctx.deadline_clock() > deadline:
                late = True
                skipped += 1
                read = False
            else:
                read = True
                ctx.last_read[seen.row.key()] = ctx.deadline_clock()
            info, files_unread = _observe_job(ctx.policy, seen, moves.get(seen.row.key()), known, now, writes,
                                              read)
            unread += files_unread
        except Exception as exc:
            log.exception("observing Slurm job %s failed", seen.job.job_id)
            once(seen.row, "failed", f"observing this job failed ({type(exc).__name__}: {exc}); "
                 "skipped this tick", now, writes, "skipped")
            skipped += 1
            continue
        if info is not None:
            observed.append(dataclasses.replace(seen, info=info))
    return observed, skipped + unread, late


def _barred(infos: list[JobInfo], accounts: Mapping[int, str], partitions: list[Partition]) -> list[JobInfo]:
    """``infos`` with the partitions Slurm would refuse each job (its user's groups, its account) filled in.
    Only where some partition restricts who may use it are the users' groups looked up."""
    if not any(p.allow_groups is not None or p.restricts_accounts for p in partitions):
        return infos
    groups = {user: user_groups(user) for user in {i.user for i in infos}}
    return [dataclasses.replace(i, barred=frozenset(
        p.name for p in partitions if p.refuses(groups[i.user], accounts.get(i.slurm_job_id) or None)))
        for i in infos]


@dataclass(frozen=True)
class Waiting:
    """What jobs waiting for nodes want, per partition: GPUs in all, the most on one node, and of those GPUs,
    the ones asked for as one kind (``gres:gpu:KIND:N``), per kind."""

    gpus: dict[str, int]
    per_node: dict[str, int]
    by_kind: dict[str, dict[str, int]]

    def view(self, partition: Partition, policy: AgentPolicy) -> PartitionView:
        """The partition as the move and resize rules see it: its idle nodes, what waits there, and what the
        policy file says of it."""
        name = partition.name
        return PartitionView(
            name, _idle_nodes(partition), self.gpus.get(name, 0), self.per_node.get(name, 0),
            tuple(sorted(self.by_kind.get(name, {}).items())), role=policy.role_of(name),
            speed=policy.speed_of(name), max_time_s=partition.max_time_min * 60.0 if partition.max_time_min else None,
            cost_per_node_hour=_price(policy, name))


def _waiting(rules: Rules, slurm_jobs: list[SlurmJob], moves: Mapping[tuple[int, int], MoveRow],
             worker_ids: set[int], known: dict[str, Partition]) -> Waiting:
    """What jobs waiting for nodes want (:class:`Waiting`). One user counts for at most the per-user GPU
    limit, so that a user's queue of jobs cannot shrink (or keep from growing) everybody else's."""
    by_user: dict[tuple[str, int, str], int] = {}  # (partition, uid, kind asked for or "")
    pending_per_node: dict[str, int] = {}
    for job in slurm_jobs:
        if (job.state == "PENDING" and not job.held and job.gpus_per_node and job.user_id is not None
                and (job.user_id, job.job_id) not in moves and job.job_id not in worker_ids
                and job.reason in _WAITING_FOR_NODES and _could_run(job, known)):
            wanted = job.gpus_per_node * max(1, job.node_count)
            for name in job.partition.split(","):
                key = (name, job.user_id, job.gpu_type_asked or "")
                by_user[key] = by_user.get(key, 0) + wanted
                pending_per_node[name] = max(pending_per_node.get(name, 0), job.gpus_per_node)
    per_user: dict[tuple[str, int], int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    # The per-user limit, typed requests first: a user's GPUs counted past it are none of any kind.
    for (name, uid, kind), wanted in sorted(by_user.items(), key=lambda item: item[0][2] == ""):
        counted = min(wanted, rules.max_gpus_per_user - per_user.get((name, uid), 0))
        per_user[(name, uid)] = per_user.get((name, uid), 0) + counted
        if kind and counted > 0:
            kinds = by_kind.setdefault(name, {})
            kinds[kind] = kinds.get(kind, 0) + counted
    pending_gpus: dict[str, int] = {}
    for (name, _), counted in per_user.items():
        pending_gpus[name] = pending_gpus.get(name, 0) + counted
    return Waiting(pending_gpus, pending_per_node, by_kind)


def _price(policy: AgentPolicy, partition: str) -> float:
    role = policy.partitions.get(partition)
    return role.cost_per_node_hour if role else 0.0


def _elastic_jobs(followed: list[Seen], workers: dict[tuple[int, str], list[WorkerTask]],
                  rows: Mapping[tuple[int, int], JobRow], bindings: Mapping[str, Binding],
                  moves: Mapping[tuple[int, int], MoveRow], node_types: dict[str, str]) -> list[ElasticJob]:
    """Elastic main jobs with their worker tasks (same uid and id only); and workers whose main job
    has ended, even when Slurm no longer lists it. A main job's GPU kind is its nodes' (``node_types``),
    where they all name the same one."""
    out: list[ElasticJob] = []
    mains: set[tuple[int, str]] = set()
    for seen in followed:
        rng = seen.request.members
        if rng is None or not seen.request.elastic_main:
            continue
        key = (seen.row.uid, seen.request.dlsub_id)
        mains.add(key)
        job = seen.job
        tasks = tuple(workers.get(key, ()))
        arrays = {int(t.handle.split("_")[0]) for t in tasks}
        # A job elastic in GPUs: each worker takes the step it asked for, or the GPUs Slurm gives its tasks
        # if those are more (they are what a node must have idle for it).
        step = max([seen.request.step, *(t.gpus for t in tasks)]) if seen.request.step else 0
        out.append(ElasticJob(
            dlsub_id=key[1], slurm_job_id=job.job_id, uid=key[0], user=job.user, state=job.state,
            ended=job.dlsub_state.terminal, partition=job.partition,
            gpus_per_node=job.gpus_per_node, min_members=int(rng[0]), max_members=int(rng[1]),
            submit_time=float(job.submit_time), worker_arrays=tuple(sorted(arrays)),
            workers=tasks, moving=seen.row.key() in moves, cpus_per_node=job.cpus_per_node,
            memory_per_node_mb=job.memory_per_node_mb, worker_gpus=step, main_nodes=nodes_of(job),
            gpu_type=_one_kind(nodes_of(job), node_types), start_time=float(job.start_time),
            waiting=job.state == "PENDING" and not job.held and job.reason in _WAITING_FOR_NODES,
            asked_gpu_type=job.gpu_type_asked, user_gpu_type=seen.request.gpu_type, pinned=seen.request.pinned,
            application=seen.request.application,
            finished=bool(seen.row.data.progress and seen.row.data.progress.finished)))
    ended = {(r.uid, r.dlsub_id): r for r in rows.values()
             if r.state is not None and r.state.terminal and not r.data.ignored}
    for key, orphans in workers.items():
        row = ended.get(key)
        bound = bindings.get(key[1])
        if key in mains or row is None or bound is None or bound.uid != key[0]:
            continue
        arrays = {int(t.handle.split("_")[0]) for t in orphans}
        out.append(ElasticJob(
            dlsub_id=key[1], slurm_job_id=row.slurm_job_id, uid=key[0], user=row.user, state=str(row.state),
            ended=True, partition="", gpus_per_node=0, min_members=1, max_members=2, submit_time=0.0,
            worker_arrays=tuple(sorted(arrays)), workers=tuple(orphans)))
    return out


def _one_kind(nodes: tuple[str, ...], node_types: dict[str, str]) -> str | None:
    """The GPU kind all these nodes have (None: none named, untyped, or several)."""
    kinds = {node_types.get(n) for n in nodes}
    return kinds.pop() if len(kinds) == 1 else None


def _could_run(job: SlurmJob, known: dict[str, Partition]) -> bool:
    """Whether some partition the job names has enough up nodes with as many GPUs as it wants per node."""
    kind = job.gpu_type_asked
    for name in job.partition.split(","):
        part = known.get(name)
        if part is not None and sum(1 for n in part.nodes if n.usable and n.gpus >= job.gpus_per_node
                                    and (kind is None or n.gpu_type == kind)) >= max(1, job.node_count):
            return True
    return False


def _fair_order(last_read: dict[tuple[int, int], float], jobs: list[Seen]) -> list[Seen]:
    """The order to read jobs' files in: one job of each user in turn, each user's least recently read
    first, so that many jobs of one user (or a few slow ones) cannot use up the deadline every tick."""
    by_uid: dict[int, list[Seen]] = {}
    for seen in sorted(jobs, key=lambda s: last_read.get(s.row.key(), 0.0)):
        by_uid.setdefault(seen.row.uid, []).append(seen)
    queues = sorted(by_uid.values(), key=lambda q: last_read.get(q[0].row.key(), 0.0))
    return [seen for turn in itertools.zip_longest(*queues) for seen in turn if seen is not None]


def _observe_job(policy: AgentPolicy, seen: Seen, move_row: MoveRow | None, known: dict[str, Partition],
                 now: float, writes: Writes, read: bool) -> tuple[JobInfo | None, bool]:
    """What the planner gets of one followed job (None: nothing to plan), and whether its files could not
    be read."""
    job, request = seen.job, seen.request
    row = seen.row
    # Fields are replaced, never changed in place, so a shallow copy tells what changed.
    before = row.data.copy(), row.state
    data = row.data
    data.request = request
    note, data.first_note = data.first_note, None
    if note:
        writes.record_decision(now, row.uid, row.dlsub_id, row.slurm_job_id, row.user, "trust", note)
    new_state = job.dlsub_state
    try:
        row.set_state(new_state)
    except IllegalTransition as exc:
        once(row, "state", f"Slurm shows this job {new_state.value} after {row.state}: {exc}; "
             "the agent leaves it alone", now, writes)
        _changed(row, before, writes)
        return None, False
    if new_state.terminal and move_row is None:
        if read and (before[1] is None or not before[1].terminal):
            # Its files once more as it ends: what it reported since the last tick (a `dlsub estimate` profile
            # of a few seconds may start and end between two ticks) is what its command's later jobs learn.
            read_files(row, job, request.dlsub_id, now, writes)
        _changed(row, before, writes)
        return None, False
    unread = read and not read_files(row, job, request.dlsub_id, now, writes)
    progress = (data.progress or ProgressSummary()).progress()
    attempts = data.attempts_summary(job.job_id)
    ideal_name = request.ideal or request.partition or job.partition
    if ideal_name not in known:
        ideal_name = job.partition
    ideal = known.get(ideal_name)
    per_node = ideal.max_gpus_per_node if ideal is not None else 0
    gpus_wanted = max(0, min(int(request.gpus or 0), policy.limits.max_gpus_per_job, per_node))
    move = None
    if move_row is not None:
        restart = move_row.restart_count
        if restart is None:
            # A move recorded before restart counts were (a migrated database): adopt Slurm's now.
            restart = job.restart_count - (1 if job.state == "PENDING" else 0)
            writes.moves[row.key()] = dataclasses.replace(move_row, restart_count=restart)
        move = move_row.view(restart)
    info = JobInfo(
        dlsub_id=row.dlsub_id, slurm_job_id=job.job_id, user=job.user, state=job.state,
        reason=job.reason, ended=new_state.terminal, partition=job.partition, gpus_now=job.gpus_per_node,
        submit_time=float(job.submit_time), start_time=float(job.start_time),
        end_time=float(job.end_time) if job.state == "RUNNING" else 0.0, held=job.held,
        asked=Asked(mode=str(request.mode), ideal_partition=ideal_name, gpus_wanted=gpus_wanted,
                    gpu_type=request.gpu_type, time_limit_min=request.time_limit_min, plain_script=request.plain),
        reported=Reported(
            # A loop that polls should_stop(), or a framework adapter, saves whenever asked: it need not have
            # checkpointed yet to be moved or continued.
            checkpointable=progress.checkpoints > 0 or bool(data.progress and data.progress.saves_on_request),
            last_checkpoint_time=progress.last_checkpoint_time,
            eta_s=progress.eta_s(), finished=bool(progress.finished and job.state != "RUNNING"),
            ran_s=progress.ran_s,
            # Told apart only from files read this tick (a start event is the file's first line): a job whose
            # files were not read keeps the benefit of the doubt.
            library_started=not (read and not unread and data.progress is not None and not data.progress.started)),
        history=History(
            last_attempt_action=attempts.last_end_action, continuations=data.continuations,
            backfilled_from=data.backfilled_from, backfilled_limit_min=data.backfilled_limit_min,
            requeues=attempts.requeues, launch_releases=data.launch_releases),
        move=move, uid=row.uid, restart_count=job.restart_count,
        gang=job.node_count > 1 or bool(request.members) or bool(job.extra.get("het_job_id")),
    )
    data.partition = job.partition
    if job.state == "RUNNING" and data.attempt_seen != job.restart_count:
        data.attempt_seen = job.restart_count
        writes.attempts.append({
            "uid": row.uid, "slurm_job_id": job.job_id, "restart": job.restart_count, "dlsub_id": row.dlsub_id,
            "partition": job.partition, "nodes": job.nodes, "first_seen": now,
            "start_time": float(job.start_time), "state": job.state,
        })
    sample = (progress.step, progress.last_checkpoint_step, progress.checkpoints)
    if progress.step is not None and data.sample != sample:
        data.sample = sample
        writes.progress.append({
            "uid": row.uid, "slurm_job_id": job.job_id, "dlsub_id": row.dlsub_id, "time": now,
            "step": progress.step, "eta_s": info.reported.eta_s, "steps_per_s": progress.steps_per_s,
            "checkpoint_step": progress.last_checkpoint_step, "partition": job.partition,
        })
    _changed(row, before, writes)
    return info, unread


def _changed(row: JobRow, before: tuple[JobData, JobState | None], writes: Writes) -> None:
    if (row.data, row.state) != before:
        writes.jobs[row.key()] = row
