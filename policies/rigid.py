"""Shared steps of the rigid policies (fifo, rr, tiresias, gang): each job runs
at exactly the GPUs it asked for, or not at all."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from dlsub.policies.api import Allocation, ClusterView, Decision, JobView
from dlsub.policies.placement import free_gpus, spread

Placer = Callable[..., "tuple[str, ...] | None"]


def admit_by_count(order: Iterable[JobView], total_gpus: int) -> list[JobView]:
    """Walk ``order`` and admit every job whose GPUs still fit in the total.

    A job that does not fit is skipped, not waited for, so smaller jobs
    behind it backfill the gap.
    """
    admitted: list[JobView] = []
    left = total_gpus
    for job in order:
        if 0 < job.gpus <= left:
            admitted.append(job)
            left -= job.gpus
    return admitted


def place_keeping(
    admitted: Sequence[JobView],
    previous: Mapping[str, Allocation],
    cluster: ClusterView,
    placer: Placer = spread,
) -> Decision:
    """Admitted jobs keep their current GPUs; the others are placed in order.

    A job that cannot be placed (its GPUs are free in total but, for a
    placer that needs them together, not where it needs them) waits.
    """
    decision: Decision = {}
    for job in admitted:
        alloc = previous.get(job.name)
        if alloc is not None and alloc.gpus == job.gpus:
            decision[job.name] = alloc
    free = free_gpus(cluster, decision)
    for job in admitted:
        if job.name in decision:
            continue
        nodes = placer(free, job.gpus)
        if nodes is not None:
            decision[job.name] = Allocation(nodes, job.batch_size)
    return decision


def by_arrival(jobs: Iterable[JobView]) -> list[JobView]:
    return sorted(jobs, key=lambda job: (job.arrival_s, job.name))
