"""``tiresias``: discretised two-queue least-attained-service (Tiresias, NSDI '19).

Every job starts in the high-priority queue; once its attained service
reaches ``threshold_gpu_s`` (16 GPU-hours, as in the Pollux evaluation) it
is demoted to the low-priority queue. Within a queue jobs go in arrival
order; jobs are admitted while their (rigid) GPU counts fit, skipping
those that do not, and admitted jobs keep their GPUs while others are
placed from the nodes with the most free GPUs. A running job that loses
its place is preempted.
"""

from __future__ import annotations

from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs, JobView
from dlsub.policies.rigid import admit_by_count, by_arrival, place_keeping

SIXTEEN_GPU_HOURS = 16 * 3600.0


class TiresiasPolicy:
    name: ClassVar[str] = "tiresias"

    def __init__(self, threshold_gpu_s: float = SIXTEEN_GPU_HOURS) -> None:
        self.threshold_gpu_s = threshold_gpu_s

    def queue_of(self, job: JobView) -> int:
        return 0 if job.attained_gpu_s < self.threshold_gpu_s else 1

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        ordered = by_arrival(jobs)
        line = [job for job in ordered if self.queue_of(job) == 0] + [
            job for job in ordered if self.queue_of(job) == 1
        ]
        admitted = admit_by_count(line, cluster.total_gpus)
        return place_keeping(admitted, previous, cluster)
