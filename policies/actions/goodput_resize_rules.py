"""Elastic jobs sized by an elastic policy (``goodput``) on what they measured (pure: views in, actions out).

The live agent's counterpart of the simulator's allocation step. Each tick,
per partition, the elastic jobs running there and the GPU slots they could
use (the nodes they hold, plus idle nodes that no waiting job claims) go to
the policy's ``decide`` (the same object and the same code the simulator
calls), as :class:`~dlsub.policies.api.JobView` values whose performance
model the agent fitted from the job's own progress reports
(:mod:`dlsub.policies.perf_models.throughput_fit`). An elastic job changes size one
whole node (one worker task) at a time, so the policy is asked in units of
nodes: each job's view and model count whole nodes of its GPUs
(:class:`WholeNodes`), and the cluster is the slots those nodes fill, so
the policy never splits a node between jobs.

What the decision turns into:

* a job the policy gives more nodes grows onto idle slots (a held worker is
  released), as many as there are: a slot is a node whose idle GPUs, CPUs
  and memory hold that job's worker (:class:`~dlsub.policies.actions.resize_rules.Capacity`);
* a job the policy gives fewer nodes shrinks (its newest worker leaves)
  only when another job of the same user that the policy grows finds no
  idle slot: a node is taken from a job only to give it to one that gains
  more from it, and never on another user's word (a job's reported
  throughput is what the job says; another user could inflate it).

The policy itself holds the restart-cost hysteresis (a job keeps its size
unless changing it saves more than a restart costs); per-user limits come
in as each job's ``max_gpus`` and, across one user's jobs in one tick, as
``headroom``. Every action's reason shows the figures behind it: what the
job measured at each size it has run, what the model predicts at the new
size, and the time that saves (or costs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlsub.batch_split import BatchLimits, split_batch
from dlsub.policies.actions.resize_rules import GROW, SHRINK, Capacity, ElasticJob, Resize, Room, take_workers
from dlsub.policies.api import Allocation, ClusterView, Decision, JobView, Node, PerformanceModel, Policy
from dlsub.policies.perf_models.speedup import RemainingTime
from dlsub.policies.placement import packed_placement


@dataclass(frozen=True)
class ScaledJob:
    """An elastic job, its view for the policy, and what it measured.

    ``measured``: (nodes, replicas) -> (steps/s, samples/s or None) at each size it has run.
    ``batch``: the samples in one of its optimiser steps, when its reports say.
    ``limits``: its declared batch limits, when it lets dlsub choose its batch (the policy then does).
    ``borrowed``: how many configurations its model took from earlier runs of its command.
    """

    job: ElasticJob
    view: JobView
    measured: Mapping[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)
    batch: int | None = None
    limits: BatchLimits | None = None  # declared when it lets dlsub choose its batch size
    borrowed: int = 0


class WholeNodes:
    """A job's performance model counted in whole nodes of ``per_node`` GPUs: placement ``(1, 1)`` is two nodes."""

    def __init__(self, model: PerformanceModel, per_node: int) -> None:
        self.model = model
        self.per_node = per_node

    @property
    def trusted_gpus(self) -> int | None:
        trusted = getattr(self.model, "trusted_gpus", None)
        return None if trusted is None else max(1, trusted // self.per_node)

    def _gpus(self, placement: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(p * self.per_node for p in placement)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.model.step_time(self._gpus(placement), batch_size)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.model.goodput(self._gpus(placement), batch_size)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return self.model.best_batch(self._gpus(placement))


def in_nodes(view: JobView, per_node: int) -> JobView:
    """The view counted in whole nodes (what the policy is asked about)."""
    return dataclasses.replace(
        view, gpus=view.gpus // per_node, min_gpus=None if view.min_gpus is None else view.min_gpus // per_node,
        max_gpus=None if view.max_gpus is None else view.max_gpus // per_node,
        attained_gpu_s=view.attained_gpu_s / per_node,
        model=None if view.model is None else WholeNodes(view.model, per_node))


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
    """What the job measured at each size, e.g. "1 node 410 samples/s, 2 nodes 760 samples/s"."""
    earlier = (f"; earlier runs of the command measured {scaled.borrowed} other "
               f"configuration{'s' if scaled.borrowed != 1 else ''}") if scaled.borrowed else ""
    if not scaled.measured:
        return f"nothing yet{earlier}" if earlier else "nothing yet (the model is the prior)"
    parts = []
    # The sizes nearest the job's present one, at most MAX_SIZES_SHOWN of them.
    shown = sorted(sorted(scaled.measured.items(), key=lambda kv: abs(kv[0][0] - scaled.job.nodes_now))
                   [:MAX_SIZES_SHOWN])
    for (nodes, replicas), (steps, samples) in shown:
        rate = samples if samples is not None else steps
        parts.append(f"{_nodes_text(nodes)} ({replicas} GPU{'s' if replicas != 1 else ''}) "
                     f"{_rate_text(rate, samples is not None)}")
    return ", ".join(parts) + earlier


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
        guess = "" if view.remaining is not None else " (remaining work guessed: none declared)"
        text += (f", est. {_minutes(saved)} saved{guess}" if saved >= 0
                 else f", est. {_minutes(-saved)} longer{guess}")
    return text


def _batch_at(scaled: ScaledJob, decision: Decision, nodes: int) -> tuple[int | None, int | None, str]:
    """(global batch, micro-steps per step, words) the policy picked for a job that lets dlsub choose."""
    alloc = decision.get(scaled.job.dlsub_id)
    if scaled.limits is None or alloc is None or alloc.batch_size is None:
        return None, None, ""
    replicas = scaled.job.gpus_at(nodes)
    atomic, extra = split_batch(scaled.limits, replicas, alloc.batch_size)
    batch = atomic * replicas * (extra + 1)
    return batch, extra + 1, f"; batch {batch} ({extra + 1} micro-step(s) of {atomic} per GPU)"


def plan_by_policy(jobs: Sequence[ScaledJob], room: Room, policy: Policy, now: float,
                   headroom: Mapping[int, int] | None = None) -> list[Resize]:
    """Grow and shrink the elastic jobs of one partition to the sizes ``policy`` decides.

    ``room``: the partition as observed (idle GPUs per node, and what jobs waiting there want: their
    claim on idle nodes comes first). ``headroom``: GPUs each uid may still add this tick.
    """
    if not jobs:
        return []
    # Waiting jobs keep first claim on idle GPUs; each job is checked against its own per-node request.
    capacity = Capacity(room, reserve_gpus=room.waiting_gpus)
    free = [f"{room.name}#{i}" for i in range(max(capacity.count(s.job) for s in jobs))]
    # In whole nodes: every slot is one node's worth of a job's GPUs.
    nodes: list[Node] = [Node(slot, 1, partition=room.name) for slot in free]
    previous: dict[str, Allocation] = {}
    for scaled in jobs:
        own = tuple(f"{scaled.job.dlsub_id}#{i}" for i in range(scaled.job.nodes_now))
        nodes.extend(Node(slot, 1, partition=room.name) for slot in own)
        previous[scaled.job.dlsub_id] = Allocation(own)
    views = [in_nodes(s.view, s.job.gpus_per_worker) for s in jobs]
    decision = policy.decide(views, ClusterView(tuple(nodes)), now, previous)
    target: dict[str, int] = {}
    for scaled in jobs:
        job = scaled.job
        given = decision[job.dlsub_id].gpus if job.dlsub_id in decision else 0
        target[job.dlsub_id] = max(job.min_nodes, min(job.max_nodes, given))
    left = dict(headroom or {})
    actions: list[Resize] = []
    wanting: dict[int, int] = {}  # per uid: nodes the policy grows its jobs by that no idle slot can give
    order = sorted(jobs, key=lambda s: (-(target[s.job.dlsub_id] - s.job.nodes_now), s.job.submit_time,
                                        s.job.slurm_job_id))
    for scaled in order:
        job = scaled.job
        want = target[job.dlsub_id] - job.nodes_now
        if want <= 0:
            continue
        if job.uid in left:
            want = min(want, left[job.uid] // job.gpus_per_worker)
        taken = take_workers(job, capacity, want)
        if want > len(taken):
            wanting[job.uid] = wanting.get(job.uid, 0) + want - len(taken)
        for size, placed in enumerate(taken, start=job.nodes_now + 1):
            worker = placed.worker
            if job.uid in left:
                left[job.uid] -= job.gpus_per_worker
            batch, micro, words = _batch_at(scaled, decision, size)
            actions.append(Resize(GROW, job.dlsub_id, job.slurm_job_id, worker=worker.handle,
                                  partition=room.name, node=placed.node, batch_size=batch,
                                  accumulation_steps=micro, reason=(
                                      f"growing to {_size_text(job, size)} ({policy.name} policy): "
                                      f"{_figures(scaled, job.nodes_now, size)}{words}; released worker "
                                      f"{worker.handle} to join the group")))
    # Workers already leaving give their nodes back soon: not one more shrink for the same want.
    for scaled in jobs:
        leaving = sum(1 for w in scaled.job.workers if w.leaving)
        wanting[scaled.job.uid] = wanting.get(scaled.job.uid, 0) - leaving
    # A node is taken from a job only for another job of the same user: the throughput a job reports is its
    # own word, and another user's word must never shrink it (waiting jobs' minimums are resize.py's affair).
    for scaled in sorted(jobs, key=lambda s: (s.job.submit_time, s.job.slurm_job_id), reverse=True):
        job = scaled.job
        running = sorted((w for w in job.workers if w.state == "RUNNING" and not w.leaving),
                         key=lambda w: -w.start_time)
        size = job.nodes_now
        while wanting.get(job.uid, 0) > 0 and size > target[job.dlsub_id] and running:
            worker = running.pop(0)
            wanting[job.uid] -= 1
            size -= 1
            batch, micro, words = _batch_at(scaled, decision, size)
            actions.append(Resize(SHRINK, job.dlsub_id, job.slurm_job_id, worker=worker.handle,
                                  batch_size=batch, accumulation_steps=micro, reason=(
                f"shrinking to {_size_text(job, size)} ({policy.name} policy): another elastic job of yours gains "
                f"more from the node; {_figures(scaled, job.nodes_now, size)}{words}; the worker on "
                f"{','.join(worker.nodes) or '?'} checkpoints with the group and goes back to the held pool")))
    return actions
