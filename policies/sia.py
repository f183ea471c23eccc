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
- **Ties keep a job where it is** (``keep_ties``): every cost in the program is a
  multiple of 0.01 (``A`` rounded to two decimals, lambda_n 1.1), so two
  decisions are either tied or at least 0.01 apart; a job's current
  configuration costs :data:`TIE_BREAK` / (jobs + 1) less, which picks the
  decision that moves fewest jobs among exactly tied optima and never
  outweighs a real difference. Rounding erases a restart factor near 1 (an
  older job: 0.991 scales ``A`` by 1.0045), so without it the solver's
  arbitrary choice between tied optima moved running jobs for nothing. The
  artifact has no tie-break (what CBC returns on a tie is its own); it is
  Sia's objective either way, and the restart factor's intent (issue 54 item
  4: 15-25% of sia's restarts on Philly, homogeneous, were such flips).
- **Integer program**: with ``A = round(speedup ** p, 2)`` (clipped at
  3000), choose at most one configuration per job minimising
  ``sum(A x) + lambda_n (jobs - sum(x))`` (p < 0; maximised for p > 0),
  each type's GPUs within its total; p = -0.5, lambda_n = 1.1. Solved with
  HiGHS (scipy's ``milp``) to a relative gap of 1e-4, as the artifact asks
  of CBC; a large program (over ``EXACT_MAX_VARS`` pairs) as its linear
  relaxation, solved through its Lagrangian dual over one price a GPU type
  (:func:`relaxation_optimum`; HiGHS where that proves no optimum), and
  rounded. The artifact reads ``lambda_a`` = 0.01 (the penalty for a change
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
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
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
from dlsub.policies.placement import FreeIndex, packed_placement
from dlsub.policies.pollux import profiled_replicas, restart_factor

MAX_CONFIG_GPUS = 64
CLIP = 3000.0  # the largest A (speed-up ** p) the artifact lets into its program
TIME_LIMIT_S = 60.0  # HiGHS's limit on one decision (the paper's 64 GPUs take well under a second)
# Above this many (job, configuration) pairs the program is solved as its linear relaxation and rounded:
# 1,000 jobs on 2,000 GPUs (22,655 pairs) took HiGHS 10 s exact, 1 s relaxed, 4 pairs fractional, the
# rounded objective 0.003% from the optimum. The paper's 64 GPUs stay far below it (exact). At 5,000 jobs on
# 10,000 GPUs (114,000-139,000 pairs) HiGHS took 2-9 s for the relaxation, relaxation_optimum 0.1-0.3 s.
EXACT_MAX_VARS = 5000
# sia's costs lie on a grid of 0.01 (A rounded to two decimals, lambda_n 1.1): a job's current configuration costs
# this / (jobs + 1) less, so that the sum over every job stays below half a step (keep_ties).
TIE_BREAK = 0.005


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


def in_place_nodes(held: Sequence[str], count: int, free: Mapping[str, int], per_node: int) -> tuple[str, ...] | None:
    """``count`` GPUs of a job's type on a superset (grown: more GPUs of its node, or whole nodes beside its
    own) or a subset (shrunk) of the GPUs it ``held`` (one entry a GPU), in the type's configurations (below
    a node on one node, else whole nodes); ``free``: each node's free GPUs, the job's own counted free. None
    where it cannot be resized in place."""
    have = Counter(held)
    whole = count >= per_node
    if count == len(held) or count <= 0 or (whole and count % per_node):
        return None
    if count < len(held):  # shrink onto some of its GPUs
        if not whole:
            node = next((n for n in have if have[n] >= count and free.get(n, 0) >= count), None)
            return None if node is None else (node,) * count
        full = [n for n in have if have[n] == per_node and free.get(n, 0) >= per_node][:count // per_node]
        return tuple(n for n in full for _ in range(per_node)) if len(full) * per_node == count else None
    if not whole:  # grow on its one node
        node = next(iter(have))
        return (node,) * count if len(have) == 1 and free.get(node, 0) >= count else None
    if len(have) > count // per_node or any(free.get(n, 0) < per_node for n in have):
        return None
    extra = [n for n, k in free.items() if n not in have and k >= per_node][:count // per_node - len(have)]
    if len(extra) + len(have) < count // per_node:
        return None
    return tuple(n for n in (*have, *extra) for _ in range(per_node))


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
    add_job, add_type, add_gpus, add_cost = (program.var_job.append, program.var_type.append,
                                             program.var_gpus.append, program.cost.append)
    for j, job in enumerate(jobs):
        prev_key = previous_keys[j]
        if prev_key is not None and job.restarting_s > 0:
            program.fixed[j] = prev_key
            held[prev_key[0]] += prev_key[1]
            continue
        # Per type, the least cost of fewer GPUs there, or 0 (what it costs to leave the job out): every
        # cost kept is below 0.
        best_below: dict[int, float] = {}
        for i, count, c in candidates(job, prev_key):
            if c >= best_below.get(i, 0.0):
                continue
            best_below[i] = c
            add_job(j)
            add_type(i)
            add_gpus(count)
            add_cost(c)
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


#: How far the relaxation's value from the cutting planes may stand above the bound they prove (relative),
#: and how many planes they may take before HiGHS is asked instead.
RELAX_TOL = 1e-9
RELAX_MAX_CUTS = 300


def relaxation_optimum(free: Sequence[int], var_job: Sequence[int], var_type: Sequence[int],
                       var_gpus: Sequence[int], cost: Sequence[float]) -> np.ndarray | None:
    """An optimum of the typed program's linear relaxation (each column in [0, 1], at most 1 a job, each
    type within its free GPUs), or None where it found none it could prove (the caller asks HiGHS then).

    The program is a multiple-choice knapsack with one capacity a type, and its relaxation's value is that
    of its Lagrangian dual over a price ``lam[t] >= 0`` a GPU of each type (the "at most one a job" rows
    alone have integral vertices): ``min h(lam) = sum_j max(0, max_k(-cost_k - lam[t_k] gpus_k)) +
    lam . free``, convex and piecewise linear in a handful of prices, each value one pass over the
    columns. Kelley's cutting planes (a small LP in the prices a plane) reach its minimum to ``RELAX_TOL``;
    at those prices each job takes its best column, or none; the jobs tied between two or more (within
    ``delta``) share what GPUs the others leave in a small LP of their tied columns (HiGHS's simplex: a
    vertex, so at most about one job a type split). That primal is feasible and its cost within
    ``RELAX_TOL`` of ``-h``, a lower bound on the relaxation: an optimum. Where it is not (prices not quite
    at the kink, ties missed), ``delta`` grows a thousandfold, twice; then None."""
    n, types = len(cost), len(free)
    job = np.asarray(var_job)
    order = np.argsort(job, kind="stable")  # the columns of one job together
    job, typ = job[order], np.asarray(var_type)[order]
    gpus, value = np.asarray(var_gpus, dtype=float)[order], -np.asarray(cost, dtype=float)[order]
    cap = np.asarray(free, dtype=float)
    starts = np.flatnonzero(np.r_[True, job[1:] != job[:-1]])
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    ceiling = np.zeros(types)  # above it no column of the type is worth its GPUs: h only grows
    np.maximum.at(ceiling, typ, np.maximum(value / gpus, 0.0))

    def best_of(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        reduced = value - lam[typ] * gpus
        return reduced, np.maximum(np.maximum.reduceat(reduced, starts), 0.0)

    def plane(lam: np.ndarray) -> tuple[float, np.ndarray]:
        reduced, best = best_of(lam)
        taken = np.flatnonzero((reduced >= best[group]) & (best[group] > 0))
        taken = taken[np.r_[True, group[taken][1:] != group[taken][:-1]]] if len(taken) else taken
        used = np.bincount(typ[taken], weights=gpus[taken], minlength=types)
        return float(best.sum() + lam @ cap), cap - used  # h and a subgradient

    planes: list[np.ndarray] = []
    offsets: list[float] = []
    lam = np.zeros(types)
    upper, best_lam = np.inf, lam
    bounds = [(0.0, float(c)) for c in ceiling] + [(None, None)]
    objective = np.r_[np.zeros(types), 1.0]
    for _ in range(RELAX_MAX_CUTS):
        h, slope = plane(lam)
        if h < upper:
            upper, best_lam = h, lam
        planes.append(np.r_[slope, -1.0])  # z >= h + slope . (mu - lam)
        offsets.append(float(slope @ lam) - h)
        master = linprog(objective, A_ub=np.array(planes), b_ub=np.array(offsets), bounds=bounds, method="highs")
        if master.status != 0:
            return None
        lam = master.x[:types]
        if upper - master.fun <= RELAX_TOL * max(1.0, abs(upper)):
            break
    else:
        return None
    reduced, best = best_of(best_lam)
    scale = max(1.0, float(np.abs(value).max()))
    for delta in (1e-9 * scale, 1e-6 * scale, 1e-3 * scale):
        near = reduced >= best[group] - delta
        tied = np.bincount(group, weights=near, minlength=len(starts)) + (best <= delta) >= 2
        whole = near & ~tied[group] & (best[group] > delta)
        x = whole.astype(float)
        left = cap - np.bincount(typ[whole], weights=gpus[whole], minlength=types)
        if np.any(left < 0):
            continue
        sub = np.flatnonzero(near & tied[group])
        if len(sub):
            rows = np.unique(group[sub], return_inverse=True)[1]
            m, jobs = len(sub), int(rows.max()) + 1
            a = coo_matrix((np.r_[np.ones(m), gpus[sub]], (np.r_[rows, jobs + typ[sub]], np.r_[np.arange(m),
                            np.arange(m)])), shape=(jobs + types, m)).tocsr()
            small = linprog(-value[sub], A_ub=a, b_ub=np.r_[np.ones(jobs), left], bounds=(0.0, 1.0),
                            method="highs-ds")
            if small.status != 0:
                continue
            x[sub] = np.clip(small.x, 0.0, 1.0)
        if -(value @ x) <= -upper + RELAX_TOL * max(1.0, abs(upper)):
            out = np.empty(n)
            out[order] = x
            return out
    return None


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
                 restart_penalty_s: float = 30.0, trust_factor: int = 2, value_at_own_batch: bool = True,
                 keep_ties: bool = True) -> None:
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
        # Among exactly tied optima, the one that moves fewest jobs (see the module's doc); False: the solver's.
        self.keep_ties = keep_ties

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
        tie = TIE_BREAK / (len(jobs) + 1) if self.keep_ties else 0.0

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
            rows = self.goodputs(job, shapes, memo)  # in (type, GPUs) order already
            if factor != 1.0:
                rows = [(i, count, speedup if (i, count) == prev_key else speedup * factor)
                        for i, count, speedup in rows]
            p, lambda_n = self.p, self.lambda_n
            return [(i, count, sign * ((CLIP if speedup <= 0 else min(round(speedup ** p, 2), CLIP)) - lambda_n)
                     - (tie if (i, count) == prev_key else 0.0))
                    for i, count, speedup in rows]

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
        exact = n <= EXACT_MAX_VARS
        x = None if exact else relaxation_optimum(free, var_job, var_type, var_gpus, cost)
        if x is None:
            cols = np.arange(n)
            one_each = coo_matrix((np.ones(n), (np.array(var_job), cols)), shape=(num_jobs, n))
            per_type = coo_matrix((np.array(var_gpus, dtype=float), (np.array(var_type), cols)),
                                  shape=(len(free), n))
            constraints = [LinearConstraint(one_each.tocsr(), -np.inf, 1.0),
                           LinearConstraint(per_type.tocsr(), -np.inf, np.array(free, dtype=float))]
            result = milp(np.array(cost), constraints=constraints, integrality=np.full(n, 1 if exact else 0),
                          bounds=Bounds(0, 1), options={"mip_rel_gap": rel_gap, "time_limit": TIME_LIMIT_S})
            if result.x is None:
                raise PolicyError(
                    f"sia: the integer program found no solution in {TIME_LIMIT_S:g} s ({result.message})")
            x = result.x
        picked = np.flatnonzero(x > 1 - 1e-6)
        chosen = {var_job[k]: (var_type[k], var_gpus[k]) for k in picked}
        if not exact:
            left = list(free)
            for i, count in chosen.values():
                left[i] -= count
            # Each type within its GPUs (the relaxation's whole columns always are, up to its tolerance; this
            # guards against that tolerance): the costliest whole columns on a type over it go first.
            for whole in sorted(picked.tolist(), key=lambda k: -cost[k]):
                if left[var_type[whole]] < 0:
                    del chosen[var_job[whole]]
                    left[var_type[whole]] += var_gpus[whole]
            # The relaxation leaves at most a few jobs (about one per type) split between configurations:
            # each takes, cheapest first, its cheapest configuration that still fits.
            split = sorted({var_job[k] for k in np.flatnonzero((x > 1e-6) & (x <= 1 - 1e-6))} - set(chosen))
            for k in sorted((k for k in range(n) if var_job[k] in split), key=lambda k: cost[k]):
                if var_job[k] not in chosen and var_gpus[k] <= left[var_type[k]]:
                    chosen[var_job[k]] = (var_type[k], var_gpus[k])
                    left[var_type[k]] -= var_gpus[k]
        return chosen

    def place(self, jobs: Jobs, shapes: Sequence[TypeShape], chosen: Mapping[int, tuple[int, int]],
               previous: Allocations, in_place: Container[str] = frozenset()) -> Decision:
        """Each chosen (type, GPUs) on nodes: a job keeping its type and count keeps its GPUs; the others are
        packed afresh, largest first. ``in_place``: jobs that, keeping their type and changing their count,
        are grown onto a superset or shrunk onto a subset of the GPUs they hold where that fits
        (:func:`in_place_nodes`; the simulator then charges a resize, not a restart), before the others are packed; if
        that leaves a chosen configuration without room, every job is placed as without it."""
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
        if in_place:
            placed = []
            for j, i, count in pending:
                prev = previous.get(jobs[j].name)
                nodes = (in_place_nodes(prev.nodes, count, free[i], shapes[i].per_node)
                         if jobs[j].name in in_place and prev is not None and prev.nodes
                         and all(node_type.get(n) == i for n in prev.nodes) else None)
                if nodes is not None:
                    for n in nodes:
                        free[i][n] -= 1
                    decision[jobs[j].name] = Allocation(nodes, self._batch(jobs[j], shapes[i], nodes))
                    placed.append(j)
            if placed:
                pending = [item for item in pending if item[0] not in placed]
        pending.sort(key=lambda item: (-item[2], jobs[item[0]].arrival_s, jobs[item[0]].name))
        # pack(free[i], count, capacity=every node's per_node) through an index of the nodes by free GPUs
        # (each call of pack looks at every node of the type: 0.2 s a decision at 10,000 GPUs).
        indices = [FreeIndex(free[i], shape.nodes) for i, shape in enumerate(shapes)]
        for j, i, count in pending:
            job = jobs[j]
            nodes = indices[i].take(count, shapes[i].per_node)
            if nodes is None:  # the program kept each type within its GPUs: only resizes in place can do that
                if in_place:
                    return self.place(jobs, shapes, chosen, previous)
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

