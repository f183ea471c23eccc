"""``goodput``: each job's GPU count and batch size chosen for cluster-wide goodput.

Goodput is progress per second: throughput times statistical efficiency
(Pollux, OSDI '21). Where Pollux searches allocations with a genetic
algorithm, this policy is a greedy solver of our own, cheap enough for the
live agent (one decision for 1,000 jobs with fitted models on 256 nodes
takes under 100 ms):

1. Every job's remaining time on ``n`` GPUs, ``T(n)``, comes from its
   performance model at the batch size that maximises its goodput on a
   packed placement of ``n`` GPUs (or at its own batch size, for a job
   that cannot change it).
2. Jobs are served shortest remaining time first (``T(1)``), which is what
   minimises average completion time. Each takes GPUs while one more (or
   one more node's worth, so that crossing a node boundary is judged
   fairly) still speeds it up by at least ``efficiency_floor`` of what its
   first GPU gives; the rest go to the next job.
3. GPUs still free go, one at a time, to the job whose remaining time they
   shorten most.
4. A running job keeps its current GPU count when changing it would save
   less than ``restart_penalty_s`` × ``restart_weight`` seconds, since every
   change costs a restart.

A job's model may say how far it can be trusted (``trusted_gpus``: a model
fitted from the job's own reports trusts up to four times the most GPUs
it has run on, see :data:`~dlsub.policies.fitted_model.TRUSTED_FACTOR`);
the job gets no more than that, so it grows as its reports come in. A job
that does not say how much work it has left is expected to need about as
much again as it has done (see :class:`~dlsub.policies.speedup.RemainingTime`).
"""

from __future__ import annotations

import heapq
import math
from typing import ClassVar

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs, JobView
from dlsub.policies.elastic import place_counts
from dlsub.policies.speedup import LEVEL_BASE, RemainingTime


class GoodputPolicy:
    name: ClassVar[str] = "goodput"
    elastic: ClassVar[bool] = True
    adapts_batch: ClassVar[bool] = True
    # It needs only what a job reports (see dlsub.policies.sim.information).
    learns_online: ClassVar[bool] = True

    def __init__(
        self,
        efficiency_floor: float = 0.25,
        restart_penalty_s: float = 30.0,
        restart_weight: float = 10.0,
    ) -> None:
        self.efficiency_floor = efficiency_floor
        self.restart_penalty_s = restart_penalty_s
        self.restart_weight = restart_weight

    @staticmethod
    def _hi(job: JobView) -> int:
        """The job's maximum, within what its model can vouch for (never below its minimum)."""
        trusted = getattr(job.model, "trusted_gpus", None)
        return job.hi if trusted is None else max(min(job.hi, trusted), job.lo)

    def _grow(self, curve: RemainingTime, start: int, limit: int, per_node: int) -> int:
        """Largest count from ``start`` whose every increment is worth the floor."""
        if not 0.0 < curve.time(1) < math.inf or curve.time(start) <= 0.0:
            return start  # no work left (or no rate at all): more GPUs cannot speed it up
        base = 1.0 / curve.time(1)
        n = start
        while n < limit:
            best_k, best_gain = 0, 0.0
            for k in range(1, min(per_node, limit - n) + 1):
                gain = (1.0 / curve.time(n + k) - 1.0 / curve.time(n)) / (k * base)
                if gain > best_gain:
                    best_k, best_gain = k, gain
            if best_k == 0 or best_gain < self.efficiency_floor:
                break
            n += best_k
        return n

    @staticmethod
    def _offer(curve: RemainingTime, n: int, hi: int, left: int, per_node: int, min_saving: float) -> tuple[float, int]:
        """(minus the seconds saved per GPU, GPUs) of the best step up from ``n``;
        a step must save at least ``min_saving`` seconds in all."""
        best = (0.0, 1)
        for k in range(1, min(per_node, hi - n, left) + 1):
            saved = curve.time(n) - curve.time(n + k)
            if saved >= min_saving and -saved / k < best[0]:
                best = (-saved / k, k)
        return best

    @staticmethod
    def _rank(job: JobView, curve: RemainingTime, previous: Allocations) -> float:
        """Jobs are served in this order (then by arrival): remaining time on
        their minimum. A running job of guessed length ranks with the jobs
        one level shorter than its guess (hysteresis): when its work done
        crosses a level it is not preempted at once by the younger jobs it
        was ahead of a moment before (on workload-7 at 1.0x this cut the
        online average JCT by 7%)."""
        seconds = curve.time(max(job.lo, 1))
        return seconds / LEVEL_BASE if curve.guessed and job.name in previous else seconds

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        per_node = max((node.gpus for node in cluster.nodes), default=1)
        curves = {job.name: RemainingTime(job, per_node, adapt_batch=True, guess_remaining=True) for job in jobs}
        his = {job.name: self._hi(job) for job in jobs}
        order = sorted(jobs, key=lambda job: (self._rank(job, curves[job.name], previous), job.arrival_s, job.name))
        keep_margin = self.restart_penalty_s * self.restart_weight
        left = cluster.total_gpus
        counts: dict[str, int] = {}
        for job in order:
            lo = max(job.lo, 1)
            if lo > left:
                continue
            curve = curves[job.name]
            n = self._grow(curve, lo, min(his[job.name], left), per_node)
            current = previous[job.name].gpus if job.name in previous else 0
            if (current and current != n and current <= left and lo <= current <= his[job.name]
                    and curve.time(current) - curve.time(n) < keep_margin):
                n = current
            counts[job.name] = n
            left -= n
        # Spare GPUs: to the job they help most per GPU, a node's worth at a
        # time at most, so that a slower step across a node boundary does not
        # hide the faster one beyond it.

        def offer(name: str) -> tuple[float, int, str]:
            # A job that would otherwise run on unchanged must gain a restart's worth.
            unchanged = name in previous and previous[name].gpus == counts[name]
            return self._offer(curves[name], counts[name], his[name], left, per_node,
                               keep_margin if unchanged else 0.0) + (name,)

        heap = [offer(name) for name in counts]
        heapq.heapify(heap)
        while left > 0 and heap:
            neg_gain, k, name = heapq.heappop(heap)
            if neg_gain >= 0:
                continue  # no step up helps this job
            if k > left:  # offered when more GPUs were free: offer again
                heapq.heappush(heap, offer(name))
                continue
            counts[name] += k
            left -= k
            heapq.heappush(heap, offer(name))
        batches = {name: curves[name].batch(n) for name, n in counts.items()}
        return place_counts(counts, jobs, cluster, previous, batches)
