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
from dlsub.policies.actions.resize_rules import Capacity, ElasticJob, Resize, Room
from dlsub.policies.api import Allocation, ClusterView, Decision, JobView, Node, PerformanceModel, Policy
from dlsub.policies.placement import packed_placement


def room_kinds(room: Room) -> list[str]:
    """The GPU kinds the room's nodes name, in the order they first appear."""
    return list(dict.fromkeys(n.gpu_type for n in room.nodes if n.gpu_type))


def typed_view(room: Room, capacity: Capacity, holding: Mapping[str, Allocation]) -> ClusterView:
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


def plan_across_kinds(jobs: Sequence[ScaledJob], room: Room, policy: Policy, now: float,
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
        "keep_share": round(keep, 3)}
    policy_words = f"{policy.name} policy across GPU kinds"

    def note(why: str) -> Action:
        return Action(ActionKind.NOTE, job.dlsub_id, job.slurm_job_id, why, details=details)

    if there.value * keep <= here.value:
        # The program placed it on the other kind to give its own GPUs to another job: never on their word.
        return note(f"stays on {job.gpu_type} ({policy_words}): {figures}; after its restart (keeping "
                    f"{keep:.0%} of the gain) it would be no faster there")
    if job.dlsub_id not in checkpointed:
        return note(f"not moved to {target} yet ({policy_words}): {figures}; it has not written a checkpoint "
                    "(only jobs that checkpoint are moved)")
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
