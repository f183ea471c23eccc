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
first); above 10^8 cells of its table (far beyond the simulated 64-GPU
clusters) through its Lagrangian relaxation instead, a price a GPU
(:func:`minimise_relaxed`: at 5,000 jobs on 10,000 GPUs the same total
cost to six figures, in 26 ms where the table took 3.7 s). Then the
counts are placed as Pollux's search scores placements
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

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


#: Above this many (jobs x GPUs x widest job) cells the exact knapsack (:func:`minimise`, about 1.4e9 cells a
#: second here: 2.3 s at 5,000 jobs on 10,000 GPUs) gives way to its Lagrangian relaxation
#: (:func:`minimise_relaxed`). Every simulated cluster of the benchmarks (64 GPUs, 160 jobs: 6.6e5) stays exact.
EXACT_CELLS = 10**8


def choose_counts(costs: list[np.ndarray], capacity: int) -> list[int]:
    """:func:`minimise` where it is cheap, else :func:`minimise_relaxed`."""
    widest = max((len(cost) for cost in costs), default=1)
    if len(costs) * (capacity + 1) * widest <= EXACT_CELLS:
        return minimise(costs, capacity)
    return minimise_relaxed(costs, capacity)


def minimise_relaxed(costs: list[np.ndarray], capacity: int) -> list[int]:
    """What :func:`minimise` finds, through a price a GPU instead of the table: each job takes the count
    that minimises its cost plus the price times its GPUs, at the least price that fits the capacity
    (bisection; ties to fewer GPUs); jobs the price leaves indifferent between two counts (in the order
    given) take the larger where it still fits; GPUs left then go, a grant at a time, where they lower the
    total most a GPU (exact where every job's cost falls ever more slowly with its GPUs). Its total is the
    relaxation's optimum but for the jobs at the price, so within one job's change of the exact one
    (``benchmarks/policy_speed.py`` prints the gap: 5,000 jobs on 10,000 GPUs); a few ms a price over all
    jobs at once, where the table is linear in the capacity."""
    if not costs:
        return []
    table = np.full((len(costs), max(len(cost) for cost in costs)), math.inf)
    for j, cost in enumerate(costs):
        table[j, : len(cost)] = cost
    gpus = np.arange(table.shape[1], dtype=float)

    def counts_at(price: float) -> np.ndarray:
        found: np.ndarray = np.argmin(table + price * gpus, axis=1)  # the first minimum: ties to fewer GPUs
        return found

    counts = counts_at(0.0)
    if counts.sum() <= capacity:
        return [int(n) for n in counts]  # every job at its own best: the exact optimum
    if not np.isfinite(table[:, 0]).all():
        return minimise(costs, capacity)  # a job that cannot go without GPUs: no price need fit
    low, high = 0.0, 1.0
    while counts_at(high).sum() > capacity:  # ends: at a high enough price every job takes none
        low, high = high, high * 2
    for _ in range(64):  # to a price within 1e-12 of the least that fits, or float's own resolution
        middle = (low + high) / 2
        if not low < middle < high or high - low <= 1e-12 * high:
            break
        if counts_at(middle).sum() <= capacity:
            high = middle
        else:
            low = middle
    counts, wider = counts_at(high), counts_at(low)
    left = capacity - int(counts.sum())
    for j in (int(i) for i in np.flatnonzero(wider > counts)):
        extra = int(wider[j] - counts[j])
        if extra <= left:
            counts[j] = wider[j]
            left -= extra
    rows = np.arange(len(costs))
    while left > 0:
        now = table[rows, counts]
        more = gpus - counts[:, None]
        within = (more > 0) & (more <= left)
        # The most saved a GPU (where costs fall ever more slowly, one GPU at a time, the exact order).
        saving = np.where(within, (now[:, None] - table) / np.maximum(more, 1), -math.inf)
        j, n = (int(i) for i in np.unravel_index(int(np.argmax(saving)), saving.shape))
        if not saving[j, n] > 0:
            break
        left -= n - int(counts[j])
        counts[j] = n
    return [int(n) for n in counts]


#: Per decision: speedups's rows, by model and (the job's own batch or None, GPUs up to, fair share, GPUs a node).
SpeedupMemo = ModelMemo[np.ndarray]


@dataclass(frozen=True)
class CountProblem:
    """One decision's choice of GPU counts: ``costs[j][n]`` is job ``order[j]``'s cost on n GPUs (packed),
    at most ``capacity`` in all; what the placement then needs of it beside."""

    order: list[JobView]
    costs: list[np.ndarray]
    capacity: int
    los: dict[str, int]
    caps: dict[str, int]
    fair: int
    scale: float


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
        def row() -> np.ndarray:
            base = self._base(job, fair)  # once a row, not once a count: half the model's evaluations
            return np.array([0.0] + [self._over(job, packed_placement(n, per_node), fair, base)
                                     for n in range(1, hi + 1)])

        return per_model(memo, job.model, (fixed_batch(job), hi, fair, per_node), row)

    def speedup(self, job: JobView, placement: tuple[int, ...], fair: int,
                bases: ModelMemo[float | None] | None = None) -> float:
        """Speed-up over the fair share (``fair`` GPUs on one node) on ``placement``; ``bases`` keeps each
        model's goodput on the fair share for one decision."""
        base = per_model(bases, job.model, (fixed_batch(job), fair), lambda: self._base(job, fair))
        return self._over(job, placement, fair, base)

    def _base(self, job: JobView, fair: int) -> float | None:
        """The job's goodput on its fair share; None when nothing is measured yet (linear speed-ups, as
        Pollux assumes) or it has none."""
        if job.model is None or profiled_replicas(job) == 0:
            return None
        base = self._rate(job, (fair,))
        return base if base > 0 else None

    def _over(self, job: JobView, placement: tuple[int, ...], fair: int, base: float | None) -> float:
        """Speed-up on ``placement`` over ``base``, the fair share's goodput (linear where None)."""
        count = sum(placement)
        if base is None:
            return count / fair
        return self._rate(job, placement) / base if count else 0.0

    def count_problem(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> CountProblem:
        """The knapsack over GPU counts a decision solves (``jobs`` not empty)."""
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
        return CountProblem(order, costs, total, los, caps, fair, scale)

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        if not jobs:
            return {}
        problem = self.count_problem(jobs, cluster, now, previous)
        los, caps, fair, scale = problem.los, problem.caps, problem.fair, problem.scale
        counts = {job.name: n for job, n in zip(problem.order, choose_counts(problem.costs, problem.capacity),
                                                strict=True) if n > 0}
        by_name = {job.name: job for job in jobs}
        bases: ModelMemo[float | None] = {}  # each model's goodput on the fair share, once

        def cost_at(name: str, nodes: tuple[str, ...]) -> float:
            """Pollux's cost of the job on these GPUs: its speed-up where they are."""
            job = by_name[name]
            if len(nodes) < los[name]:
                return math.inf if nodes else 1.0 / EPSILON
            scaled = scale * self.speedup(job, tuple(Counter(nodes).values()), fair, bases)
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


class TightestFit:
    """Which node has the fewest free GPUs of those with at least n (the first in ``free``'s order among
    equals), and the most any node has, as the GPUs are taken: a heap of nodes for each count of free
    GPUs, so that each question costs the few counts a node has, not a pass over 2,500 nodes a job
    (0.8 s a decision at 10,000 GPUs). Free GPUs only fall while it is used, so a node found under a
    count it no longer has is dropped there for good."""

    def __init__(self, free: dict[str, int]) -> None:
        self.free = free
        self.position = {node: i for i, node in enumerate(free)}
        self.nodes = list(free)
        self.top = max(free.values(), default=0)
        self.heaps: list[list[int]] = [[] for _ in range(self.top + 1)]
        for i, node in enumerate(self.nodes):
            if free[node] > 0:
                self.heaps[free[node]].append(i)  # in order: already a heap

    def _first(self, count: int) -> int | None:
        heap = self.heaps[count]
        while heap and self.free[self.nodes[heap[0]]] != count:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def most(self) -> int:
        """The most free GPUs any node has (0 for none)."""
        while self.top > 0 and self._first(self.top) is None:
            self.top -= 1
        return self.top

    def node(self, count: int) -> str:
        """The node with the fewest free GPUs of at least ``count`` (which :meth:`most` allows)."""
        for have in range(count, self.top + 1):
            found = self._first(have)
            if found is not None:
                return self.nodes[found]
        raise ValueError(f"no node has {count} free GPUs")

    def changed(self, nodes: set[str]) -> None:
        """``free`` has fallen on ``nodes``."""
        for node in nodes:
            if self.free[node] > 0:
                heapq.heappush(self.heaps[self.free[node]], self.position[node])


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
    tightest = TightestFit(free)
    for name in pending:
        count = counts[name]
        most = min(count, tightest.most())
        options: list[tuple[str, ...]] = []
        if most > 0:
            node = tightest.node(most)
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
        tightest.changed(set(chosen))
        if len(set(chosen)) > 1:
            spanned.update(chosen)
    return fill_idle(decision, free, jobs, previous, cost_at, caps)


def fill_idle(decision: Decision, free: dict[str, int], jobs: Mapping[str, JobView], previous: Allocations,
              cost_at: Callable[[str, tuple[str, ...]], float], caps: Mapping[str, int]) -> Decision:
    """:func:`place_pollux`'s last step: the idle GPUs, one grant at a time, to the job (within its cap, on
    the one node it is on, or on any node when it has none) whose cost the grant lowers most, until none
    gains; among equal gains the first node, then job, then fewest GPUs (in ``free``'s and ``jobs``'s
    order). ``cost_at`` must judge nodes by how many GPUs the job gets on each and whether they are the
    ones it had: so a job without GPUs is asked once for each count on a node it did not have (the first
    with room stands for all of them) and once on the node it had, not once a node (5,000 jobs x 2,500
    nodes was 259 s a decision where nobody gained), and every answer is kept for the call."""
    order = {node: i for i, node in enumerate(free)}
    rank = {name: i for i, name in enumerate(jobs)}
    known: dict[tuple[object, ...], float] = {}

    def cost(key: tuple[object, ...], name: str, nodes: tuple[str, ...]) -> float:
        found = known.get(key)
        if found is None:
            found = known[key] = cost_at(name, nodes)
        return found

    while True:
        # The first two nodes with room for n more GPUs, for each n: a job's own old node aside, the first.
        room: list[list[str]] = [[] for _ in range(max(free.values(), default=0) + 1)]
        for node, left in free.items():
            for n in range(1, left + 1):
                if len(room[n]) < 2:
                    room[n].append(node)
        best: tuple[tuple[float, int, int, int], str, tuple[str, ...]] | None = None
        for name in jobs:
            held = decision[name].nodes if name in decision else ()
            options: list[tuple[str, int, tuple[object, ...]]] = []  # (node, GPUs more, key of its cost)
            if held:
                node = held[0]
                if any(other != node for other in held):
                    continue  # grows only on the one node it is on
                for extra in range(1, min(free[node], caps[name] - len(held)) + 1):
                    options.append((node, extra, (name, held + (node,) * extra)))
            else:
                had = previous[name].nodes if name in previous else ()
                own = had[0] if had and all(node == had[0] for node in had) else None
                for extra in range(1, min(len(room) - 1, caps[name]) + 1):
                    other = next((node for node in room[extra] if node != own), None)
                    if other is not None:
                        options.append((other, extra, (name, extra, "elsewhere")))
                    if own is not None and free.get(own, 0) >= extra:
                        options.append((own, extra, (name, (own,) * extra)))
            if not options:
                continue
            before = cost((name, held), name, held)
            for node, extra, key in options:
                gain = before - cost(key, name, held + (node,) * extra)
                score = (gain, -order[node], -rank[name], -extra)
                if gain > 0 and (best is None or score > best[0]):
                    best = (score, name, held + (node,) * extra)
        if best is None:
            return decision
        grant(decision, free, jobs, best[1], best[2])


def grant(decision: Decision, free: dict[str, int], jobs: Mapping[str, JobView], name: str,
          grown: tuple[str, ...]) -> None:
    """Give ``name`` the GPUs ``grown`` (its own, and more on their last node)."""
    held = decision[name].nodes if name in decision else ()
    free[grown[-1]] -= len(grown) - len(held)
    decision[name] = Allocation(grown, jobs[name].batch_size)
