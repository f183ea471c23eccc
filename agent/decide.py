"""Decide: one tick's :class:`Plan` from its :class:`~dlsub.agent.observe.Observation` (pure but for what the
agent's memory learns): the moves (:func:`dlsub.policies.actions.move_rules.plan`), the kinds waiting elastic
jobs are placed on, the resizes, and the resizes in flight a crash left in the store.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlsub.agent.live_models import LiveModels
from dlsub.agent.observe import Observation
from dlsub.agent.records import ResizePhase, ResizeRow
from dlsub.job_progress import Progress
from dlsub.policies.actions import move_rules, resize_rules
from dlsub.policies.actions.goodput_resize_rules import ScaledJob, plan_by_policy
from dlsub.policies.actions.gpu_kind_rules import (
    kinds_to_choose,
    place_waiting,
    plan_across_kinds,
    retype_waiting,
)
from dlsub.policies.actions.kinds import BOOKKEEPING, ActionKind
from dlsub.policies.actions.move_views import Action, JobInfo, Rules
from dlsub.policies.actions.partition_per_model import (
    ModelPartitions,
    model_partitions,
    moves_across_partitions,
    place_across_partitions,
    rewait,
    sizing_room,
)
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import ElasticJob, Resize
from dlsub.policies.api import Policy
from dlsub.site_config.policy_file import AgentPolicy

log = logging.getLogger("dlsub.agent")

def leave_wait_s(policy: AgentPolicy) -> float:
    """Seconds a worker told to leave has to checkpoint with its group and requeue itself before it is told
    again: the site's checkpoint grace (``checkpoint_grace_s``), the time any job is given to checkpoint when
    asked. A fixed two minutes made every lost shrink signal cost two minutes whatever the site's grace."""
    return policy.checkpoint_grace_s


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
        plain_scripts=policy.moves.plain_scripts,
        restart_plain_max_s=policy.moves.restart_plain_max_s,
        plain_grace_s=policy.moves.plain_grace_s,
    )


#: The action kinds that take idle GPUs (not idle for growth in the same tick).
TAKES_GPUS = (ActionKind.SIGNAL_MOVE, ActionKind.RESTART, ActionKind.BACKFILL, ActionKind.RETARGET, ActionKind.RELEASE)


#: What an action takes of a partition's idle GPUs: (partition, GPUs[, GPU kind]).
Take = tuple[str | None, int | None] | tuple[str | None, int | None, str]


def reserve_gpus(rooms: Sequence[PartitionView], takes: Sequence[Take]) -> tuple[PartitionView, ...]:
    """The rooms with the GPUs these (partition, GPUs[, GPU kind]) takes will take out of their partitions' idle
    ones (on the first node with enough, of that kind where one is named, in every partition that has that node)."""
    idle = {n.name: n.gpus for room in rooms for n in room.nodes}
    for partition, gpus, *kind in takes:
        room = next((r for r in rooms if r.name == partition), None)
        want = gpus or 0
        node = next((n.name for n in room.nodes if idle[n.name] >= want and (not kind or not kind[0]
                     or n.gpu_type == kind[0])), None) if room is not None and want else None
        if node is not None:
            idle[node] -= want
    return tuple(dataclasses.replace(r, nodes=tuple(dataclasses.replace(n, gpus=idle[n.name]) for n in r.nodes))
                 for r in rooms)


@dataclass
class AgentMemory:
    """What the agent keeps in memory from one tick to the next. A restart starts it afresh, harmlessly: what
    must survive a crash (moves and resizes in flight, the workers told to leave) is in the store."""

    # When each followed job's files were last read (deadline clock): the least recently read go first.
    last_read: dict[tuple[int, int], float] = field(default_factory=dict)
    # An elastic policy that learns from reports sizes elastic jobs on models fitted from them.
    models: LiveModels = field(default_factory=LiveModels)


@dataclass(frozen=True)
class Plan:
    """What one tick decided: values only. :func:`dlsub.agent.act.prepare` writes it ahead in one place and
    :func:`dlsub.agent.act.act` carries out what changes something in Slurm, in this order: the resizes
    (``resumed``, then ``resizes``), then ``moves``, ``placements`` and ``kind_moves``."""

    moves: tuple[Action, ...] = ()  # the move rules' actions (moves, continuations, backfills, notes)
    placements: tuple[Action, ...] = ()  # the kind of GPU each waiting elastic job is asked for as
    resumed: tuple[Resize, ...] = ()  # resizes a crash left written ahead and not done: carried out as they are
    resizes: tuple[Resize, ...] = ()  # this tick's grows, shrinks and ends of workers
    kind_moves: tuple[Action, ...] = ()  # elastic jobs moved to another GPU kind ([goodput] across_gpu_types)
    # The resizes in flight the store holds, as they go on: a planned shrink counted as leaving since, and
    # the ones over (a worker's wait is up, or moot now).
    resize_rows: Mapping[str, ResizeRow] = field(default_factory=dict)
    ended_resizes: frozenset[str] = frozenset()
    rooms: tuple[PartitionView, ...] = ()  # the partitions' room once this plan's takes are counted

    def actions(self) -> tuple[Action, ...]:
        return (*self.moves, *self.placements, *self.kind_moves)


def decide(obs: Observation, memory: AgentMemory, ctx: DecideWith, now: float) -> Plan:
    """This tick's plan from what it observed (``memory``, what the agent keeps between ticks, learns from
    it: the models an elastic policy sizes jobs on)."""
    moves = tuple(a for a in move_rules.plan(obs.jobs, obs.partitions, ctx.rules, now, obs.window, obs.usage)
                  if a.slurm_job_id in obs.followed)
    # GPUs this tick's moves and backfills are about to take are not idle for growth.
    rooms = reserve_gpus(obs.partitions, [(a.partition, a.gpus, a.gpu_type) for a in moves if a.kind in TAKES_GPUS])
    placements: tuple[Action, ...] = ()
    if ctx.policy.goodput.across_gpu_types and ctx.sizing is not None:
        try:
            # What jobs that are not elastic measured on each kind (a `dlsub estimate` profile among
            # them): learnt before any elastic job of the same command is sized or placed this tick.
            memory.models.learn(obs.kind_runs)
        except Exception:  # what was learnt costs the jobs it would have informed, never the tick
            log.exception("learning the kinds fixed-size runs measured failed; not learnt this tick")
        # Before the resizes: the workers that leave for a job that waits are those of the kind it waits for.
        placed, rooms = place_waiting_jobs(obs, rooms, ctx.rules, memory.models, ctx.sizing, now)
        placements = _acted_on([a for a in placed if a.slurm_job_id in obs.followed], moves)
    recovered = _recover_resizes(obs, rooms, ctx.policy, now)
    # Still running while it checkpoints with its group: its GPUs count as given back already.
    jobs = [dataclasses.replace(j, workers=tuple(dataclasses.replace(w, leaving=w.handle in recovered.leaving)
                                                 for w in j.workers)) for j in recovered.jobs]
    sizing = None if ctx.sizing is None else _size_by_policy(
        obs, ctx.rules, memory.models, ctx.sizing, now, ctx.policy.goodput.across_gpu_types)
    sized = resize_rules.plan_elastic(jobs, recovered.rooms, ctx.rules.policy, sizing)
    kind_moves = _acted_on([a for a in sized.moves if a.slurm_job_id in obs.followed], (*moves, *placements))
    return Plan(moves, placements, recovered.resumed, sized.resizes, kind_moves, recovered.rows,
                recovered.ended, recovered.rooms)


@dataclass(frozen=True)
class DecideWith:
    """What the decide step reads besides the observation: the site's policy, the rules made of it, and the
    elastic policy that sizes jobs on their fitted models (None: the policy only orders growth)."""

    policy: AgentPolicy
    rules: Rules
    sizing: Policy | None


def _acted_on(actions: Sequence[Action], before: Sequence[Action]) -> tuple[Action, ...]:
    """``actions`` less those on a job that an action ``before`` (or an earlier one of ``actions``) already
    changes in Slurm this tick: a placement or a move between kinds never joins the move rules' own change of
    a job (a note beside it is no change)."""
    taken = {a.slurm_job_id for a in before if a.kind not in BOOKKEEPING}
    out: list[Action] = []
    for action in actions:
        if action.slurm_job_id in taken:
            continue
        out.append(action)
        if action.kind not in BOOKKEEPING:
            taken.add(action.slurm_job_id)
    return tuple(out)


@dataclass(frozen=True)
class _Recovered:
    """The resizes in flight as this tick finds them (see :func:`_recover_resizes`)."""

    resumed: tuple[Resize, ...]
    jobs: tuple[ElasticJob, ...]
    leaving: Mapping[str, float]
    rows: Mapping[str, ResizeRow]
    ended: frozenset[str]
    rooms: tuple[PartitionView, ...]


def _recover_resizes(obs: Observation, rooms: Sequence[PartitionView], policy: AgentPolicy, now: float) -> _Recovered:
    """The resizes in flight from the store: the grows a crash left written ahead and not done, to be done
    now (and not planned again), and the workers still leaving (kept in the store across ticks and
    restarts). Gives those grows, the elastic jobs as the planner must see them (a resumed grow's worker
    counted as released already, its GPUs as taken), the leaving workers with when they were told, the
    records to update and to drop, and the rooms with the resumed grows' GPUs taken."""
    leaving: dict[str, float] = {}
    rows: dict[str, ResizeRow] = {}
    ended: set[str] = set()
    tasks = {w.handle: (j, w) for j in obs.elastic for w in j.workers}
    resumed: list[Resize] = []
    taken: list[tuple[str, int]] = []
    for worker, row in obs.store.resizes.items():
        job, task = tasks.get(worker, (None, None))
        if row.phase == ResizePhase.PLANNED and row.kind == ActionKind.SHRINK:
            # The signal may or may not have gone before the crash: counted as leaving since it was
            # planned, so it is never sent twice within the wait, and sent again after it if still needed.
            row = dataclasses.replace(row, phase=ResizePhase.LEAVING)
            rows[worker] = row
        if row.phase == ResizePhase.LEAVING:
            if now - row.since < leave_wait_s(policy):
                leaving[worker] = row.since
            else:
                ended.add(worker)
            continue
        if (job is None or task is None or job.uid != row.uid or job.state != "RUNNING" or job.ended
                or job.moving or not resize_rules.usable_worker(task, job)):
            # Released before the crash (no longer held), or moot now: nothing left to do.
            ended.add(worker)
            continue
        resumed.append(Resize(ActionKind(row.kind), row.dlsub_id, row.slurm_job_id, row.reason, worker=worker,
                              partition=row.partition, batch_size=row.batch_size,
                              accumulation_steps=row.accumulation_steps, node=row.node))
        taken.append((job.partition, job.gpus_per_worker))
    on_way = {r.worker for r in resumed}
    jobs = tuple(dataclasses.replace(j, workers=tuple(dataclasses.replace(w, released=True) if w.handle in on_way
                                                      else w for w in j.workers)) for j in obs.elastic)
    return _Recovered(tuple(resumed), jobs, leaving, {w: r for w, r in rows.items() if w not in ended},
                      frozenset(ended), reserve_gpus(rooms, taken) if resumed else tuple(rooms))


def _size_by_policy(obs: Observation, rules: Rules, models: LiveModels, policy: Policy, now: float,
                    across_kinds: bool) -> resize_rules.SizeByPolicy:
    """With an elastic policy that learns from what jobs report (``goodput``), the sizing step that runs it
    on each elastic job's fitted model. ``across_kinds`` (the site sizes jobs across GPU kinds): a partition
    whose nodes name two or more kinds is sized by :func:`plan_across_kinds`, which moves jobs between them."""
    models.forget_except({j.dlsub_id for j in obs.elastic})
    headroom = _headroom(obs, rules)
    site = model_partitions(obs.partitions) if across_kinds else None
    # Where Slurm would take each of the site's elastic jobs: read once for every partition sized below.
    may_use = {} if site is None else _partitions_taking(obs, site, obs.elastic)

    def size(jobs: Sequence[ElasticJob], room: PartitionView) -> resize_rules.Sized:
        kinds = kinds_to_choose(room) if across_kinds else []
        where = None
        if site is not None and room.name in site.names:
            # A partition of one model each: sized among all the site's kinds, a move pointed at the kind's own.
            kinds, where, room = site.kinds, site.partition_of, sizing_room(site, room)
        scaled = _scaled(obs, models, jobs, now, rules, kinds, where=where)
        try:
            if kinds:
                resizes, moves = plan_across_kinds(scaled, room, policy, now, headroom, _checkpointed(obs))
                if site is not None and where is not None:
                    moves = moves_across_partitions(moves, site, {j.dlsub_id: j for j in jobs}, may_use)
                return resize_rules.Sized(tuple(resizes), tuple(moves))
            return resize_rules.Sized(tuple(plan_by_policy(scaled, room, policy, now, headroom)))
        except Exception:  # a bad model costs this partition its resizes this tick, never the tick
            log.exception("sizing the elastic jobs of %s failed; no resizes there this tick", room.name)
            return resize_rules.Sized()
    return size


def place_waiting_jobs(obs: Observation, rooms: Sequence[PartitionView], rules: Rules, models: LiveModels,
                       policy: Policy, now: float) -> tuple[list[Action], tuple[PartitionView, ...]]:
    """Where the site sizes elastic jobs across GPU kinds (``[goodput] across_gpu_types``): the kind each elastic
    job waiting in a partition of two or more kinds is asked for as (:func:`place_waiting`), and the rooms
    with their waiting GPUs counted against those kinds. A job that never ran is known by its command (the
    ``app=`` its submit named): what its user's earlier runs of it measured on each kind."""
    placed: list[Action] = []
    out: list[PartitionView] = []
    site = model_partitions(rooms)
    if site is not None:
        placed += _place_across_partitions(obs, site, rules, models, policy, now)
        rooms = rewait(rooms, placed, {j.dlsub_id: j for j in obs.elastic})
    for room in rooms:
        kinds = kinds_to_choose(room)
        jobs = [j for j in obs.elastic if j.partition == room.name and not j.ended and not j.moving]
        if not kinds or not any(j.waiting for j in jobs):
            out.append(room)
            continue
        scaled = _scaled(obs, models, jobs, now, rules, kinds, by_command=True)
        try:
            actions = place_waiting([s for s in scaled if s.job.waiting],
                                    [s for s in scaled if s.job.state == "RUNNING"], room, policy, now)
        except Exception:  # a bad model costs this partition its placing this tick, never the tick
            log.exception("placing the waiting elastic jobs of %s failed; none placed this tick", room.name)
            out.append(room)
            continue
        out.append(retype_waiting(room, actions, {j.dlsub_id: j for j in jobs}))
        placed += actions
    return placed, tuple(out)


def _place_across_partitions(obs: Observation, site: ModelPartitions, rules: Rules, models: LiveModels,
                             policy: Policy, now: float) -> list[Action]:
    """The site's partition of one model each that each elastic job waiting in one of them is asked for
    (:func:`place_across_partitions`): only a partition Slurm would take it on (its user's groups and account,
    its time limit)."""
    jobs = [j for j in obs.elastic if j.partition in site.names and not j.ended and not j.moving]
    if not any(j.waiting for j in jobs):
        return []
    may_use = _partitions_taking(obs, site, jobs)
    scaled = _scaled(obs, models, jobs, now, rules, site.kinds, by_command=True, where=site.partition_of)
    try:
        return place_across_partitions([s for s in scaled if s.job.waiting],
                                       [s for s in scaled if s.job.state == "RUNNING"], site, policy, now, may_use)
    except Exception:  # a bad model costs these partitions their placing this tick, never the tick
        log.exception("placing the waiting elastic jobs of %s failed; none placed this tick", site.room.name)
        return []


def _partitions_taking(obs: Observation, site: ModelPartitions,
                       jobs: Sequence[ElasticJob]) -> dict[str, frozenset[str]]:
    """Per dlsub id, the site's partitions Slurm would take the job on."""
    # The jobs' infos as observe left them, with the partitions Slurm would refuse each (JobInfo.barred).
    infos = {info.slurm_job_id: info for info in obs.jobs}
    return {job.dlsub_id: frozenset(room.name for room in obs.partitions
                                    if room.name in site.names and _takes(room, info))
            for job in jobs if (info := infos.get(job.slurm_job_id)) is not None}


def _takes(room: PartitionView, job: JobInfo) -> bool:
    """Whether Slurm would take ``job`` on ``room``: its user's groups and account may use it, and its time
    limit fits the partition's."""
    limit = job.asked.time_limit_min
    return room.name not in job.barred and (room.max_time_s is None or (limit is not None
                                                                        and limit * 60 <= room.max_time_s))


def _headroom(obs: Observation, rules: Rules) -> dict[int, int]:
    """The GPUs each user may still add (the per-user limit less what Slurm shows them holding)."""
    return {uid: max(0, rules.max_gpus_per_user - usage.gpus) for uid, usage in obs.usage.items()}


def _scaled(obs: Observation, models: LiveModels, jobs: Sequence[ElasticJob], now: float, rules: Rules,
            kinds: Sequence[str], by_command: bool = False,
            where: Mapping[str, str] | None = None) -> list[ScaledJob]:
    """The jobs as the policy sees them, on each of ``kinds`` where there are two or more. ``by_command``: a job
    whose training has not named its command yet is known by the one its submit named (``app=``). A job whose
    model cannot be made is left out: its reports cost it its resizes and placing, never the others'."""
    headroom = _headroom(obs, rules)
    out = []
    for job in jobs:
        progress = obs.elastic_progress.get(job.dlsub_id) or Progress()
        if by_command and progress.application is None and job.application is not None:
            progress = dataclasses.replace(progress, application=job.application)
        try:
            out.append(models.scaled(job, progress, now, headroom.get(job.uid, rules.max_gpus_per_user), kinds,
                                     where))
        except Exception:
            log.exception("job %s: no model from its reports this tick; it keeps its size and kind", job.dlsub_id)
    return out


def _checkpointed(obs: Observation) -> frozenset[str]:
    """The elastic jobs that may be moved with their progress (checkpointed, or save when asked)."""
    return frozenset(s.request.dlsub_id for s in obs.followed.values()
                     if s.info is not None and s.info.reported.checkpointable and s.request.elastic_main)
