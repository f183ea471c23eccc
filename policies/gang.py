"""``gang``: all-or-nothing FIFO with locality.

A job starts only when all of its workers can start together, so no job
ever holds part of what it needs while waiting for the rest (the deadlock
of per-worker scheduling, where several half-placed jobs hold every GPU
and none can run): an allocation that is not the whole gang (inherited from
another policy, or a job that changed its request) is given back. A job's
workers are packed on as few nodes as possible and, when there is a
choice, on nodes no other job uses: the locality rule of gang schedulers
for DL jobs on Kubernetes. Running jobs are not preempted; jobs that fit
start in arrival order, smaller ones backfilling.
"""

from __future__ import annotations

import functools
from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs
from dlsub.policies.placement import pack
from dlsub.policies.rigid import by_arrival, place_keeping


class GangPolicy:
    name: ClassVar[str] = "gang"

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        placer = functools.partial(pack, capacity=cluster.capacity())
        return place_keeping(by_arrival(jobs), previous, cluster, placer)
