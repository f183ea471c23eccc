"""Decide: the resizes of a tick (the moves are :func:`dlsub.policies.actions.move_rules.plan`'s), and
the resizes in flight a crash left in the store.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from dlsub.agent.agent_store import AgentStore, Writes
from dlsub.agent.live_models import LiveModels
from dlsub.agent.observe import Observation
from dlsub.agent.records import ResizePhase
from dlsub.job_progress import Progress
from dlsub.policies.actions import resize_rules
from dlsub.policies.actions.goodput_resize_rules import ScaledJob, plan_by_policy
from dlsub.policies.actions.gpu_kind_rules import (
    kinds_to_choose,
    place_waiting,
    plan_across_kinds,
    retype_waiting,
)
from dlsub.policies.actions.kinds import ActionKind
from dlsub.policies.actions.move_views import Action, Rules
from dlsub.policies.actions.resize_rules import ElasticJob, Resize, Room
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


def reserve_gpus(rooms: list[Room], takes: Sequence[tuple[str | None, int | None] | tuple[str | None, int | None, str]]
                 ) -> list[Room]:
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
    return [dataclasses.replace(r, nodes=tuple(dataclasses.replace(n, gpus=idle[n.name]) for n in r.nodes))
            for r in rooms]


def plan_resizes(seen: Observation, store: AgentStore, policy: AgentPolicy, rules: Rules, models: LiveModels,
                 sizing_policy: Policy | None, now: float, writes: Writes,
                 kind_moves: list[Action] | None = None) -> tuple[list[Resize], list[Resize]]:
    """This tick's resizes: the ones a crash left written ahead and not done (carried out as they are, never
    decided again), and the new grow/shrink/end-workers ones (to be written ahead). ``sizing_policy``: an
    elastic policy that sizes jobs on the ``models`` fitted from their reports (None: the policy only orders
    growth). ``kind_moves`` gets the moves of elastic jobs to another GPU kind (and the notes on those that
    stay) where the site sizes them across kinds (``[goodput] across_gpu_types``)."""
    resumed, jobs, leaving = _recover_resizes(seen, store, policy, now, writes)
    # Still running while it checkpoints with its group: its GPUs count as given back already.
    jobs = [dataclasses.replace(j, workers=tuple(dataclasses.replace(w, leaving=w.handle in leaving)
                                                 for w in j.workers)) for j in jobs]
    sizing = None if sizing_policy is None else _size_by_policy(
        seen, rules, models, sizing_policy, now, kind_moves if policy.goodput.across_gpu_types else None)
    planned = resize_rules.plan_resizes(jobs, seen.rooms, rules.policy, sizing)
    return resumed, planned


def _recover_resizes(seen: Observation, store: AgentStore, policy: AgentPolicy, now: float,
                     writes: Writes) -> tuple[list[Resize], list[ElasticJob], dict[str, float]]:
    """The resizes in flight from the store: the grows a crash left written ahead and not done, to be done
    now (and not planned again), and the workers still leaving (kept in the store across ticks and
    restarts). Returns those grows, the elastic jobs as the planner must see them (a resumed grow's worker
    counted as released already, its GPUs as taken), and the leaving workers with when they were told."""
    rows = store.resizes()
    leaving: dict[str, float] = {}
    tasks = {w.handle: (j, w) for j in seen.elastic for w in j.workers}
    resumed: list[Resize] = []
    taken: list[tuple[str, int]] = []
    for worker, row in rows.items():
        job, task = tasks.get(worker, (None, None))
        if row.phase == ResizePhase.PLANNED and row.kind == ActionKind.SHRINK:
            # The signal may or may not have gone before the crash: counted as leaving since it was
            # planned, so it is never sent twice within the wait, and sent again after it if still needed.
            row = dataclasses.replace(row, phase=ResizePhase.LEAVING)
            writes.resizes[worker] = row
        if row.phase == ResizePhase.LEAVING:
            if now - row.since < leave_wait_s(policy):
                leaving[worker] = row.since
            else:
                writes.ended_resizes.add(worker)
            continue
        if (job is None or task is None or job.uid != row.uid or job.state != "RUNNING" or job.ended
                or job.moving or not resize_rules.usable_worker(task, job)):
            # Released before the crash (no longer held), or moot now: nothing left to do.
            writes.ended_resizes.add(worker)
            continue
        resumed.append(Resize(ActionKind(row.kind), row.dlsub_id, row.slurm_job_id, row.reason, worker=worker,
                              partition=row.partition, batch_size=row.batch_size,
                              accumulation_steps=row.accumulation_steps, node=row.node))
        taken.append((job.partition, job.gpus_per_worker))
    if resumed:
        seen.rooms = reserve_gpus(seen.rooms, taken)
    on_way = {r.worker for r in resumed}
    jobs = [dataclasses.replace(j, workers=tuple(dataclasses.replace(w, released=True) if w.handle in on_way
                                                 else w for w in j.workers)) for j in seen.elastic]
    return resumed, jobs, leaving


def _size_by_policy(seen: Observation, rules: Rules, models: LiveModels, policy: Policy, now: float,
                    kind_moves: list[Action] | None = None) -> resize_rules.SizeByPolicy:
    """With an elastic policy that learns from what jobs report (``goodput``), the sizing step that runs it
    on each elastic job's fitted model. With ``kind_moves`` (the site sizes jobs across GPU kinds), a
    partition whose nodes name two or more kinds is sized by :func:`plan_across_kinds`, whose moves and
    notes go there."""
    models.forget_except({j.dlsub_id for j in seen.elastic})
    headroom = _headroom(seen, rules)

    def size(jobs: Sequence[ElasticJob], room: Room) -> list[Resize]:
        kinds = kinds_to_choose(room) if kind_moves is not None else []
        scaled = _scaled(seen, models, jobs, now, rules, kinds)
        try:
            if kinds and kind_moves is not None:
                resizes, moves = plan_across_kinds(scaled, room, policy, now, headroom, _checkpointed(seen))
                kind_moves.extend(moves)
                return resizes
            return plan_by_policy(scaled, room, policy, now, headroom)
        except Exception:  # a bad model costs this partition its resizes this tick, never the tick
            log.exception("sizing the elastic jobs of %s failed; no resizes there this tick", room.name)
            return []
    return size


def place_waiting_jobs(seen: Observation, rules: Rules, models: LiveModels, policy: Policy, now: float) -> list[Action]:
    """Where the site sizes elastic jobs across GPU kinds (``[goodput] across_gpu_types``): the kind each elastic
    job waiting in a partition of two or more kinds is asked for as (:func:`place_waiting`); ``seen.rooms``
    then count their waiting GPUs against those kinds. A job that never ran is known by its command (the
    ``app=`` its submit named): what its user's earlier runs of it measured on each kind."""
    placed: list[Action] = []
    for index, room in enumerate(seen.rooms):
        kinds = kinds_to_choose(room)
        jobs = [j for j in seen.elastic if j.partition == room.name and not j.ended and not j.moving]
        if not kinds or not any(j.waiting for j in jobs):
            continue
        scaled = _scaled(seen, models, jobs, now, rules, kinds, by_command=True)
        try:
            actions = place_waiting([s for s in scaled if s.job.waiting],
                                    [s for s in scaled if s.job.state == "RUNNING"], room, policy, now)
        except Exception:  # a bad model costs this partition its placing this tick, never the tick
            log.exception("placing the waiting elastic jobs of %s failed; none placed this tick", room.name)
            continue
        seen.rooms[index] = retype_waiting(room, actions, {j.dlsub_id: j for j in jobs})
        placed += actions
    return placed


def _headroom(seen: Observation, rules: Rules) -> dict[int, int]:
    """The GPUs each user may still add (the per-user limit less what Slurm shows them holding)."""
    return {uid: max(0, rules.max_gpus_per_user - usage.gpus) for uid, usage in seen.usage.items()}


def _scaled(seen: Observation, models: LiveModels, jobs: Sequence[ElasticJob], now: float, rules: Rules,
            kinds: Sequence[str], by_command: bool = False) -> list[ScaledJob]:
    """The jobs as the policy sees them, on each of ``kinds`` where there are two or more. ``by_command``: a job
    whose training has not named its command yet is known by the one its submit named (``app=``). A job whose
    model cannot be made is left out: its reports cost it its resizes and placing, never the others'."""
    headroom = _headroom(seen, rules)
    out = []
    for job in jobs:
        progress = seen.elastic_progress.get(job.dlsub_id) or Progress()
        if by_command and progress.application is None and job.application is not None:
            progress = dataclasses.replace(progress, application=job.application)
        try:
            out.append(models.scaled(job, progress, now, headroom.get(job.uid, rules.max_gpus_per_user), kinds))
        except Exception:
            log.exception("job %s: no model from its reports this tick; it keeps its size and kind", job.dlsub_id)
    return out


def _checkpointed(seen: Observation) -> frozenset[str]:
    """The elastic jobs that may be moved with their progress (checkpointed, or save when asked)."""
    return frozenset(s.request.dlsub_id for s in seen.followed.values()
                     if s.info is not None and s.info.checkpointable and s.request.elastic_main)
