"""``gang``: all-or-nothing FIFO with locality.

A job starts only when all of its workers can start together, so no job
ever holds part of what it needs while waiting for the rest (the deadlock
of per-worker scheduling, where several half-placed jobs hold every GPU
and none can run). Its workers are packed on as few nodes as possible and,
when there is a choice, on nodes no other job uses: the locality rule of
gang schedulers for DL jobs on Kubernetes. Running jobs are not preempted;
jobs that fit start in arrival order, smaller ones backfilling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from dlsub.policies.api import Allocation, ClusterView, Decision, JobView
from dlsub.policies.placement import free_gpus, pack
from dlsub.policies.rigid import by_arrival


class GangPolicy:
    name: ClassVar[str] = "gang"

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: ClusterView,
        now: float,
        previous: Mapping[str, Allocation],
    ) -> Decision:
        live = {job.name: job for job in jobs}
        # Only whole gangs carry over: a partial allocation (from another
        # policy, or a job that grew its request) is given back.
        decision: Decision = {
            name: alloc
            for name, alloc in previous.items()
            if name in live and alloc.gpus == live[name].gpus
        }
        capacity = cluster.capacity()
        free = free_gpus(cluster, decision)
        for job in by_arrival(jobs):
            if job.name in decision:
                continue
            nodes = pack(free, job.gpus, capacity=capacity)
            if nodes is not None:
                decision[job.name] = Allocation(nodes, job.batch_size)
        return decision
