"""Unit tests (pure; no Slurm): the typed program's linear relaxation, solved by its Lagrangian dual over
one price a GPU type (:func:`dlsub.policies.sia.relaxation_optimum`), reaches HiGHS's optimum of the same
relaxation, and :meth:`~dlsub.policies.sia.SiaPolicy.solve` rounds it within each type's GPUs, at most one
configuration a job. Random multiple-choice knapsacks, small and medium, of Sia's shape (costs rounded to
0.01, as Sia's A, so many jobs tie) and of goodput's (costs distinct)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

import dlsub.policies.sia as sia
from dlsub.policies.sia import SiaPolicy, relaxation_optimum

Program = tuple[list[int], list[int], list[int], list[int], list[float]]


def knapsack(seed: int, jobs: int, types: int, rounded: bool, tight: float) -> Program:
    """Random (free, var_job, var_type, var_gpus, cost): each job a few GPU counts on some types, worth
    more the more GPUs (concave), each type's GPUs ``tight`` of what the jobs' widest would ask."""
    rng = np.random.default_rng(seed)
    var_job: list[int] = []
    var_type: list[int] = []
    var_gpus: list[int] = []
    cost: list[float] = []
    widest = np.zeros(types)
    for j in range(jobs):
        admit = rng.uniform(0.5, 2.0)
        power = rng.uniform(0.2, 1.0)
        for t in rng.choice(types, size=rng.integers(1, types + 1), replace=False):
            speed = rng.uniform(0.5, 3.0)
            counts = [1, 2, 4, 8, 16, 32][: rng.integers(1, 7)]
            for g in counts:
                c = -(admit + speed * g ** power)
                var_job.append(j)
                var_type.append(int(t))
                var_gpus.append(g)
                cost.append(round(c, 2) if rounded else c)
            widest[t] += counts[-1]
    order = np.lexsort((var_gpus, var_type, var_job))  # as typed_program lays them: by job, type, GPUs
    free = [max(0, int(tight * w)) for w in widest]
    return (free, [var_job[k] for k in order], [var_type[k] for k in order], [var_gpus[k] for k in order],
            [cost[k] for k in order])


def highs_relaxation(num_jobs: int, program: Program) -> float:
    free, var_job, var_type, var_gpus, cost = program
    n = len(cost)
    cols = np.arange(n)
    one_each = coo_matrix((np.ones(n), (var_job, cols)), shape=(num_jobs, n)).tocsr()
    per_type = coo_matrix((np.array(var_gpus, dtype=float), (var_type, cols)), shape=(len(free), n)).tocsr()
    result = milp(np.array(cost), constraints=[LinearConstraint(one_each, -np.inf, 1.0),
                                               LinearConstraint(per_type, -np.inf, np.array(free, dtype=float))],
                  integrality=np.zeros(n), bounds=Bounds(0, 1))
    assert result.status == 0
    return float(result.fun)


CASES = [(seed, jobs, types, rounded, tight)
         for seed, (jobs, types) in enumerate([(5, 1), (12, 2), (40, 3), (150, 3), (400, 5), (1000, 6)])
         for rounded in (False, True) for tight in (0.05, 0.3, 1.5)]


@pytest.mark.parametrize(("seed", "jobs", "types", "rounded", "tight"), CASES)
def test_the_dual_reaches_highs_relaxation_and_rounding_keeps_within_capacity(
        monkeypatch: pytest.MonkeyPatch, seed: int, jobs: int, types: int, rounded: bool, tight: float) -> None:
    program = knapsack(seed, jobs, types, rounded, tight)
    free, var_job, var_type, var_gpus, cost = program
    x = relaxation_optimum(*program)
    assert x is not None
    reference = highs_relaxation(jobs, program)
    assert abs(float(np.dot(cost, x)) - reference) <= 1e-6 * max(1.0, abs(reference))
    # x is feasible: in [0, 1], at most 1 a job, each type within its GPUs.
    assert x.min() >= -1e-9 and x.max() <= 1 + 1e-9
    assert np.bincount(var_job, weights=x).max() <= 1 + 1e-6
    assert np.all(np.bincount(var_type, weights=np.array(var_gpus) * x, minlength=len(free)) <= np.array(free) + 1e-6)
    # A vertex: few jobs split (about one a type).
    split = {var_job[k] for k in np.flatnonzero((x > 1e-6) & (x < 1 - 1e-6))}
    assert len(split) <= 2 * types
    # Rounded (the relaxed path of solve): one configuration a job, one of its own, each type within its GPUs.
    monkeypatch.setattr(sia, "EXACT_MAX_VARS", 0)
    chosen = SiaPolicy.solve(jobs, free, var_job, var_type, var_gpus, cost)
    columns = set(zip(var_job, var_type, var_gpus, strict=True))
    assert all((j, t, g) in columns for j, (t, g) in chosen.items())
    used = np.zeros(len(free))
    for t, g in chosen.values():
        used[t] += g
    assert np.all(used <= np.array(free))
    # Rounding gives up little: the rounded cost within the split jobs' worth of the relaxation's.
    rounded_cost = sum(c for j, t, g, c in zip(var_job, var_type, var_gpus, cost, strict=True)
                       if chosen.get(j) == (t, g))
    assert rounded_cost <= reference - sum(min(c for jj, c in zip(var_job, cost, strict=True) if jj == j)
                                           for j in split) + 1e-6


def test_where_the_cutting_planes_run_out_highs_solves_the_relaxation(monkeypatch: pytest.MonkeyPatch) -> None:
    program = knapsack(7, 200, 3, False, 0.3)
    monkeypatch.setattr(sia, "RELAX_MAX_CUTS", 1)
    assert relaxation_optimum(*program) is None
    monkeypatch.setattr(sia, "EXACT_MAX_VARS", 0)
    chosen = SiaPolicy.solve(200, *program)
    free, _, _, _, _ = program
    used = np.zeros(len(free))
    for t, g in chosen.values():
        used[t] += g
    assert chosen and np.all(used <= np.array(free))


def test_a_small_program_stays_exact() -> None:
    """Up to EXACT_MAX_VARS columns the integer program is solved exactly (HiGHS), as at the paper's scale."""
    program = knapsack(3, 12, 2, True, 0.3)
    assert len(program[4]) <= sia.EXACT_MAX_VARS
    free, var_job, var_type, var_gpus, cost = program
    n = len(cost)
    cols = np.arange(n)
    exact = milp(np.array(cost), constraints=[
        LinearConstraint(coo_matrix((np.ones(n), (var_job, cols)), shape=(12, n)).tocsr(), -np.inf, 1.0),
        LinearConstraint(coo_matrix((np.array(var_gpus, dtype=float), (var_type, cols)),
                                    shape=(len(free), n)).tocsr(), -np.inf, np.array(free, dtype=float))],
        integrality=np.ones(n), bounds=Bounds(0, 1), options={"mip_rel_gap": 1e-4})
    chosen = SiaPolicy.solve(12, *program)
    got = sum(c for j, t, g, c in zip(var_job, var_type, var_gpus, cost, strict=True) if chosen.get(j) == (t, g))
    assert got <= exact.fun + 1e-4 * abs(exact.fun) + 1e-9
