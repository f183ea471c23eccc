"""``worker-greedy``: each worker placed on its own as GPUs free up (not for use).

How a scheduler that knows nothing of gangs (a default Kubernetes
scheduler placing one pod at a time) treats multi-worker jobs: one more
GPU, round-robin over the waiting jobs in arrival order, until GPUs run
out; what a job holds it keeps. Jobs that got part of what they need hold
it without running, and when every GPU is held that way nothing can ever
start. It exists to show that (the gang scenario); ``gang`` is the fix.
"""

from __future__ import annotations

from typing import ClassVar

from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, Jobs
from dlsub.policies.placement import free_gpus, spread
from dlsub.policies.rigid import by_arrival


class WorkerGreedyPolicy:
    name: ClassVar[str] = "worker-greedy"
    holds_partial: ClassVar[bool] = True

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        live = {job.name for job in jobs}
        held: dict[str, list[str]] = {
            name: list(alloc.nodes) for name, alloc in previous.items() if name in live
        }
        free = free_gpus(cluster, previous)
        wanting = [job for job in by_arrival(jobs) if len(held.get(job.name, [])) < job.gpus]
        while wanting and sum(free.values()) > 0:
            for job in list(wanting):
                node = spread(free, 1)
                if node is None:
                    break
                held.setdefault(job.name, []).extend(node)
                if len(held[job.name]) >= job.gpus:
                    wanting.remove(job)
        by_name = {job.name: job for job in jobs}
        return {name: Allocation(tuple(nodes), by_name[name].batch_size) for name, nodes in held.items() if nodes}
