"""``optimus``: marginal utility with a fixed batch size (Optimus, EuroSys '18).

Each job in arrival order first gets one GPU while GPUs last; then each
further GPU goes to the job whose remaining time it shortens most
(remaining work is known: the "Oracle" variant of the Pollux evaluation),
up to the job's maximum. The batch size stays the job's own.
"""

from __future__ import annotations

import heapq
from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs
from dlsub.policies.elastic import place_counts
from dlsub.policies.perf_models.speedup import RemainingTime
from dlsub.policies.rigid import by_arrival


class OptimusPolicy:
    name: ClassVar[str] = "optimus"
    elastic: ClassVar[bool] = True

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        per_node = max((node.gpus for node in cluster.nodes), default=1)
        left = cluster.total_gpus
        counts: dict[str, int] = {}
        curves: dict[str, RemainingTime] = {}
        for job in by_arrival(jobs):
            if left == 0:
                break
            if job.hi >= 1:
                counts[job.name] = 1
                curves[job.name] = RemainingTime(job, per_node, adapt_batch=False)
                left -= 1
        hi = {job.name: job.hi for job in jobs}
        # Max-heap of (saving, arrival order) so ties go to the older job.
        order = {name: i for i, name in enumerate(counts)}
        heap = [(-curves[n].saving(1), order[n], n) for n in counts if hi[n] > 1]
        heapq.heapify(heap)
        while left > 0 and heap:
            neg_saving, rank, name = heapq.heappop(heap)
            if -neg_saving <= 0:
                break
            counts[name] += 1
            left -= 1
            if counts[name] < hi[name]:
                heapq.heappush(heap, (-curves[name].saving(counts[name]), rank, name))
        return place_counts(counts, jobs, cluster, previous)
