"""``rr``: round-robin time slices among the jobs that want GPUs.

A running job keeps its GPUs for one slice; then it goes to the back of
the line, behind every job that was already waiting, and gives its GPUs
up if the jobs ahead of it take them. The line is ordered by when each
job (re)joined it, which the driver passes as ``waiting_since_s`` (or
``running_since_s`` + slice for a job whose slice is over), so the
policy keeps no state. Jobs are rigid; smaller jobs backfill.
"""

from __future__ import annotations

from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs, JobView
from dlsub.policies.placement import pack
from dlsub.policies.rigid import admit_by_count, place_keeping


class RoundRobinPolicy:
    name: ClassVar[str] = "rr"

    def __init__(self, slice_s: float = 600.0) -> None:
        self.slice_s = slice_s

    def _line_key(self, job: JobView, now: float) -> tuple[int, float, float, str]:
        if job.running_since_s is not None and now - job.running_since_s < self.slice_s:
            return (0, job.running_since_s, job.arrival_s, job.name)
        if job.running_since_s is not None:
            joined = job.running_since_s + self.slice_s
        else:
            joined = job.waiting_since_s if job.waiting_since_s is not None else job.arrival_s
        return (1, joined, job.arrival_s, job.name)

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        line = sorted(jobs, key=lambda job: self._line_key(job, now))
        admitted = admit_by_count(line, cluster.total_gpus)
        return place_keeping(admitted, previous, cluster, pack)
