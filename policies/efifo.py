"""``efifo``: elastic FIFO.

In arrival order every job gets its minimum while the minimums fit (a job
whose minimum does not fit waits, and jobs behind it that fit go ahead);
then the spare GPUs go to the oldest admitted jobs, each up to its
maximum. Jobs whose count does not change keep their GPUs.
"""

from __future__ import annotations

from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs
from dlsub.policies.elastic import place_counts
from dlsub.policies.rigid import by_arrival


class ElasticFifoPolicy:
    name: ClassVar[str] = "efifo"
    elastic: ClassVar[bool] = True

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        left = cluster.total_gpus
        counts: dict[str, int] = {}
        ordered = by_arrival(jobs)
        for job in ordered:
            if 0 < job.lo <= left:
                counts[job.name] = job.lo
                left -= job.lo
        for job in ordered:
            if job.name in counts and left > 0:
                extra = min(job.hi - counts[job.name], left)
                counts[job.name] += extra
                left -= extra
        return place_counts(counts, jobs, cluster, previous)
