"""Elastic jobs placed across the GPU kinds of one partition by the typed goodput policy (pure: views in,
actions out).

With ``[goodput] across_gpu_types`` (policy.toml) and a partition whose nodes name two or more kinds in
their GRES (``gpu:a100:4`` beside ``gpu:v100:4``), the agent asks the policy object the simulator runs as
``goodput`` (:class:`~dlsub.policies.goodput_types.TypedGoodputPolicy`) which kind and how many GPUs each
elastic job should have. Each job's view carries its model on every kind it has reports from (its own,
and its user's earlier runs of the same command there) and its one-GPU rate there: the policy bootstraps
the other kinds from those, as it does in the simulator (Sia's bootstrap), and leaves out a kind nothing
is known of. The policy's own restart rule (``keep_share``: a change must save more than the restart
costs over the work the job is guessed to have left) is what keeps a job where it is.

What the decision turns into:

* a job the policy keeps on its kind is grown or shrunk as
  :mod:`~dlsub.policies.actions.goodput_resize_rules` does, its workers only on nodes of its kind;
* a job the policy puts on another kind is **moved** there (checkpoint, requeue held, its GPUs asked for
  as ``gres:gpu:KIND:N``, release: the agent's move, written ahead), when all of these hold: it has
  checkpointed (or saves when asked); by its own figures its rate on the new kind, after the policy's
  restart share, beats its rate now (a job is never moved to make room for another: another user's
  reports are their word, and must never move this job); and its main job fits on idle GPUs of that kind
  now (nobody's GPUs are taken for it). Its workers leave the group as the main job requeues, and it grows
  again on the new kind once it runs there. Otherwise it keeps its kind and size this tick, with a note
  that says why.

Every move's and note's reason gives the figures: what the job measured on its kind, what is predicted on
the other and from what, and the decision.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlsub.policies.actions.goodput_resize_rules import (
    ScaledJob,
    policy_views,
    resizes_from,
    settled_and_held,
)
from dlsub.policies.actions.kinds import ActionKind
from dlsub.policies.actions.move_views import Action
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import Capacity, ElasticJob, Resize
from dlsub.policies.api import Allocation, ClusterView, Decision, JobView, Node, PerformanceModel, Policy
from dlsub.policies.placement import packed_placement


def room_kinds(room: PartitionView) -> list[str]:
    """The GPU kinds the room's nodes name, in the order they first appear."""
    return list(dict.fromkeys(n.gpu_type for n in room.nodes if n.gpu_type))


def kinds_to_choose(room: PartitionView) -> list[str]:
    """The kinds a typed policy chooses among in the room: its nodes' kinds where they are two or more, else
    none (one kind, or none named, is one pool). The one rule for where jobs are sized and placed across
    kinds, and so where what fixed-size runs measured on a kind is learnt."""
    kinds = room_kinds(room)
    return kinds if len(kinds) >= 2 else []


def typed_view(room: PartitionView, capacity: Capacity, holding: Mapping[str, Allocation]) -> ClusterView:
    """The GPUs the policy may hand out, node by node with its kind: those idle after waiting jobs' claims and
    those the jobs being sized hold. A node whose kind is not known is left out (nothing can be said of its
    speed)."""
    kinds = {n.name: n.gpu_type for n in room.nodes}
    offered: Counter[str] = Counter({name: node.gpus for name, node in capacity.nodes.items()})
    for alloc in holding.values():
        offered.update(alloc.nodes)
    return ClusterView(tuple(Node(name, gpus, partition=room.name, gpu_type=kinds[name] or "")
                             for name, gpus in offered.items() if gpus > 0 and kinds.get(name)),
                       grow_in_place=True)


@dataclass(frozen=True)
class Rate:
    """A job's samples per second (steps per second where it reports no samples) on ``gpus`` GPUs of a kind,
    and where the figure comes from."""

    value: float
    samples: bool
    basis: str  # "measured", "its model there", or the bootstrap it came from


def _per_second(model: PerformanceModel, gpus: int, per_node: int, batch: int) -> float:
    step = model.step_time(packed_placement(gpus, max(1, per_node)), batch)
    return batch / step if step > 0 else 0.0


def rate_on(scaled: ScaledJob, view: JobView, kind: str, gpus: int) -> Rate | None:
    """The job's rate on ``gpus`` GPUs of ``kind``: what it measured there at that size (its kind now), else
    its model there, else bootstrapped as the typed policy does (the model of the kind it has run widest on,
    scaled by the two kinds' one-GPU rates); None when nothing is known of the kind."""
    job = scaled.job
    batch = view.batch_size or scaled.batch or 1
    samples = scaled.batch is not None
    per_node = job.packing(gpus)
    if kind == job.gpu_type:
        for (_, replicas), (steps, measured) in scaled.measured.items():
            if replicas == gpus:
                value = measured if samples and measured is not None else steps
                return Rate(value, samples and measured is not None, "measured")
    models = view.type_models or {}
    if kind in models:
        raw = _per_second(models[kind], gpus, per_node, batch)
        return Rate(raw if samples else raw / batch, samples, "its model there")
    rates = view.type_rates or {}
    if not models or rates.get(kind, 0.0) <= 0:
        return None
    source = max(models, key=lambda k: (getattr(models[k], "trusted_gpus", 0), k))
    if rates.get(source, 0.0) <= 0:
        return None
    scale = rates[kind] / rates[source]
    raw = _per_second(models[source], gpus, per_node, batch) * scale
    return Rate(raw if samples else raw / batch, samples,
                f"bootstrapped: its {source} model x {scale:.2f}, the one-GPU rate earlier runs of its command "
                f"measured on {kind} over its own on {source}")


def _rate_text(rate: Rate) -> str:
    unit = "samples/s" if rate.samples else "steps/s"
    return f"{rate.value:.0f} {unit}" if rate.value >= 10 else f"{rate.value:.2f} {unit}"


def _gpus_text(gpus: int) -> str:
    return f"{gpus} GPU{'s' if gpus != 1 else ''}"


def _kind_of(alloc: Allocation | None, kinds: Mapping[str, str | None]) -> str | None:
    found = {kinds.get(n) for n in alloc.nodes} if alloc is not None and alloc.gpus else set()
    return found.pop() if len(found) == 1 else None


def _room_for_main(job: ElasticJob, capacity: Capacity, kind: str) -> list[str]:
    """Idle nodes of ``kind`` the main job fits on now (one per node it spans), taken from ``capacity``;
    [] when it does not fit (nothing taken)."""
    found = [name for name, node in capacity.nodes.items()
             if node.gpu_type == kind and node.fits(job.gpus_per_node, job.cpus_per_node, job.memory_per_node_mb)]
    if len(found) < job.min_members:
        return []
    chosen = found[:job.min_members]
    for name in chosen:
        capacity.nodes[name] = capacity.nodes[name].less(job.gpus_per_node, job.cpus_per_node,
                                                          job.memory_per_node_mb)
    return chosen


def _reachable(job: ElasticJob, capacity: Capacity, kind: str, most: int) -> int:
    """The GPUs the job can hold on ``kind`` right after a move, at most ``most``: its main job's and its
    workers' that idle GPUs of that kind hold now (0: its main job does not fit). Nothing is taken."""
    saved = dict(capacity.nodes)
    try:
        if not _room_for_main(job, capacity, kind):
            return 0
        there = dataclasses.replace(job, gpu_type=kind, workers=(), main_nodes=())
        gpus = job.main_gpus
        while gpus + job.gpus_per_worker <= most and capacity.take(there) is not None:
            gpus += job.gpus_per_worker
        return gpus
    finally:
        capacity.nodes = saved


def _keep_share(policy: Policy, view: JobView, now: float) -> float:
    """What the policy's own restart rule leaves of a job's gain when it changes configuration."""
    keep = getattr(policy, "keep_share", None)
    return float(keep(view, now)) if callable(keep) else 1.0


def plan_across_kinds(jobs: Sequence[ScaledJob], room: PartitionView, policy: Policy, now: float,
                      headroom: Mapping[int, int] | None = None,
                      checkpointed: frozenset[str] = frozenset()) -> tuple[list[Resize], list[Action]]:
    """The resizes and the moves between kinds of one partition's elastic jobs (see the module's doc).
    ``checkpointed``: the dlsub ids of the jobs that may be moved with their progress (they have
    checkpointed, or save when asked)."""
    capacity, settled, held = settled_and_held(jobs, room, same_kind=True)
    if not settled:
        return [], []
    views = {v.name: v for v in policy_views(settled)}
    decision: Decision = policy.decide(list(views.values()), typed_view(room, capacity, held), now, held)
    kinds = {n.name: n.gpu_type for n in room.nodes}
    actions: list[Action] = []
    for scaled in settled:
        job = scaled.job
        target = _kind_of(decision.get(job.dlsub_id), kinds)
        if job.gpu_type is None or target is None or target == job.gpu_type or job.moving or job.state != "RUNNING":
            continue
        # Whatever becomes of the move, the job keeps its kind and size this tick.
        decision[job.dlsub_id] = held[job.dlsub_id]
        action = _move_or_note(scaled, views[job.dlsub_id], target, capacity, policy, now, checkpointed,
                               held[job.dlsub_id].gpus)
        if action is not None:
            actions.append(action)
    return resizes_from(jobs, settled, decision, held, capacity, room, policy, headroom), actions


def _move_or_note(scaled: ScaledJob, view: JobView, target: str, capacity: Capacity, policy: Policy, now: float,
                  checkpointed: frozenset[str], gpus_now: int) -> Action | None:
    """The move of a job the policy put on ``target``, or a note why it stays; None when its rates on the two
    kinds are not both known (the policy could not have put it there on its figures)."""
    job = scaled.job
    assert job.gpu_type is not None
    # Its speed on each kind at the size it has now: what the kind itself gains it.
    # On the new kind, at the size it can have there now (its main job and the workers idle GPUs of that kind
    # hold), never more than it has: a move must gain it something on what it will get, not on what the
    # policy hoped to free for it.
    reach = _reachable(job, capacity, target, gpus_now) or gpus_now
    here, there = rate_on(scaled, view, job.gpu_type, gpus_now), rate_on(scaled, view, target, reach)
    if here is None or there is None or here.samples != there.samples:
        return None
    # The restart's share is weighed against the time since the main job last started (Slurm's, not the
    # job's word): a move starts that clock again, so a job moved (on its figures, true or not) cannot be
    # moved back before its time on the new kind has paid for another restart.
    keep = _keep_share(policy, dataclasses.replace(view, arrival_s=max(view.arrival_s, job.start_time)), now)
    figures = (f"measured {_rate_text(here)} on {job.gpu_type} ({_gpus_text(gpus_now)})" if here.basis == "measured"
               else f"{_rate_text(here)} on {job.gpu_type} ({_gpus_text(gpus_now)}, {here.basis})")
    figures += f", predicted {_rate_text(there)} on {target} ({_gpus_text(reach)}"
    figures += f"; {there.basis})" if there.basis != "its model there" else ", its model from its runs there)"
    details: dict[str, float | str | int | None] = {
        "from_gpu_type": job.gpu_type, "to_gpu_type": target, "measured_rate": round(here.value, 3),
        "measured_gpus": gpus_now, "predicted_rate": round(there.value, 3), "predicted_gpus": reach,
        "keep_share": round(keep, 3), "figures": figures}
    policy_words = f"{policy.name} policy across GPU kinds"

    def note(why: str) -> Action:
        return Action(ActionKind.NOTE, job.dlsub_id, job.slurm_job_id, why, details=details)

    if there.value * keep <= here.value:
        # The program placed it on the other kind to give its own GPUs to another job: never on their word.
        return note(f"stays on {job.gpu_type} ({policy_words}): {figures}; after its restart (keeping "
                    f"{keep:.0%} of the gain) it would be no faster there")
    if here.basis != "measured":
        # A loop that polls should_stop() may be moved from its first seconds: a move waits for what it measured
        # where it runs, never only for what its model (earlier runs, another command's profile) says of it.
        return note(f"not moved to {target} yet ({policy_words}): {figures}; it has not measured its rate on "
                    f"{job.gpu_type} yet (a move is made on what it measured where it runs)")
    if job.dlsub_id not in checkpointed:
        return note(f"not moved to {target} yet ({policy_words}): {figures}; it has not written a checkpoint "
                    "nor asked run.should_stop() (only jobs that save when asked are moved)")
    nodes = _room_for_main(job, capacity, target)
    if not nodes:
        return note(f"not moved to {target} yet ({policy_words}): {figures}; no node of {target} has "
                    f"{_gpus_text(job.gpus_per_node)} idle for its main job now")
    return Action(
        ActionKind.SIGNAL_MOVE, job.dlsub_id, job.slurm_job_id, (
            f"moving to {target} ({policy_words}): {figures}; the gain beats the restart (it keeps {keep:.0%} of "
            f"it); moved: checkpointing, then requeued onto gpu:{target}:{job.gpus_per_node} ({','.join(nodes)} "
            "idle), its workers back to the held pool until it grows there"),
        partition=job.partition, gpus=job.gpus_per_node, gpu_type=target, details=details)


def _could_be_freed(job: ElasticJob, room: PartitionView, running: Sequence[ScaledJob], kind: str) -> bool:
    """Whether a node of ``kind`` has the GPUs the job's main job needs on one node idle, or held by elastic
    workers (those leave for a job that waits there: :func:`~.resize_rules.plan_resizes`; one leaving already
    counts, its GPUs are on their way)."""
    held: Counter[str] = Counter()
    for other in running:
        for worker in other.job.workers:
            if worker.state == "RUNNING":
                held.update({n: other.job.gpus_per_worker for n in worker.nodes})
    return any(n.gpu_type == kind and n.gpus + held[n.name] >= job.gpus_per_node for n in room.nodes)


def _idle_elsewhere(job: ElasticJob, room: PartitionView, kind: str) -> str | None:
    """A node of another kind than ``kind`` with the job's main job's GPUs idle now (None: none)."""
    return next((n.name for n in room.nodes if n.gpu_type != kind and n.gpus >= job.gpus_per_node), None)


def place_waiting(waiting: Sequence[ScaledJob], running: Sequence[ScaledJob], room: PartitionView, policy: Policy,
                  now: float) -> list[Action]:
    """The kind of GPU each elastic job that waits in ``room`` is asked for as (``PLACE`` actions).

    The typed policy is asked about the partition's elastic jobs, the waiting ones with none of its GPUs: a
    waiting job it puts on one kind is asked for as that kind (``gres:gpu:KIND:N``), when all of these hold:
    its user asked for no kind (a user's choice is never changed); by what it measured, or its user's earlier
    runs of the same command measured, on one GPU of each kind, that kind is the fastest; and a node of that
    kind has its main job's GPUs idle or held by elastic workers, which leave for a job waiting there (jobs
    waiting for a kind are counted against that kind's GPUs). A job placed so, or moved to a kind, that waits
    for a kind no node of which can be freed for it any more, while a node of another kind has its GPUs idle,
    is asked for as any kind again (it then starts there: a snapshot in which a freed GPU was just taken never
    unplaces it). Only the waiting job's own figures place it: it then waits as it would had its user asked
    for that kind."""
    if not waiting:
        return []
    kinds = room_kinds(room)
    node_kinds = {n.name: n.gpu_type for n in room.nodes}
    capacity, settled, held = settled_and_held(running, room, same_kind=True)
    views = {v.name: v for v in policy_views(settled)}
    views.update({v.name: dataclasses.replace(v, gpus=0) for v in policy_views(waiting)})
    decision = policy.decide(list(views.values()), typed_view(room, capacity, held), now, held)
    actions: list[Action] = []
    for scaled in waiting:
        job = scaled.job
        if job.user_gpu_type is not None or "," in job.partition:
            continue
        # Its one-GPU rates as the policy has them: at the batch it is guessed to run until it reports its own,
        # so only their ratios are told.
        rates = {k: r for k in kinds if (r := (views[job.dlsub_id].type_rates or {}).get(k, 0.0)) > 0}
        target = _kind_of(decision.get(job.dlsub_id), node_kinds)
        faster = target in rates and all(rates[target] > r for k, r in rates.items() if k != target) and len(rates) > 1
        slowest = min(rates.values(), default=1.0)
        figures = ", ".join(f"{k} {rates[k] / slowest:.2f}x" for k in sorted(rates, key=lambda k: -rates[k]))
        words = f"{policy.name} policy across GPU kinds"
        details: dict[str, float | str | int | None] = {f"rate_{k}": round(r, 3) for k, r in rates.items()}
        if target is not None and faster and _could_be_freed(job, room, running, target):
            if job.asked_gpu_type != target:
                details["to_gpu_type"] = target
                actions.append(Action(
                    ActionKind.PLACE, job.dlsub_id, job.slurm_job_id, (
                        f"waiting for {target} ({words}): its speed on one GPU of each kind, against the slowest, "
                        f"predicted from what it or its user's earlier runs of the same command measured there: "
                        f"{figures}; asked for as gres:gpu:{target}:"
                        f"{job.gpus_per_node}, and an elastic worker on {target} leaves for it if none is idle"),
                    partition=job.partition, gpus=job.gpus_per_node, gpu_type=target, details=details))
        elif (job.asked_gpu_type is not None and not _could_be_freed(job, room, running, job.asked_gpu_type)
              and (idle := _idle_elsewhere(job, room, job.asked_gpu_type)) is not None):
            details["from_gpu_type"] = job.asked_gpu_type
            actions.append(Action(
                ActionKind.PLACE, job.dlsub_id, job.slurm_job_id, (
                    f"waiting for any kind of GPU again ({words}): no node of {job.asked_gpu_type} has "
                    f"{_gpus_text(job.gpus_per_node)} idle or held by elastic workers for it, and {idle} has them "
                    "idle"),
                partition=job.partition, gpus=job.gpus_per_node, gpu_type="", details=details))
    return actions


def retype_waiting(room: PartitionView, placed: Sequence[Action], jobs: Mapping[str, ElasticJob]) -> PartitionView:
    """The room with the waiting GPUs of the jobs ``placed`` this tick counted against their new kind (Slurm's
    queue, read before, still has them as they were)."""
    by_kind: Counter[str] = Counter(dict(room.waiting_by_kind))
    for action in placed:
        job = jobs.get(action.dlsub_id)
        if job is None or job.partition != room.name:
            continue
        if job.asked_gpu_type:
            by_kind[job.asked_gpu_type] -= job.main_gpus
        if action.gpu_type:
            by_kind[action.gpu_type] += job.main_gpus
    return dataclasses.replace(room, waiting_by_kind=tuple(sorted((k, g) for k, g in by_kind.items() if g > 0)))
