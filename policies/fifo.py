"""``fifo``: rigid jobs in arrival order; nothing is preempted.

Running jobs keep their GPUs. Waiting jobs start in arrival order; when
the oldest waiting job does not fit, later jobs that fit start in the gap
(first-fit backfill, with no reservation for the blocked job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from dlsub.policies.api import Allocation, ClusterView, Decision, JobView
from dlsub.policies.placement import free_gpus, pack


class FifoPolicy:
    name: ClassVar[str] = "fifo"

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: ClusterView,
        now: float,
        previous: Mapping[str, Allocation],
    ) -> Decision:
        live = {job.name for job in jobs}
        decision: Decision = {name: alloc for name, alloc in previous.items() if name in live}
        free = free_gpus(cluster, decision)
        for job in sorted(jobs, key=lambda job: (job.arrival_s, job.name)):
            if job.name in decision:
                continue
            nodes = pack(free, job.gpus)
            if nodes is not None:
                decision[job.name] = Allocation(nodes, job.batch_size)
        return decision
