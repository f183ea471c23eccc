"""Unit tests (pure; no Slurm): the ``sia`` policy's choices on small cases checked by hand.

Models here are exact (no fit behind them: a policy treats them as the
oracle's, sized up to the job's maximum). With p = -0.5 and lambda_n = 1.1
Sia minimises sum(round(speedup ** -0.5, 2)) over the jobs it places plus
1.1 for each job it leaves out, each speed-up normalised so that the job's
least is 1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from typed_jobs import Linear, cluster, job, types_of

from dlsub.batch_split import BatchLimits
from dlsub.policies.api import Allocation, check_decision
from dlsub.policies.perf_models.fitted_model import FittedPerformance, GradientStats
from dlsub.policies.perf_models.speedup import fixed_batch
from dlsub.policies.perf_models.throughput_fit import StepReport, fit
from dlsub.policies.placement import packed_placement
from dlsub.policies.sia import RateMemo, SiaPolicy, TypeShape, config_rates, type_shapes


def test_configurations_per_type_are_powers_of_two_then_whole_nodes() -> None:
    assert TypeShape("aws", 4, tuple(f"a{i}" for i in range(6))).configs == [1, 2, 4, 8, 12, 16, 20, 24]
    assert TypeShape("dgx", 8, ("d0", "d1")).configs == [1, 2, 4, 8, 16]
    assert [s.name for s in type_shapes(cluster(("aws", 2, 4), ("rtx", 1, 8)))] == ["aws", "rtx"]


def test_a_lone_job_goes_to_its_fastest_type_at_full_width() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    j = job("a", hi=4, type_models={"slow": Linear(1.0), "fast": Linear(2.0)})
    decision = SiaPolicy().decide([j], c, 0.0, {})
    check_decision(decision, [j], c)
    assert types_of(decision, c) == {"a": ("fast", 4)}


def test_lambda_n_leaves_a_job_out_when_widening_another_gains_more() -> None:
    # One type, 4 GPUs. a scales linearly (speed-ups 1, 2, 4 -> A 1, 0.71, 0.5), b not at all (A 1 at any size).
    # a on 4 alone: 0.5 + 1.1 (b left out) = 1.6; a on 2 and b on 1 or 2: 0.71 + 1 = 1.71; both on 1: 2.
    c = cluster(("t", 1, 4))
    a = job("a", hi=4, type_models={"t": Linear(1.0)})
    b = job("b", hi=4, type_models={"t": Linear(1.0, power=0.0)})
    assert types_of(SiaPolicy().decide([a, b], c, 0.0, {}), c) == {"a": ("t", 4)}
    # With a second node b fits beside a: a on 4 (0.5) and b on 1 (1) = 1.5 beats a on 8 and b out (0.35 + 1.1).
    c2 = cluster(("t", 2, 4))
    assert types_of(SiaPolicy().decide([a, b], c2, 0.0, {}), c2) == {"a": ("t", 4), "b": ("t", 1)}


def test_a_job_that_has_reported_nothing_gets_one_gpu() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    decision = SiaPolicy().decide([job("new")], c, 0.0, {})
    assert [a.gpus for a in decision.values()] == [1]


def test_a_type_without_reports_is_bootstrapped_from_one_gpu_profiles() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    # Reports on slow only; one GPU of fast runs its application 3x faster.
    j = job("a", hi=4, type_models={"slow": Linear(1.0)}, type_rates={"slow": 10.0, "fast": 30.0})
    rows = {(i, n): v for i, n, v in SiaPolicy().goodputs(j, type_shapes(c))}
    assert rows[(0, 1)] == pytest.approx(1.0) and rows[(1, 1)] == pytest.approx(3.0)
    assert rows[(1, 4)] == pytest.approx(12.0)
    assert types_of(SiaPolicy().decide([j], c, 0.0, {}), c) == {"a": ("fast", 4)}


def test_the_restart_factor_keeps_a_young_job_where_it_is() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    # fast is 5% better, but a move would cost the job (100 - 30) / (100 + 30) = 0.54 of its speed-up.
    models = {"slow": Linear(1.0), "fast": Linear(1.05)}
    young = job("a", hi=4, arrival_s=0.0, restarts=1, type_models=models)
    previous = {"a": Allocation(("slow0",) * 4)}
    assert SiaPolicy().decide([young], c, 100.0, previous) == previous
    # Old enough and never restarted, it moves (the factor is 3600 / 3630 = 0.99).
    old = job("a", hi=4, arrival_s=0.0, restarts=0, type_models=models)
    assert types_of(SiaPolicy().decide([old], c, 3600.0, previous), c) == {"a": ("fast", 4)}


def test_jobs_keeping_their_count_keep_their_gpus_and_every_type_stays_within_capacity() -> None:
    c = cluster(("aws", 6, 4), ("dgx", 2, 8), ("rtx", 3, 8))
    jobs = [job(f"j{i}", hi=16, type_models={t: Linear(s) for t, s in (("aws", 1.0), ("dgx", 3.0), ("rtx", 1.5))})
            for i in range(12)]
    first = SiaPolicy().decide(jobs, c, 0.0, {})
    check_decision(first, jobs, c)
    for alloc in first.values():
        assert len({c.type_of()[n] for n in alloc.nodes}) == 1  # never across types
    again = SiaPolicy().decide(jobs, c, 60.0, first)
    kept = [name for name in first if name in again and again[name].gpus == first[name].gpus
            and types_of({name: again[name]}, c) == types_of({name: first[name]}, c)]
    assert kept and all(Counter(again[n].nodes) == Counter(first[n].nodes) for n in kept)


def test_a_job_in_the_middle_of_a_restart_keeps_its_allocation() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    models = {"slow": Linear(1.0), "fast": Linear(3.0)}
    previous = {"a": Allocation(("slow0",) * 2)}
    restarting = job("a", hi=4, type_models=models, restarting_s=190.0)
    assert SiaPolicy().decide([restarting], c, 3600.0, previous) == previous
    settled = job("a", hi=4, type_models=models)
    assert types_of(SiaPolicy().decide([settled], c, 3600.0, previous), c) == {"a": ("fast", 4)}


def test_the_restart_cost_a_job_states_replaces_the_default() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    models = {"slow": Linear(1.0), "fast": Linear(1.2)}
    previous = {"a": Allocation(("slow0",) * 4)}
    # Speed-ups 4 where it is, 4.8 on fast. At 3600 s with no restarts the default 30 s leaves 0.99 of 4.8
    # (A 0.46 < 0.5: it moves); told 2000 s, 3600 / 5600 = 0.64 of it (A 0.57: it stays).
    cheap = job("a", hi=4, type_models=models)
    assert types_of(SiaPolicy().decide([cheap], c, 3600.0, previous), c) == {"a": ("fast", 4)}
    costly = job("a", hi=4, type_models=models, restart_s=2000.0)
    assert SiaPolicy().decide([costly], c, 3600.0, previous) == previous


def test_a_large_program_solved_relaxed_and_rounded_stays_within_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    import dlsub.policies.sia as sia

    c = cluster(("aws", 6, 4), ("dgx", 2, 8), ("rtx", 3, 8))
    jobs = [job(f"j{i}", hi=16, type_models={t: Linear(s, power=0.5 + 0.01 * i)
                                             for t, s in (("aws", 1.0), ("dgx", 3.0), ("rtx", 1.5))})
            for i in range(30)]
    exact = SiaPolicy().decide(jobs, c, 0.0, {})
    monkeypatch.setattr(sia, "EXACT_MAX_VARS", 0)
    relaxed = SiaPolicy().decide(jobs, c, 0.0, {})
    check_decision(relaxed, jobs, c)
    # The rounded relaxation places about as many GPUs and jobs as the exact program.
    assert abs(sum(a.gpus for a in relaxed.values()) - sum(a.gpus for a in exact.values())) <= 8
    assert abs(len(relaxed) - len(exact)) <= 3


class _Counting:
    """An exact model (:class:`Linear`) that counts the goodputs asked of it."""

    def __init__(self, speed: float) -> None:
        self.exact = Linear(speed)
        self.asked: list[tuple[int, ...]] = []

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.exact.step_time(placement, batch_size)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.exact.goodput(placement, batch_size)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        self.asked.append(placement)
        return self.exact.best_batch(placement)


def test_jobs_of_one_decision_sharing_a_model_share_its_goodputs_and_no_other_model_is_served_them() -> None:
    """Unit: within a decision's memo, a second job on the same model asks it nothing more (same rows); a
    job on another model of equal speed asks its own; the rows are those computed without the memo."""
    c = cluster(("aws", 2, 4), ("rtx", 1, 8))
    shapes = type_shapes(c)
    shared, other = _Counting(2.0), _Counting(2.0)
    a = job("a", hi=8, type_models={"aws": shared, "rtx": shared})
    b = job("b", hi=8, type_models={"aws": shared, "rtx": shared})
    d = job("d", hi=8, type_models={"aws": other, "rtx": other})
    memo: RateMemo = {}
    rows_a = SiaPolicy().goodputs(a, shapes, memo)
    asked = len(shared.asked)
    assert asked > 0 and SiaPolicy().goodputs(b, shapes, memo) == rows_a
    assert len(shared.asked) == asked
    assert SiaPolicy().goodputs(d, shapes, memo) == rows_a and len(other.asked) == asked
    assert SiaPolicy().goodputs(a, shapes) == rows_a


class _LargerBatchFaster(Linear):
    """An exact model whose best batch (128) has twice the goodput of the jobs' own (64)."""

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 128, 2 * self.goodput(placement, 64)


def test_config_rates_judge_a_fixed_batch_at_that_batch() -> None:
    """Unit: a job that keeps its own batch size is rated at it (goodput), one that lets the policy choose
    at the best batch; the memo keeps the two apart."""
    shape = type_shapes(cluster(("aws", 2, 4)))[0]
    model = _LargerBatchFaster(3.0, power=0.5)
    fixed, free = replace(job("a"), adaptive_batch=False), job("b")
    assert fixed_batch(fixed) == 64 and fixed_batch(free) is None
    memo: RateMemo = {}
    own = config_rates(model, shape, 4, 1, 8, fixed_batch(fixed), memo)
    best = config_rates(model, shape, 4, 1, 8, fixed_batch(free), memo)
    assert len(memo) == 2
    assert own == [(n, 3.0 * n ** 0.5) for n in (1, 2, 4, 8)]
    assert best == [(n, 6.0 * n ** 0.5) for n in (1, 2, 4, 8)]


def test_a_waiting_job_is_placed_at_no_discount_for_a_restart() -> None:
    """Unit: the restart factor discounts only a job that holds GPUs (the artifact scales the rows of the
    jobs with a previous configuration). Waiting since 100 s and restarted twice, a job that has reported
    nothing still gets its GPU: A = 1 < lambda_n; discounted as a move, (100 - 60) / (100 + 30) = 0.31 of its
    speed-up, A would be 1.8 and leaving it out cheaper."""
    c = cluster(("t", 1, 4))
    waiting = job("w", arrival_s=0.0, restarts=2)
    assert types_of(SiaPolicy().decide([waiting], c, 100.0, {}), c) == {"w": ("t", 1)}


def _fitted(max_batch: int = 4096) -> FittedPerformance:
    """A model fitted to one report (one GPU, 64 a step in 0.1 s), whose gradient noise favours large
    batches; init 64, at most ``max_batch``, 16 to 256 a GPU."""
    return FittedPerformance(fit([StepReport(1, 1, 64, 0, 0.1)]), BatchLimits(64, max_batch, 16, 256),
                             GradientStats(sqr=1.0, var=1000.0))


def test_a_capped_model_searches_batches_up_to_the_cap_or_a_replicas_least() -> None:
    """Unit: FittedPerformance.batch_capped(cap, replicas) searches no batch above ``cap``; where the
    replicas' least batch (16 each) exceeds it, that least one; a cap that does not bind leaves the model."""
    model = _fitted()
    assert model.best_batch((4,))[0] > 128
    capped = model.batch_capped(128, 4)
    assert capped.best_batch((4,))[0] <= 128 < model.best_batch((4,))[0]
    assert capped.best_batch((4,))[1] < model.best_batch((4,))[1]
    assert model.batch_capped(128, 16).best_batch((4, 4, 4, 4))[0] == 256  # 16 GPUs x 16 > 128
    assert model.batch_capped(4096, 4) is model and model.batch_capped(128, 4) is capped  # kept


def test_sia_values_a_job_at_batches_up_to_its_own_as_the_artifact_does() -> None:
    """Unit: the artifact's speed-up function stops at the workload's batch size (job.py, get_speedup_fn);
    sia's goodput matrix does likewise (config_rates with cap), while the job runs at the best batch of all."""
    shape = type_shapes(cluster(("aws", 2, 4)))[0]
    model = _fitted()
    uncapped = dict(config_rates(model, shape, 4, 1, 8, None))
    capped = dict(config_rates(model, shape, 4, 1, 8, None, cap=128))
    for n in (1, 2, 4, 8):
        assert capped[n] == pytest.approx(model.batch_capped(128, n).best_batch(packed_placement(n, 4))[1])
        assert capped[n] <= uncapped[n]
    assert capped[8] < uncapped[8]
    j = job("a", hi=8, type_models={"aws": model})  # its own batch: 64
    rows = {n: v for _, n, v in SiaPolicy().goodputs(j, [shape])}
    least = min(dict(config_rates(model, shape, 4, 1, 2, None, cap=64)).values())
    assert rows[2] == pytest.approx(dict(config_rates(model, shape, 4, 1, 2, None, cap=64))[2] / least)
    # Told not to (value_at_own_batch=False), it judges them up to the application's largest batch.
    free = {n: v for _, n, v in SiaPolicy(value_at_own_batch=False).goodputs(j, [shape])}
    assert free[2] == pytest.approx(uncapped[2] / uncapped[1]) and free[2] > rows[2]


@pytest.mark.parametrize("holder", ["a", "b"])
@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_on_an_exact_tie_the_job_holding_the_gpus_keeps_them(holder: str, order: tuple[str, str]) -> None:
    # One node of 2 GPUs, two alike jobs (speed-ups 1, 2: A 1, 0.71): either alone on 2 (0.71 + 1.1 for the other
    # left out) ties, 1.81. The holder is old (restart factor 0.998), which rounding to two decimals erases; the
    # waiting job is not discounted. Each of the two tied optima moves the job holding the GPUs or not at all.
    c = cluster(("t", 1, 2))
    jobs = {name: job(name, hi=2, type_models={"t": Linear(1.0)}) for name in "ab"}
    previous = {holder: Allocation(("t0", "t0"))}
    decision = SiaPolicy().decide([jobs[n] for n in order], c, 36000.0, previous)
    assert types_of(decision, c) == {holder: ("t", 2)}


def test_the_tie_break_never_outweighs_a_real_difference() -> None:
    # b on 2 GPUs is a little better (speed-up 2 ** 1.03 = 2.04: A 0.70 against the holder's 0.71): it takes them.
    c = cluster(("t", 1, 2))
    a = job("a", hi=2, type_models={"t": Linear(1.0)})
    b = job("b", hi=2, type_models={"t": Linear(1.0, power=1.03)})
    decision = SiaPolicy().decide([a, b], c, 36000.0, {"a": Allocation(("t0", "t0"))})
    assert types_of(decision, c) == {"b": ("t", 2)}
