"""Elastic jobs sized by an elastic policy (``goodput``) on what they measured (pure: views in, actions out).

The live agent's counterpart of the simulator's allocation step, in the
simulator's own terms. Each tick, per partition, the elastic jobs running
there go to the policy's ``decide`` (the same object and the same code the
simulator calls) as :class:`~dlsub.policies.api.JobView` values in GPUs,
whose performance model the agent fitted from the job's own progress
reports (:mod:`dlsub.policies.perf_models.throughput_fit`), with the
partition's real nodes (:class:`~dlsub.policies.api.ClusterView`: on each
node, the GPUs idle after waiting jobs' claims plus those the elastic jobs
hold there) and each job's real :class:`~dlsub.policies.api.Allocation`
(the node of every GPU it holds: its main job's, then its workers' by
start). What differs from the simulator is stated to the policy, not
translated behind its back: a job changes size in whole workers
(``JobView.step``: the GPUs of one worker, one for ``--gpus MIN:MAX``, a
node's for ``--nodes``), and a running job grows and shrinks in place
(``ClusterView.grow_in_place``: it keeps the GPUs it holds and adds a
worker's on one node, its own first; a shrink sends its newest worker
away).

What the decision turns into:

* a job the policy gives more GPUs grows by releasing held workers, each
  pointed at the node the policy put its new GPUs on, when that node's idle
  GPUs, CPUs and memory hold the worker
  (:class:`~dlsub.policies.actions.resize_rules.Capacity`); else on the idle
  node Capacity picks (own nodes first); with nothing idle, not now;
* a job the policy gives fewer GPUs shrinks (its newest worker leaves)
  only when another job of the same user that the policy grows finds no
  idle GPUs: GPUs are taken from a job only to give them to one that gains
  more from them, and never on another user's word (a job's reported
  throughput is what the job says; another user could inflate it).

A job in the middle of a resize (a released worker not yet running, or a
worker leaving) keeps its size this tick, and the GPUs it is taking or
giving back are offered to no one. The policy itself holds the
restart-cost hysteresis (a job keeps its size unless changing it saves
more than a restart costs); per-user limits come in as each job's
``max_gpus`` and, across one user's jobs in one tick, as ``headroom``.
Every action's reason shows the figures behind it: what the job measured
at each size it has run, what the model predicts at the new size, the
time that saves (or costs), and where the policy placed the worker.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlsub.batch_split import BatchLimits, split_batch
from dlsub.policies.actions.kinds import ActionKind
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.actions.resize_rules import Capacity, ElasticJob, Resize, take_workers
from dlsub.policies.api import Allocation, ClusterView, Decision, JobView, Node, Policy
from dlsub.policies.perf_models.speedup import RemainingTime
from dlsub.policies.placement import packed_placement


@dataclass(frozen=True)
class ScaledJob:
    """An elastic job, its view for the policy, and what it measured.

    ``measured``: (nodes, replicas) -> (steps/s, samples/s or None) at each size it has run.
    ``batch``: the samples in one of its optimiser steps, when its reports say.
    ``limits``: its declared batch limits, when it lets dlsub choose its batch (the policy then does).
    ``borrowed``: how many configurations its model took from earlier runs of its command.
    ``gpu_type``: the kind of GPU it runs on, where Slurm's GRES names one (what it measured is on that kind).
    """

    job: ElasticJob
    view: JobView
    measured: Mapping[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)
    batch: int | None = None
    limits: BatchLimits | None = None  # declared when it lets dlsub choose its batch size
    borrowed: int = 0
    gpu_type: str | None = None


#: Measured sizes a reason lists.
MAX_SIZES_SHOWN = 6


def _rate_text(rate: float, samples: bool) -> str:
    return f"{rate:.0f} samples/s" if samples and rate >= 10 else (
        f"{rate:.1f} samples/s" if samples else f"{rate:.2f} steps/s")


def _nodes_text(nodes: int) -> str:
    return f"{nodes} node{'s' if nodes != 1 else ''}"


def _size_text(job: ElasticJob, members: int) -> str:
    """Its size at ``members`` members: "2 nodes", or "3 GPUs" for a job elastic in GPUs."""
    return job.size_text(members) if job.worker_gpus else _nodes_text(members)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if abs(seconds) >= 90 else f"{seconds:.0f} s"


def measured_text(scaled: ScaledJob) -> str:
    """What the job measured at each size, e.g. "1 node 410 samples/s, 2 nodes 760 samples/s" (", on a100"
    where its GPUs have a type: it measured on that kind only)."""
    earlier = (f"; earlier runs of the command measured {scaled.borrowed} other "
               f"configuration{'s' if scaled.borrowed != 1 else ''}") if scaled.borrowed else ""
    if not scaled.measured:
        return f"nothing yet{earlier}" if earlier else "nothing yet (the model is the prior)"
    parts = []
    # The sizes nearest the job's present one, at most MAX_SIZES_SHOWN of them.
    shown = sorted(sorted(scaled.measured.items(), key=lambda kv: abs(kv[0][0] - scaled.job.members_now))
                   [:MAX_SIZES_SHOWN])
    for (nodes, replicas), (steps, samples) in shown:
        rate = samples if samples is not None else steps
        parts.append(f"{_nodes_text(nodes)} ({replicas} GPU{'s' if replicas != 1 else ''}) "
                     f"{_rate_text(rate, samples is not None)}")
    return ", ".join(parts) + (f" on {scaled.gpu_type}" if scaled.gpu_type else "") + earlier


def model_text(scaled: ScaledJob) -> str:
    """Which model sized the job, e.g. "its throughput fit on 2 sizes it ran and 3 configurations of earlier
    runs of its command" (``dlsub why`` shows it in every resize's reason)."""
    if scaled.view.model is None:
        return "no model (its own size)"
    own, borrowed = len(scaled.measured), scaled.borrowed
    if not own and not borrowed:
        return "the throughput model's prior (it has measured nothing yet)"
    parts = [f"{own} size{'s' if own != 1 else ''} it ran"] if own else []
    if borrowed:
        parts.append(f"{borrowed} configuration{'s' if borrowed != 1 else ''} of earlier runs of its command")
    return "its throughput fit on " + " and ".join(parts)


def predicted_rate(scaled: ScaledJob, nodes: int) -> tuple[float, bool] | None:
    """(rate, in samples/s) the job's model predicts on ``nodes`` nodes; None without a model."""
    view, job = scaled.view, scaled.job
    model = view.model
    if model is None or job.gpus_per_node <= 0:
        return None
    batch = view.batch_size or scaled.batch or 1
    gpus = job.gpus_at(nodes)
    step = model.step_time(packed_placement(gpus, job.packing(gpus)), batch)
    if step <= 0:
        return None
    return (batch / step, True) if scaled.batch else (1.0 / step, False)


def _figures(scaled: ScaledJob, before: int, after: int) -> str:
    """The measured and predicted figures and the seconds the change saves (negative: costs)."""
    text = f"sized on {model_text(scaled)}; measured {measured_text(scaled)}"
    predicted = predicted_rate(scaled, after)
    if predicted is not None:
        rate, samples = predicted
        text += f"; predicted {_size_text(scaled.job, after)} {_rate_text(rate, samples)}"
    view, job = scaled.view, scaled.job
    if view.model is not None:
        curve = RemainingTime(view, job.packing(job.max_gpus), adapt_batch=True, guess_remaining=True)
        saved = curve.time(job.gpus_at(before)) - curve.time(job.gpus_at(after))
        guess = f" ({curve.basis})" if curve.guessed else ""
        text += (f", est. {_minutes(saved)} saved{guess}" if saved >= 0
                 else f", est. {_minutes(-saved)} longer{guess}")
    return text


def _valued_where(alloc: Allocation | None, policy: Policy) -> str:
    """What a policy that values a job's GPUs where they are (goodput's ``place_aware``) judged its size on:
    the nodes of the placement it decided, not a packed one (the saving above is the packed estimate)."""
    if alloc is None or not alloc.placement or not getattr(policy, "place_aware", False):
        return ""
    spans = len(alloc.placement)
    return f"; its GPUs valued where they are: on {spans} node{'s' if spans != 1 else ''}"


def _batch_at(scaled: ScaledJob, decision: Decision, nodes: int, policy: Policy) -> tuple[int | None, int | None, str]:
    """(global batch, micro-steps per step, words) the policy picked for a job that lets dlsub choose. A
    policy that tunes the batch on the nodes a job was placed on (goodput's ``batch_on_placement``) says so:
    spread over more nodes than its size was judged on, its batch is the one best there."""
    alloc = decision.get(scaled.job.dlsub_id)
    if scaled.limits is None or alloc is None or alloc.batch_size is None:
        return None, None, ""
    replicas = scaled.job.gpus_at(nodes)
    atomic, extra = split_batch(scaled.limits, replicas, alloc.batch_size)
    batch = atomic * replicas * (extra + 1)
    words = f"; batch {batch} ({extra + 1} micro-step(s) of {atomic} per GPU)"
    if getattr(policy, "batch_on_placement", False):
        spans = len(alloc.placement)
        words += f", the best its model rates on the {spans} node{'s' if spans != 1 else ''} it was placed on"
    return batch, extra + 1, words


def held_gpus(job: ElasticJob) -> tuple[str, ...]:
    """The node of each GPU the job holds: its main job's first, then its running workers' oldest first (so a
    policy that shrinks it in place keeps a prefix, and the workers cut are the newest, the ones that leave).
    A node squeue did not name stands as a name of the job's own, so its GPUs still count."""
    main = (*job.main_nodes, *(f"{job.dlsub_id}#main{i}" for i in range(len(job.main_nodes), job.min_members)))
    nodes = [node for node in main[:job.min_members] for _ in range(job.gpus_per_node)]
    running = sorted((w for w in job.workers if w.state == "RUNNING"), key=lambda w: (w.start_time, w.handle))
    for worker in running:
        nodes.extend([worker.nodes[0] if worker.nodes else f"{worker.handle}#node"] * job.gpus_per_worker)
    return tuple(nodes)


def resizing(job: ElasticJob) -> bool:
    """Whether a resize of the job is under way: a released worker not yet running, or one leaving."""
    return any(w.leaving or w.starting for w in job.workers)


def partition_view(room: PartitionView, capacity: Capacity, holding: Mapping[str, Allocation]) -> ClusterView:
    """The GPUs the policy may hand out: on each node, those idle after waiting jobs' claims
    (``capacity``) and those the jobs being sized hold there."""
    offered: Counter[str] = Counter({name: node.gpus for name, node in capacity.nodes.items()})
    for alloc in holding.values():
        offered.update(alloc.nodes)
    return ClusterView(tuple(Node(name, gpus, partition=room.name) for name, gpus in offered.items() if gpus > 0),
                       grow_in_place=True)


def new_spots(job: ElasticJob, decided: Allocation | None, held: Allocation) -> list[str]:
    """The node of each worker the policy adds to the job: where its decision has a worker's GPUs more
    than the job holds."""
    if decided is None:
        return []
    added = Counter(decided.nodes) - Counter(held.nodes)
    return [node for node, gpus in added.items() for _ in range(gpus // job.gpus_per_worker)]


def members_given(job: ElasticJob, decided: Allocation | None) -> int:
    """The job's members (main job, then workers) at the GPUs the policy gave it; a job it left out or gave
    less than its minimum keeps its main job (the agent never stops a job to size it)."""
    gpus = 0 if decided is None else decided.gpus
    return min(job.max_members, job.min_members + max(0, gpus - job.main_gpus) // job.gpus_per_worker)


def plan_by_policy(jobs: Sequence[ScaledJob], room: PartitionView, policy: Policy, now: float,
                   headroom: Mapping[int, int] | None = None) -> list[Resize]:
    """Grow and shrink the elastic jobs of one partition to the sizes ``policy`` decides.

    ``room``: the partition as observed (idle GPUs per node, and what jobs waiting there want: their
    claim on idle GPUs comes first). ``headroom``: GPUs each uid may still add this tick.
    """
    capacity, settled, held = settled_and_held(jobs, room)
    if not settled:
        return []
    decision = policy.decide(policy_views(settled), partition_view(room, capacity, held), now, held)
    return resizes_from(jobs, settled, decision, held, capacity, room, policy, headroom)


def policy_views(settled: Sequence[ScaledJob]) -> list[JobView]:
    """The jobs' views as the policy is asked about them: in steps of one worker, and a job of whole nodes
    judged on its GPUs a node as it asked for them, (2, 2) and not (4,) (the placement it measures itself on:
    where several of its members share a node, they may run faster)."""
    return [dataclasses.replace(s.view, step=s.job.gpus_per_worker,
                                packing=None if s.job.worker_gpus else s.job.gpus_per_node) for s in settled]


def settled_and_held(jobs: Sequence[ScaledJob], room: PartitionView, same_kind: bool = False) -> tuple[
        Capacity, list[ScaledJob], dict[str, Allocation]]:
    """What the policy may hand out in ``room`` (idle GPUs after waiting jobs' and starting workers' claims;
    ``same_kind``: each job's workers on nodes of its own GPU kind only), the jobs not in the middle of a
    resize, and the GPUs each of those holds."""
    # GPUs that released workers are about to take: claimed, like a waiting job's.
    starting = sum(s.job.gpus_per_worker for s in jobs for w in s.job.workers if w.starting)
    capacity = Capacity(room, reserve_gpus=room.waiting_gpus + starting, same_kind=same_kind)
    settled = [s for s in jobs if not resizing(s.job)]
    return capacity, settled, {s.job.dlsub_id: Allocation(held_gpus(s.job)) for s in settled}


def resizes_from(jobs: Sequence[ScaledJob], settled: Sequence[ScaledJob], decision: Decision,
                 held: Mapping[str, Allocation], capacity: Capacity, room: PartitionView, policy: Policy,
                 headroom: Mapping[int, int] | None) -> list[Resize]:
    """The grows and shrinks that bring the settled jobs to the sizes ``decision`` gives them (see the
    module's doc for which are carried out)."""
    target = {s.job.dlsub_id: members_given(s.job, decision.get(s.job.dlsub_id)) for s in settled}
    left = dict(headroom or {})
    actions: list[Resize] = []
    wanting: dict[int, int] = {}  # per uid: GPUs the policy grows its jobs by that no idle node can give now
    order = sorted(settled, key=lambda s: (-(target[s.job.dlsub_id] - s.job.members_now), s.job.submit_time,
                                           s.job.slurm_job_id))
    for scaled in order:
        job = scaled.job
        want = target[job.dlsub_id] - job.members_now
        if want <= 0 or job.finished:  # a finished training's group is on its way out: nothing to grow
            continue
        if job.uid in left:
            want = min(want, left[job.uid] // job.gpus_per_worker)
        spots = new_spots(job, decision.get(job.dlsub_id), held[job.dlsub_id])
        taken = take_workers(job, capacity, want, spots)
        if want > len(taken):
            wanting[job.uid] = wanting.get(job.uid, 0) + (want - len(taken)) * job.gpus_per_worker
        for size, placed in enumerate(taken, start=job.members_now + 1):
            worker = placed.worker
            if job.uid in left:
                left[job.uid] -= job.gpus_per_worker
            batch, micro, words = _batch_at(scaled, decision, size, policy)
            actions.append(Resize(ActionKind.GROW, job.dlsub_id, job.slurm_job_id, worker=worker.handle,
                                  partition=room.name, node=placed.node, batch_size=batch,
                                  accumulation_steps=micro, reason=(
                                      f"growing to {_size_text(job, size)} ({policy.name} policy): "
                                      f"{_figures(scaled, job.members_now, size)}{words}"
                                      f"{_valued_where(decision.get(job.dlsub_id), policy)}; {placed.why}; released "
                                      f"worker {worker.handle} there to join the group")))
    # Workers already leaving give their GPUs back soon: not one more shrink for the same want.
    for scaled in jobs:
        leaving = sum(1 for w in scaled.job.workers if w.leaving)
        wanting[scaled.job.uid] = wanting.get(scaled.job.uid, 0) - leaving * scaled.job.gpus_per_worker
    # GPUs are taken from a job only for another job of the same user: the throughput a job reports is its
    # own word, and another user's word must never shrink it (waiting jobs' minimums are resize.py's affair).
    for scaled in sorted(settled, key=lambda s: (s.job.submit_time, s.job.slurm_job_id), reverse=True):
        job = scaled.job
        running = sorted((w for w in job.workers if w.state == "RUNNING" and not w.leaving),
                         key=lambda w: -w.start_time)
        size = job.members_now
        while wanting.get(job.uid, 0) > 0 and size > target[job.dlsub_id] and running:
            worker = running.pop(0)
            wanting[job.uid] -= job.gpus_per_worker
            size -= 1
            batch, micro, words = _batch_at(scaled, decision, size, policy)
            actions.append(Resize(ActionKind.SHRINK, job.dlsub_id, job.slurm_job_id, worker=worker.handle,
                                  batch_size=batch, accumulation_steps=micro, reason=(
                f"shrinking to {_size_text(job, size)} ({policy.name} policy): another elastic job of yours gains "
                f"more from its GPUs; {_figures(scaled, job.members_now, size)}{words}; the worker on "
                f"{','.join(worker.nodes) or '?'} checkpoints with the group and goes back to the held pool")))
    return actions
