"""``sia``: Sia's scheduling policy (Jayaram Subramanya et al., SOSP '23), as a baseline.

Written from the paper and from reading its artifact's simulator
(siasosp23/artifacts, ``sia-simulator/sia.py``, ``cluster.py``,
``simulator_config.py``, run as its ``run_experiment.sh`` runs it:
``--project_throughputs --share_max_replicas``); no code copied. What it
keeps of Sia:

- **Configurations**: on a GPU type of ``g`` GPUs a node and ``n`` nodes a
  job may get 1, 2, 4, ... GPUs on one node (the powers of two below
  ``g``) or ``k`` whole nodes (``g``, ``2g``, ... ``ng``), at most 64.
- **Goodput matrix**: a job's goodput in every configuration of every
  type, at the best batch size there no larger than the job's own (the
  workload's; a configuration whose least batch exceeds it at that least
  one), as the artifact's speed-up functions stop at the workload's batch
  size (``job.py``, ``get_speedup_fn``: ``target_batch_size``) while the
  job runs at the best batch up to its application's largest; from its
  model on that type (fitted to its own reports on that type). A type it has not run on is
  bootstrapped from a type it has (the first in the cluster's order), its
  goodput scaled by the ratio of the application's one-GPU throughputs on
  the two types (``JobView.type_rates``, a short profile). A job that has
  reported nothing yet may have one GPU of any type, all of equal worth (the
  artifact's default: Sia does not know a job's throughput before it
  first runs). Each row is normalised so that its least goodput is 1.
- **How wide**: at most twice the most GPUs the job has reported on, on
  any type (``share_max_replicas``), and its own maximum.
- **Restart factor** (Pollux's): for a job that holds GPUs, every
  configuration but its current one is scaled by
  ``max(age - restarts x R, 0) / (age + R)`` (1 while the job is younger
  than R), R the job's restart cost when its view says it
  (``JobView.restart_s``; the artifact's table per application in Sia's
  setting), else 30 s. A waiting job (never started, or preempted) is not
  scaled: the artifact scales only the rows of jobs with a previous
  configuration (``sia.py``, ``__solve_mip_rescaled``).
- **A job in the middle of a restart** (``JobView.restarting_s`` > 0)
  keeps its allocation, as the artifact's ``preserve_ckpt_allocs``.
- **Integer program**: with ``A = round(speedup ** p, 2)`` (clipped at
  3000), choose at most one configuration per job minimising
  ``sum(A x) + lambda_n (jobs - sum(x))`` (p < 0; maximised for p > 0),
  each type's GPUs within its total; p = -0.5, lambda_n = 1.1. Solved with
  HiGHS (scipy's ``milp``) to a relative gap of 1e-4, as the artifact asks
  of CBC; a large program (over ``EXACT_MAX_VARS`` pairs) as its linear
  relaxation, rounded. The artifact reads ``lambda_a`` = 0.01 (the penalty for a change
  of allocation) but its objective never uses it; the restart factor does
  that work. Kept here as a parameter, unused likewise.
- **Placement**: a job whose type and count are unchanged keeps its GPUs;
  the others, largest first, take whole free nodes or the tightest node
  that fits (:func:`dlsub.policies.placement.pack`).

What it leaves out: the artifact's rigid and pipeline-parallel jobs. On a cluster without GPU types
every node is one type and Sia is Pollux's objective with p = -0.5 solved
as an integer program.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from dlsub.policies.api import (
    Allocation,
    Allocations,
    ClusterView,
    Decision,
    Jobs,
    JobView,
    PerformanceModel,
    PolicyError,
)
from dlsub.policies.perf_models.speedup import ModelMemo, fixed_batch, goodput_at, per_model, searches_batch
from dlsub.policies.placement import pack, packed_placement
from dlsub.policies.pollux import profiled_replicas, restart_factor

MAX_CONFIG_GPUS = 64
CLIP = 3000.0  # the largest A (speed-up ** p) the artifact lets into its program
TIME_LIMIT_S = 60.0  # HiGHS's limit on one decision (the paper's 64 GPUs take well under a second)
# Above this many (job, configuration) pairs the program is solved as its linear relaxation and rounded:
# 1,000 jobs on 2,000 GPUs (22,655 pairs) took HiGHS 10 s exact, 1 s relaxed, 4 pairs fractional, the
# rounded objective 0.003% from the optimum. The paper's 64 GPUs stay far below it (exact).
EXACT_MAX_VARS = 5000


@dataclass(frozen=True)
class TypeShape:
    """One GPU type of the cluster: its GPUs a node, nodes, and every node's name."""

    name: str
    per_node: int
    nodes: tuple[str, ...]

    @property
    def total(self) -> int:
        return self.per_node * len(self.nodes)

    @cached_property
    def configs(self) -> list[int]:
        """GPU counts a job may get here: powers of two below a node, then whole nodes (at most 64)."""
        counts = []
        c = 1
        while c < self.per_node:
            counts.append(c)
            c *= 2
        counts.extend(self.per_node * k for k in range(1, len(self.nodes) + 1))
        return [c for c in counts if c <= min(MAX_CONFIG_GPUS, self.total)]


def type_shapes(cluster: ClusterView) -> list[TypeShape]:
    """The cluster's GPU types in order (an untyped cluster is one type, "")."""
    by_type: dict[str, list[str]] = {}
    per_node: dict[str, int] = {}
    for node in cluster.nodes:
        if node.gpus <= 0:
            continue
        by_type.setdefault(node.gpu_type, []).append(node.name)
        per_node[node.gpu_type] = max(per_node.get(node.gpu_type, 0), node.gpus)
    return [TypeShape(t, per_node[t], tuple(names)) for t, names in by_type.items()]


@dataclass(frozen=True)
class TypedProgram:
    """The integer program both typed policies solve (``sia`` and ``goodput`` across types): a column per
    (job, type, GPUs) worth choosing, and what jobs in the middle of a restart keep."""

    fixed: dict[int, tuple[int, int]]  # job index -> (type index, GPUs) it keeps mid-restart
    free: list[int]  # GPUs of each type the program may give
    var_job: list[int]
    var_type: list[int]
    var_gpus: list[int]
    cost: list[float]


#: A job's candidate configurations with their costs (milp minimises), given its previous (type, GPUs) key:
#: (type index, GPUs, cost), in (type, GPUs) order.
Candidates = Callable[[JobView, "tuple[int, int] | None"], Iterable[tuple[int, int, float]]]


def typed_program(jobs: Jobs, shapes: Sequence[TypeShape], previous_keys: Sequence[tuple[int, int] | None],
                  candidates: Candidates) -> TypedProgram:
    """The program's columns: a job mid-restart keeps its GPUs (off the free ones); each other job's
    candidates, minus those never worth choosing (leaving the job out costs less, or fewer GPUs of the same
    type cost no more: an optimum needs neither, and dropping them keeps the program small)."""
    program = TypedProgram({}, [], [], [], [], [])
    held = [0] * len(shapes)
    for j, job in enumerate(jobs):
        prev_key = previous_keys[j]
        if prev_key is not None and job.restarting_s > 0:
            program.fixed[j] = prev_key
            held[prev_key[0]] += prev_key[1]
            continue
        best_below: dict[int, float] = {}  # per type, the least cost of fewer GPUs there
        for i, count, c in candidates(job, prev_key):
            if c >= min(0.0, best_below.get(i, 0.0)):
                continue
            best_below[i] = c
            program.var_job.append(j)
            program.var_type.append(i)
            program.var_gpus.append(count)
            program.cost.append(c)
    program.free.extend(shape.total - h for shape, h in zip(shapes, held, strict=True))
    return program


#: Per decision: config_rates's rows, by model and (type, GPUs a node, lo, hi, batch).
RateMemo = ModelMemo[list[tuple[int, float]]]


def config_rates(model: PerformanceModel, shape: TypeShape, per_node: int, lo: int, hi: int, batch: int | None,
                 memo: RateMemo | None = None, cap: int | None = None) -> list[tuple[int, float]]:
    """(GPUs, goodput) on each of the type's configurations from ``lo`` to ``hi`` GPUs, packed on nodes of
    ``per_node`` GPUs, at the best batch (``batch`` None) or at ``batch``; memoised for one decision in
    ``memo`` (:func:`~dlsub.policies.perf_models.speedup.per_model`).

    ``cap`` (with ``batch`` None): the best batch is sought no larger than ``cap`` (where one replica's
    least batch on the configuration exceeds it, at that least batch), as the artifact values a job
    (``job.py``, ``get_speedup_fn``: its speed-up function's largest batch is the workload's batch size,
    ``target_batch_size``) while the job itself runs at the best batch up to its application's largest.
    A model that cannot search below its own largest batch (no ``batch_capped``) is judged uncapped."""
    def rate(count: int) -> float:
        placement = packed_placement(count, per_node)
        capped = getattr(model, "batch_capped", None)
        if batch is None and cap is not None and capped is not None:
            return float(capped(cap, count).best_batch(placement)[1])
        return goodput_at(model, placement, batch)

    return per_model(memo, model, (shape.name, per_node, lo, hi, batch, cap), lambda: [
        (count, rate(count)) for count in shape.configs if lo <= count <= hi])


class SiaPolicy:
    name: ClassVar[str] = "sia"
    elastic: ClassVar[bool] = True
    adapts_batch: ClassVar[bool] = True
    learns_online: ClassVar[bool] = True
    # Sia's jobs fit their throughput as Pollux's do, on the compute part of each step.
    times_compute: ClassVar[bool] = True
    # It is told each job's model per GPU type (dlsub.sim.information).
    type_aware: ClassVar[bool] = True

    def __init__(self, p: float = -0.5, lambda_n: float = 1.1, lambda_a: float = 0.01,
                 restart_penalty_s: float = 30.0, trust_factor: int = 2, value_at_own_batch: bool = True) -> None:
        if p == 0:
            raise PolicyError("sia: p must not be 0")
        self.p = p
        self.lambda_n = lambda_n
        self.lambda_a = lambda_a  # read, never used: see the module's doc
        self.restart_penalty_s = restart_penalty_s
        self.trust_factor = trust_factor
        # Judge each configuration at batches up to the job's own (the artifact's speed-up functions); False:
        # up to its application's largest, at which it runs.
        self.value_at_own_batch = value_at_own_batch

    # -- the goodput matrix ------------------------------------------------

    def models(self, job: JobView, shapes: Sequence[TypeShape]) -> dict[str, PerformanceModel]:
        """The job's models on the types it has them for (untyped: its one model, if it has reported)."""
        if len(shapes) == 1 and shapes[0].name == "":
            return {"": job.model} if job.model is not None and profiled_replicas(job) != 0 else {}
        found = job.type_models or {}
        return {s.name: found[s.name] for s in shapes if s.name in found}

    def widest(self, job: JobView, models: Mapping[str, PerformanceModel]) -> int:
        """The most GPUs it may get: twice the most it reported on any type, within its own maximum."""
        seen = [getattr(getattr(m, "fitted", None), "max_replicas", None) for m in models.values()]
        if not models or any(not isinstance(s, int) for s in seen):
            return job.hi if models else max(job.lo, 1)  # the oracle knows every size
        return min(job.hi, max(self.trust_factor * max(s for s in seen if isinstance(s, int)), 1))

    def goodputs(self, job: JobView, shapes: Sequence[TypeShape],
                 memo: RateMemo | None = None) -> list[tuple[int, int, float]]:
        """(type index, GPUs, speed-up) for every configuration the job may get, least speed-up 1, in (type,
        GPUs) order; ``memo`` (see :func:`config_rates`) shares the work between jobs of one decision."""
        models = self.models(job, shapes)
        lo, hi = max(job.lo, 1), self.widest(job, models)
        rows: list[tuple[int, int, float]] = []
        if not models:
            return [(i, lo, 1.0) for i, shape in enumerate(shapes) if lo in shape.configs]
        source = next(s for s in shapes if s.name in models)
        rates = job.type_rates or {}
        batch = fixed_batch(job)
        for i, shape in enumerate(shapes):
            model = models.get(shape.name)
            scale = 1.0
            per_node = shape.per_node
            if model is None:  # bootstrapped from the source type's model and the one-GPU profiles
                here, there = rates.get(shape.name, 0.0), rates.get(source.name, 0.0)
                if here <= 0 or there <= 0:
                    continue
                model, scale, per_node = models[source.name], here / there, source.per_node
            for count, rate in config_rates(model, shape, per_node, lo, hi, batch, memo,
                                            cap=job.batch_size if self.value_at_own_batch else None):
                value = rate * scale
                if value > 0:
                    rows.append((i, count, value))
        least = min((v for _, _, v in rows), default=1.0)
        return [(i, c, v / least) for i, c, v in rows]

    # -- the decision ------------------------------------------------------

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        if not jobs:
            return {}
        shapes = type_shapes(cluster)
        type_index = {name: i for i, shape in enumerate(shapes) for name in shape.nodes}
        sign = 1.0 if self.p < 0 else -1.0  # milp minimises
        memo: RateMemo = {}

        def previous_key(job: JobView) -> tuple[int, int] | None:
            prev = previous.get(job.name)
            if prev is not None and prev.gpus and all(n in type_index for n in prev.nodes):
                types = {type_index[n] for n in prev.nodes}
                return (types.pop(), prev.gpus) if len(types) == 1 else None
            return None

        def candidates(job: JobView, prev_key: tuple[int, int] | None) -> Iterable[tuple[int, int, float]]:
            penalty = self.restart_penalty_s if job.restart_s is None else job.restart_s
            factor = 1.0
            # Only a job that holds GPUs now pays for moving: one waiting (never started, or preempted) starts
            # at no discount, as the artifact scales only the rows of jobs with a previous configuration.
            if prev_key is not None and now - job.arrival_s >= penalty:
                factor = restart_factor(job, now, penalty)
            for i, count, speedup in self.goodputs(job, shapes, memo):  # in (type, GPUs) order already
                if (i, count) != prev_key:
                    speedup *= factor
                a = CLIP if speedup <= 0 else min(round(speedup ** self.p, 2), CLIP)
                yield i, count, sign * (a - self.lambda_n)

        program = typed_program(jobs, shapes, [previous_key(job) for job in jobs], candidates)
        chosen = self.solve(len(jobs), program.free, program.var_job, program.var_type, program.var_gpus,
                            program.cost)
        return self.place(jobs, shapes, {**program.fixed, **chosen}, previous)

    @staticmethod
    def solve(num_jobs: int, free: Sequence[int], var_job: list[int], var_type: list[int],
               var_gpus: list[int], cost: list[float], rel_gap: float = 1e-4) -> dict[int, tuple[int, int]]:
        """Job index -> (type index, GPUs): at most one configuration a job, each type within its free GPUs,
        to a relative gap of ``rel_gap``."""
        n = len(cost)
        if n == 0:
            return {}
        cols = np.arange(n)
        one_each = coo_matrix((np.ones(n), (np.array(var_job), cols)), shape=(num_jobs, n))
        per_type = coo_matrix((np.array(var_gpus, dtype=float), (np.array(var_type), cols)),
                              shape=(len(free), n))
        constraints = [LinearConstraint(one_each.tocsr(), -np.inf, 1.0),
                       LinearConstraint(per_type.tocsr(), -np.inf, np.array(free, dtype=float))]
        exact = n <= EXACT_MAX_VARS
        result = milp(np.array(cost), constraints=constraints, integrality=np.full(n, 1 if exact else 0),
                      bounds=Bounds(0, 1), options={"mip_rel_gap": rel_gap, "time_limit": TIME_LIMIT_S})
        if result.x is None:
            raise PolicyError(f"sia: the integer program found no solution in {TIME_LIMIT_S:g} s ({result.message})")
        picked = np.flatnonzero(result.x > 1 - 1e-6)
        chosen = {var_job[k]: (var_type[k], var_gpus[k]) for k in picked}
        if not exact:
            # The relaxation leaves at most a few jobs (about one per type) split between configurations:
            # each takes, cheapest first, its cheapest configuration that still fits.
            left = list(free)
            for i, count in chosen.values():
                left[i] -= count
            split = sorted({var_job[k] for k in np.flatnonzero((result.x > 1e-6) & (result.x <= 1 - 1e-6))}
                           - set(chosen))
            for k in sorted((k for k in range(n) if var_job[k] in split), key=lambda k: cost[k]):
                if var_job[k] not in chosen and var_gpus[k] <= left[var_type[k]]:
                    chosen[var_job[k]] = (var_type[k], var_gpus[k])
                    left[var_type[k]] -= var_gpus[k]
        return chosen

    def place(self, jobs: Jobs, shapes: Sequence[TypeShape], chosen: Mapping[int, tuple[int, int]],
               previous: Allocations) -> Decision:
        decision: Decision = {}
        free: list[Counter[str]] = []
        for shape in shapes:
            free.append(Counter({name: shape.per_node for name in shape.nodes}))
        node_type = {name: i for i, shape in enumerate(shapes) for name in shape.nodes}
        pending: list[tuple[int, int, int]] = []
        # Jobs keeping their type and count keep their GPUs.
        for j, (i, count) in chosen.items():
            job = jobs[j]
            prev = previous.get(job.name)
            if (prev is not None and prev.gpus == count and all(node_type.get(n) == i for n in prev.nodes)
                    and all(free[i][n] >= k for n, k in Counter(prev.nodes).items())):
                for n in prev.nodes:
                    free[i][n] -= 1
                decision[job.name] = prev
            else:
                pending.append((j, i, count))
        pending.sort(key=lambda item: (-item[2], jobs[item[0]].arrival_s, jobs[item[0]].name))
        capacities = [{name: shape.per_node for name in shape.nodes} for shape in shapes]
        for j, i, count in pending:
            job = jobs[j]
            nodes = pack(free[i], count, capacity=capacities[i])
            if nodes is None:  # cannot happen: the program kept each type within its GPUs
                continue
            decision[job.name] = Allocation(nodes, self._batch(job, shapes[i], nodes))
        return decision

    def _batch(self, job: JobView, shape: TypeShape, nodes: tuple[str, ...]) -> int | None:
        """The best batch size on these GPUs, from its model on that type (or the model it was bootstrapped
        from); None when it has none (the job keeps its own choice)."""
        if not searches_batch(job, adapt_batch=True):
            return job.batch_size
        models = self.models(job, [shape]) if shape.name == "" else dict(job.type_models or {})
        model = models.get(shape.name) or next(iter(models.values()), None)
        if model is None:
            return None
        return model.best_batch(tuple(Counter(nodes).values()))[0]

