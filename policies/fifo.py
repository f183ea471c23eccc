"""``fifo``: rigid jobs in arrival order; nothing is preempted.

Running jobs keep their GPUs. Waiting jobs start in arrival order, each on
as few nodes as it can; when the oldest waiting job does not fit, later
jobs that fit start in the gap (first-fit backfill, with no reservation
for the blocked job).
"""

from __future__ import annotations

from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs
from dlsub.policies.placement import pack
from dlsub.policies.rigid import by_arrival, place_keeping


class FifoPolicy:
    name: ClassVar[str] = "fifo"

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        return place_keeping(by_arrival(jobs), previous, cluster, pack)
