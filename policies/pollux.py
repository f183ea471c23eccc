"""``pollux``: Pollux's scheduling policy (Qiao et al., OSDI '21), as a baseline.

Written from the paper and from reading its artifact's simulator
(petuum/adaptdl, branch osdi21-artifact, ``simulator/pollux.py`` and
``simulator.py``); no code copied. What it keeps of Pollux:

- **Objective**: the power mean with exponent -1 (the harmonic mean) of
  the jobs' speed-ups, maximised. A job's speed-up is its goodput on its
  GPUs (at the best batch size there) over its goodput on a fair share
  (``ceil(GPUs / jobs)`` GPUs on one node), times nodes / GPUs; 0.001 is
  added so that a job with no GPUs counts (1,000 in the sum of inverses):
  every job that can run gets a GPU before any job widens, and no job is
  guaranteed one (``min_replicas=0``: a job left out is preempted).
- **Restart penalty**: a job whose allocation would change has its
  speed-up scaled by ``max(age - 30 s x restarts, 0) / (age + 30 s)``.
- **Trust cap**: a job gets at most twice the most GPUs it has reported
  on (one before its first report), and its own maximum.
- **Before its first report** a job's speed-up is linear (``n / fair``).
- **Batch re-tuning**: each interval a job's batch size is the one with
  the best goodput on the placement it gets.

What it changes: Pollux searches per-node placements with a genetic
algorithm (NSGA-II, 100 states for 100 generations, random mutation and
crossover, warm-started from the last interval's population). Here the
same objective, a sum over jobs of the inverse speed-ups, is minimised
exactly over GPU counts by dynamic programming (a multiple-choice
knapsack), each count evaluated on a packed placement (whole nodes
first). Then the counts are placed as Pollux's search scores placements
(:func:`place_pollux`): on the nodes a job really gets, at most one job
spanning several nodes per node, a job whose count is unchanged keeping
its GPUs. Placing the packed counts without that check spread more than
half the jobs' allocations over more nodes than packed (workload-3 at
1.0x), where they ran slower than the search had counted on.
Deterministic: no seed. Jobs are taken in Pollux's order (least attained
service, then oldest), which breaks ties. A job that needs at least
``min_gpus`` to run gets that many or none. The live agent's job views
carry no restart count (0), so there only the age term of the restart
penalty applies.

In the simulator pollux's jobs report the compute part of every step
(``times_compute``), as Pollux's simulated jobs do (its traces' sync time).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import ClassVar

import numpy as np

from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, Jobs, JobView
from dlsub.policies.perf_models.fitted_model import search_batches
from dlsub.policies.perf_models.speedup import ModelMemo, fixed_batch, goodput_at, per_model, searches_batch
from dlsub.policies.placement import free_gpus, packed_placement

# Added to every scaled speed-up, so that a job without GPUs has a finite cost.
EPSILON = 1e-3


def profiled_replicas(job: JobView) -> int | None:
    """The most GPUs the job's own model has reports from; None when the
    model does not say (the oracle's, which knows every size)."""
    fitted = getattr(job.model, "fitted", None)
    seen = getattr(fitted, "max_replicas", None)
    return seen if isinstance(seen, int) else None


def restart_factor(job: JobView, now: float, penalty_s: float) -> float:
    """What a change of allocation leaves of a job's speed-up: the share of
    its age not lost to restarts, this one included."""
    age = max(now - job.arrival_s, 0.0)
    return max(age - job.restarts * penalty_s, 0.0) / (age + penalty_s)


def minimise(costs: list[np.ndarray], capacity: int) -> list[int]:
    """The GPU count per job (``costs[j][n]``: job j's cost on n GPUs) with
    the least total cost using at most ``capacity`` GPUs. Exact; ties go to
    fewer GPUs.

    One pass a job over its GPU counts n, each a shifted slice of the
    table (dp[c - n] + cost[n] for every c >= n at once), taking a count
    only where it is strictly cheaper than every fewer one: the table a
    (capacity x counts) matrix and its first minimum per row would give,
    without building the matrix (8 ms a job at 10,000 GPUs; this, 1 ms)."""
    dp = np.full(capacity + 1, math.inf)
    dp[0] = 0.0  # dp[c]: the least cost of the jobs so far on exactly c GPUs
    choices = []
    for cost in costs:
        total = dp + cost[0]  # the least cost on c GPUs with this job's count so far: 0
        best = np.zeros(capacity + 1, dtype=np.intp)
        for n in range(1, min(len(cost) - 1, capacity) + 1):
            candidate = dp[: capacity + 1 - n] + cost[n]
            cheaper = candidate < total[n:]
            np.copyto(total[n:], candidate, where=cheaper)
            best[n:][cheaper] = n
        dp = total
        choices.append(best)
    left = int(np.argmin(dp))
    result = []
    for best in reversed(choices):
        n = int(best[left])
        result.append(n)
        left -= n
    return result[::-1]


#: Per decision: speedups's rows, by model and (the job's own batch or None, GPUs up to, fair share, GPUs a node).
SpeedupMemo = ModelMemo[np.ndarray]


class PolluxPolicy:
    name: ClassVar[str] = "pollux"
    elastic: ClassVar[bool] = True
    adapts_batch: ClassVar[bool] = True
    # Pollux's jobs fit their own throughput from what they report.
    learns_online: ClassVar[bool] = True
    # In Pollux's simulator every report splits the step into compute and
    # synchronisation (see dlsub.sim.information.information_for).
    times_compute: ClassVar[bool] = True

    def __init__(self, restart_penalty_s: float = 30.0, trust_factor: int = 2) -> None:
        self.restart_penalty_s = restart_penalty_s
        self.trust_factor = trust_factor

    def cap(self, job: JobView) -> int:
        """The most GPUs the job may get: its maximum, within the trust cap."""
        seen = profiled_replicas(job)
        return job.hi if seen is None else min(job.hi, max(self.trust_factor * seen, 1))

    @staticmethod
    def _rate(job: JobView, placement: tuple[int, ...]) -> float:
        model = job.model
        assert model is not None
        return goodput_at(model, placement, fixed_batch(job))

    def speedups(self, job: JobView, hi: int, fair: int, per_node: int,
                 memo: SpeedupMemo | None = None) -> np.ndarray:
        """Speed-up over the fair share on 0..hi GPUs (packed). Memoised for one decision in ``memo``: it
        depends on the job only through its model and batch size, and thousands of jobs share a few hundred
        models (one per application and epoch in the simulator); the model is kept beside its row so that
        its id is not reused while the memo lives. Read-only: callers scale a copy."""
        return per_model(memo, job.model, (fixed_batch(job), hi, fair, per_node), lambda: np.array(
            [0.0] + [self.speedup(job, packed_placement(n, per_node), fair) for n in range(1, hi + 1)]))

    def speedup(self, job: JobView, placement: tuple[int, ...], fair: int) -> float:
        """Speed-up over the fair share (``fair`` GPUs on one node) on ``placement``."""
        count = sum(placement)
        if job.model is None or profiled_replicas(job) == 0:
            return count / fair  # nothing measured yet: linear, as Pollux assumes
        base = self._rate(job, (fair,))
        if base <= 0:
            return count / fair
        return self._rate(job, placement) / base if count else 0.0

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        if not jobs:
            return {}
        total = cluster.total_gpus
        per_node = max((node.gpus for node in cluster.nodes), default=1)
        fair = math.ceil(total / len(jobs))
        scale = len(cluster.nodes) / total  # a node's worth of fair share is speed-up 1
        order = sorted(jobs, key=lambda job: (job.attained_gpu_s, job.arrival_s, job.name))
        # A job that needs at least lo GPUs to run gets none or lo..cap (the live agent's multi-node jobs).
        los = {job.name: max(job.lo, 1) for job in order}
        caps = {job.name: min(max(self.cap(job), los[job.name]), total) for job in order}
        widest = max(caps.values())
        search_batches([job.model for job in jobs if searches_batch(job, adapt_batch=True)],
                       [packed_placement(n, per_node) for n in range(1, widest + 1)] + [(fair,)])
        costs = []
        memo: SpeedupMemo = {}
        for job in order:
            scaled = scale * self.speedups(job, caps[job.name], fair, per_node, memo)
            current = previous[job.name].gpus if job.name in previous else 0
            kept = np.arange(len(scaled)) == current
            scaled = scaled * np.where(kept, 1.0, restart_factor(job, now, self.restart_penalty_s))
            cost = 1.0 / (scaled + EPSILON)
            cost[1:los[job.name]] = math.inf
            costs.append(cost)
        counts = {job.name: n for job, n in zip(order, minimise(costs, total), strict=True) if n > 0}
        by_name = {job.name: job for job in jobs}

        def cost_at(name: str, nodes: tuple[str, ...]) -> float:
            """Pollux's cost of the job on these GPUs: its speed-up where they are."""
            job = by_name[name]
            if len(nodes) < los[name]:
                return math.inf if nodes else 1.0 / EPSILON
            scaled = scale * self.speedup(job, tuple(Counter(nodes).values()), fair)
            alloc = previous.get(name)
            if alloc is None or Counter(alloc.nodes) != Counter(nodes):
                scaled *= restart_factor(job, now, self.restart_penalty_s)
            return 1.0 / (scaled + EPSILON)

        decision = place_pollux(counts, by_name, cluster, previous, cost_at, caps)
        # Each interval a job re-tunes its batch size for the placement it got.
        for name, alloc in decision.items():
            job = by_name[name]
            if job.model is not None and searches_batch(job, adapt_batch=True):
                decision[name] = Allocation(alloc.nodes, job.model.best_batch(alloc.placement)[0])
        return decision


def place_pollux(counts: Mapping[str, int], jobs: Mapping[str, JobView], cluster: ClusterView,
                 previous: Allocations, cost_at: Callable[[str, tuple[str, ...]], float],
                 caps: Mapping[str, int]) -> Decision:
    """GPUs for the counts, judged as Pollux judges placements.

    The counts were chosen on packed placements; where they are, they
    stay. Pollux's search scores each job on the nodes it really gets, and
    lets at most one job spanning several nodes onto a node. So a job whose
    count changed (largest first) is offered two placements, and gets the
    one its cost prefers: the most of its count that one node holds (the
    tightest fit), or its count over the nodes that host no other
    multi-node job (empty nodes first, then the most free). A job may thus
    get fewer GPUs than its count, and leave some idle, where spreading it
    would cost it more than it gains. GPUs left idle then go, a node at a
    time, to whichever job (within its cap, on one node) lowers its cost the
    most, as Pollux's search would add them, until none gains.
    """
    decision: Decision = {}
    for name, count in counts.items():
        alloc = previous.get(name)
        if alloc is not None and alloc.gpus == count:
            decision[name] = alloc
    spanned = {node for alloc in decision.values() if len(set(alloc.nodes)) > 1 for node in alloc.nodes}
    free = free_gpus(cluster, decision)
    capacity = cluster.capacity()
    pending = sorted((name for name in counts if name not in decision),
                     key=lambda name: (-counts[name], jobs[name].arrival_s, name))
    for name in pending:
        count = counts[name]
        most = min(count, max(free.values(), default=0))
        options: list[tuple[str, ...]] = []
        if most > 0:
            node = min((node for node in free if free[node] >= most), key=free.__getitem__)
            options.append((node,) * most)
        if count > most:
            allowed = sorted((node for node in free if free[node] > 0 and node not in spanned),
                             key=lambda node: (free[node] < capacity[node], -free[node]))
            nodes: list[str] = []
            for node in allowed:
                nodes.extend([node] * min(free[node], count - len(nodes)))
            if len(set(nodes)) > 1 and len(nodes) > most:
                options.append(tuple(nodes))
        if not options:
            continue
        chosen = min(options, key=lambda nodes: cost_at(name, nodes))
        if math.isinf(cost_at(name, chosen)):
            continue
        decision[name] = Allocation(chosen, jobs[name].batch_size)
        for node in chosen:
            free[node] -= 1
        if len(set(chosen)) > 1:
            spanned.update(chosen)
    while True:
        best: tuple[float, str, tuple[str, ...]] | None = None
        for node in (node for node in free if free[node] > 0):
            for name in jobs:
                held = decision[name].nodes if name in decision else ()
                if set(held) - {node}:
                    continue  # grows only on the one node it is on
                before = cost_at(name, held)
                for extra in range(1, min(free[node], caps[name] - len(held)) + 1):
                    grown = held + (node,) * extra
                    gain = before - cost_at(name, grown)
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, name, grown)
        if best is None:
            return decision
        _, name, grown = best
        held = decision[name].nodes if name in decision else ()
        free[grown[-1]] -= len(grown) - len(held)
        decision[name] = Allocation(grown, jobs[name].batch_size)
