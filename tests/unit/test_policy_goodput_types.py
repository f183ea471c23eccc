"""Unit tests (pure policy tests, and the simulator with no Slurm): ``goodput`` across GPU types.

Models here are exact (no fit behind them: a policy sizes such a job up to its maximum), so each choice can
be checked by hand: a configuration is worth ``w x (admit + speed-up)``, the speed-up over the job's slowest
configuration on any type.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from typed_jobs import Linear, cluster, job, types_of

from dlsub.policies.api import Allocation, ClusterView, check_decision
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.goodput_types import (
    LEAST_SPEEDUP,
    TypedGoodputPolicy,
    discounted_rows,
    grows,
    priced_rows,
    type_rates,
    within_floor,
    within_type_floor,
)
from dlsub.policies.registry import get_policy
from dlsub.policies.sia import type_shapes
from dlsub.sim.engine import SimConfig, make_jobs, simulate
from dlsub.sim.workload import POLLUX_DIR, WorkloadJob, read_workload

# -- one GPU type: goodput exactly as before ------------------------------------------------------


@pytest.mark.parametrize("c", [ClusterView.uniform(2, 4), cluster(("a100", 2, 4))])
def test_on_one_gpu_type_it_decides_as_goodput(c: ClusterView) -> None:
    jobs = [job("a", hi=8, model=Linear(1.0, 0.9), progress=50.0, attained_gpu_s=900.0),
            job("b", hi=4, arrival_s=60.0, model=Linear(2.0, 0.5)),
            job("c", hi=2, arrival_s=120.0, model=Linear(1.0, 1.0), remaining=300.0)]
    previous = {"a": Allocation(("n000",) * 2 if c.nodes[0].name == "n000" else ("a1000",) * 2)}
    assert get_policy("goodput").decide(jobs, c, 600.0, previous) == GoodputPolicy().decide(jobs, c, 600.0, previous)
    # Issue 54's floors and price act across types only: on one type the homogeneous goodput decides.
    thrifty = TypedGoodputPolicy(type_floor=0.4, gpu_price=0.03, thrift_after_gpu_h=4.0)
    assert thrifty.decide(jobs, c, 600.0, previous) == GoodputPolicy().decide(jobs, c, 600.0, previous)


def test_on_the_pollux_workloads_the_simulation_is_goodputs_exactly() -> None:
    workload = read_workload(POLLUX_DIR / "workloads" / "workload-1.csv")[:12]
    c = ClusterView.uniform(2, 4)
    config = SimConfig(seed=1, arrival_jitter_s=120.0)
    plain = simulate(workload, POLLUX_DIR / "traces", GoodputPolicy(), c, config)
    typed = simulate(workload, POLLUX_DIR / "traces", get_policy("goodput"), c, config)
    assert isinstance(get_policy("goodput"), TypedGoodputPolicy)
    assert [(j.name, j.completion_s, j.restarts, j.gpu_s) for j in typed.jobs] == \
        [(j.name, j.completion_s, j.restarts, j.gpu_s) for j in plain.jobs]
    assert all(j.completion_s is not None for j in plain.jobs)


# -- several GPU types ----------------------------------------------------------------------------


def test_each_job_goes_where_its_comparative_advantage_is() -> None:
    # One fast GPU, one slow. a runs 3x faster on fast, b 1.2x: a on fast (3 + 1) beats b on fast (1.2 + 1).
    c = cluster(("fast", 1, 1), ("slow", 1, 1))
    a = job("a", hi=1, type_models={"fast": Linear(3.0), "slow": Linear(1.0)})
    b = job("b", hi=1, type_models={"fast": Linear(1.2), "slow": Linear(1.0)})
    for order in ([a, b], [b, a]):
        decision = TypedGoodputPolicy().decide(order, c, 0.0, {})
        check_decision(decision, order, c)
        assert types_of(decision, c) == {"a": ("fast", 1), "b": ("slow", 1)}


def test_a_job_with_no_reports_starts_on_the_type_its_profile_rates_fastest() -> None:
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    fresh = job("a", type_rates={"slow": 100.0, "fast": 250.0})
    assert types_of(TypedGoodputPolicy().decide([fresh], c, 0.0, {}), c) == {"a": ("fast", 1)}
    assert type_rates(fresh, type_shapes(c)) == [(0, 1, 100.0), (1, 1, 250.0)]


def test_a_type_it_has_not_run_on_is_bootstrapped_from_its_profile() -> None:
    # Reports from slow only; the profile says fast is twice as fast: fast's rows are slow's model, doubled.
    c = cluster(("slow", 1, 4), ("fast", 1, 4))
    j = job("a", hi=4, type_models={"slow": Linear(1.0)}, type_rates={"slow": 10.0, "fast": 20.0})
    rows = type_rates(j, type_shapes(c))
    assert (1, 4, 8.0) in rows and (0, 4, 4.0) in rows
    assert types_of(TypedGoodputPolicy().decide([j], c, 0.0, {}), c) == {"a": ("fast", 4)}
    # No profile of a type: it is left out, not guessed.
    assert {row[0] for row in type_rates(replace(j, type_rates={"slow": 10.0}), type_shapes(c))} == {0}


def test_every_job_runs_before_any_grows() -> None:
    # 4 GPUs; a scales linearly to 4, b and c not at all: each runs on one, a takes the rest (2).
    c = cluster(("fast", 1, 2), ("slow", 1, 2))
    a = job("a", hi=4, type_models={"fast": Linear(1.0), "slow": Linear(1.0)})
    b = job("b", hi=4, type_models={"fast": Linear(1.0, 0.0), "slow": Linear(1.0, 0.0)})
    cc = job("c", hi=4, type_models={"fast": Linear(1.0, 0.0), "slow": Linear(1.0, 0.0)})
    decision = TypedGoodputPolicy().decide([a, b, cc], c, 0.0, {})
    got = types_of(decision, c)
    assert set(got) == {"a", "b", "c"} and got["a"][1] == 2 and got["b"][1] == got["c"][1] == 1


def test_a_running_job_moves_type_only_when_the_gain_beats_the_restart() -> None:
    # a runs on 1 slow GPU; the fast type (2x) is free. A restart costs 120 s.
    c = cluster(("slow", 1, 1), ("fast", 1, 1))
    on_slow = {"a": Allocation(("slow0",))}
    a = job("a", hi=1, restart_s=120.0, restarts=0,
            type_models={"slow": Linear(1.0), "fast": Linear(2.0)}, running_since_s=0.0)
    # Young (200 s: about as much left): 2 x (1 - 120/200) x 0.95 = 0.76 < 1, it stays.
    assert types_of(TypedGoodputPolicy().decide([a], c, 200.0, on_slow), c) == {"a": ("slow", 1)}
    # Older (2000 s): 2 x 0.94 x 0.95 = 1.79 > 1, it moves.
    assert types_of(TypedGoodputPolicy().decide([a], c, 2000.0, on_slow), c) == {"a": ("fast", 1)}
    # Barely faster (1.02x) it stays at any age: the margin.
    b = replace(a, type_models={"slow": Linear(1.0), "fast": Linear(1.02)})
    assert types_of(TypedGoodputPolicy().decide([b], c, 1e6, on_slow), c) == {"a": ("slow", 1)}


def test_a_job_that_has_restarted_often_is_moved_less() -> None:
    # Pure policy, no Slurm. As above, 2000 s old, the fast type 2x; but each restart it has had already
    # counts (restart_count) against moving it again, as Sia's restart factor counts them.
    c = cluster(("slow", 1, 1), ("fast", 1, 1))
    on_slow = {"a": Allocation(("slow0",))}
    fresh = job("a", hi=1, restart_s=120.0, restarts=0,
                type_models={"slow": Linear(1.0), "fast": Linear(2.0)}, running_since_s=0.0)
    policy = TypedGoodputPolicy(restart_count=3.0)
    # Never restarted: 2 x (1 - 120/2000) x 0.95 = 1.79 > 1, it moves.
    assert types_of(policy.decide([fresh], c, 2000.0, on_slow), c) == {"a": ("fast", 1)}
    # Restarted 4 times: 2 x (1 - 120 x (1 + 3 x 4)/2000) x 0.95 = 0.42 < 1, it stays.
    churned = replace(fresh, restarts=4)
    assert types_of(policy.decide([churned], c, 2000.0, on_slow), c) == {"a": ("slow", 1)}
    # Without the count (restart_count 0) it would move all the same.
    assert types_of(TypedGoodputPolicy(restart_count=0.0).decide([churned], c, 2000.0, on_slow), c) == {
        "a": ("fast", 1)}


def test_a_job_in_the_middle_of_a_restart_keeps_its_gpus() -> None:
    c = cluster(("slow", 1, 1), ("fast", 1, 1))
    a = job("a", hi=1, restarting_s=20.0, type_models={"slow": Linear(1.0), "fast": Linear(5.0)})
    held = {"a": Allocation(("slow0",))}
    assert TypedGoodputPolicy().decide([a], c, 5000.0, held) == held


def test_younger_jobs_are_started_first_when_gpus_are_short() -> None:
    c = cluster(("fast", 1, 1), ("slow", 1, 1))
    rates = {"fast": 1.0, "slow": 1.0}
    old = job("old", hi=1, attained_gpu_s=36000.0, type_rates=rates)
    mid = job("mid", hi=1, attained_gpu_s=3600.0, type_rates=rates)
    new = job("new", hi=1, type_rates=rates)
    assert set(types_of(TypedGoodputPolicy().decide([old, mid, new], c, 0.0, {}), c)) == {"mid", "new"}


def test_the_simulator_charges_the_profile_to_a_policy_that_reads_it() -> None:
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    untyped = ClusterView.uniform(1, 4)
    assert make_jobs(spec, POLLUX_DIR / "traces", get_policy("goodput"), SimConfig(), untyped)[0].profile_s == 0.0
    sim_job = make_jobs(spec, POLLUX_DIR / "traces", get_policy("goodput"), SimConfig(profile_s=45.0), untyped)[0]
    sim_job.profile_s = 45.0  # as make_jobs sets it on a cluster of several types (tests/unit/test_sim_hetero.py)
    sim_job.reallocate(Allocation(("n000",)), 0.0, 30.0)
    assert sim_job.penalty_left == 75.0  # its first start: the restart and the profile
    sim_job.reallocate(Allocation(("n000", "n000")), 60.0, 30.0)
    assert sim_job.penalty_left == 6.0  # later changes: no profile; this grow in place pays the resize (issue 52)
    sim_job.reallocate(Allocation(("n001", "n001")), 120.0, 30.0)
    assert sim_job.penalty_left == 30.0  # and a move the restart


def test_a_type_a_job_has_no_profile_of_is_guessed_from_the_other_jobs_profiles() -> None:
    """Pure: with profiles run beside the job (SimConfig.profile "beside") a job may have none of a type yet.
    Its rate there is guessed from the types' ratio over the jobs that have both (geometric mean); with no
    such job the type is left out, as before; a job profiled nowhere is judged on the ratios alone."""
    from dlsub.policies.goodput_types import guessed_profile, type_speeds

    c = cluster(("fast", 1, 4), ("slow", 1, 4))
    shapes = type_shapes(c)
    others = [job("x", type_rates={"fast": 8.0, "slow": 2.0}), job("y", type_rates={"fast": 2.0, "slow": 2.0})]
    speeds = type_speeds(others)
    assert speeds[("fast", "slow")] == pytest.approx(2.0) and speeds[("slow", "fast")] == pytest.approx(0.5)
    partial = job("p", type_rates={"slow": 3.0})
    assert guessed_profile(partial, shapes, speeds) == pytest.approx({"slow": 3.0, "fast": 6.0})
    assert guessed_profile(partial, shapes, {}) == {"slow": 3.0}  # no job has both: fast left out
    assert {t for t, _, _ in type_rates(partial, shapes)} == {shapes.index(next(s for s in shapes
                                                                                 if s.name == "slow"))}
    assert len({t for t, _, _ in type_rates(partial, shapes, speeds=speeds)}) == 2
    nowhere = job("n", type_rates={})
    assert guessed_profile(nowhere, shapes, speeds) == pytest.approx(
        {shapes[0].name: 1.0, shapes[1].name: speeds[(shapes[1].name, shapes[0].name)]})
    assert guessed_profile(job("o"), shapes, speeds) == {}  # told no profiles at all (an untyped view)


# -- the marginal-GPU floor (issue 54) ---------------------------------------------------------------


def test_within_floor_ends_a_types_list_at_the_first_step_whose_gpus_pay_too_little() -> None:
    # Type 0: goodput 1, 1.6, 2.0, 2.2 on 1, 2, 4, 8 GPUs: the steps add 0.6, 0.2 and 0.05 a GPU of 1.
    rows = [(0, 1, 1.0), (0, 2, 1.6), (0, 4, 2.0), (0, 8, 2.2), (1, 2, 4.0), (1, 4, 7.0)]
    assert within_floor(rows, 0.0) == rows
    assert within_floor(rows, 0.5) == [(0, 1, 1.0), (0, 2, 1.6), (1, 2, 4.0), (1, 4, 7.0)]
    # Type 1's smallest is 2 GPUs (2.0 a GPU): 4 adds 1.5 a GPU, 0.75 of it.
    assert within_floor(rows, 0.8) == [(0, 1, 1.0), (1, 2, 4.0)]
    assert within_floor(rows, 0.1) == rows[:3] + rows[4:]


@pytest.mark.parametrize(("floor", "want"), [(0.0, 8), (0.25, 4), (0.5, 1), (None, 8)])
def test_a_job_that_scales_poorly_is_not_given_spare_gpus_below_the_floor(floor: float | None, want: int) -> None:
    # Alone on two 8-GPU types, goodput GPUs ** 0.5: a GPU added from 1 gives 0.41 of the first, from 2 0.29,
    # from 4 0.21. Without the floor every spare GPU of its type is its (the speed-up still grows).
    # None: the policy's default (off: issue 54's floor is measured, not yet chosen for the live agent).
    policy = TypedGoodputPolicy() if floor is None else TypedGoodputPolicy(marginal_floor=floor)
    assert poor_and_linear_gpus(policy) == {"p": ("a", want), "l": ("b", 8)}


def poor_and_linear_gpus(policy: TypedGoodputPolicy) -> dict[str, tuple[str, int]]:
    """The type and GPUs ``policy`` gives two jobs alone on two 8-GPU types: one scaling as GPUs ** 0.5 (twice
    as fast on a) and one linearly (twice as fast on b)."""
    c = cluster(("a", 1, 8), ("b", 1, 8))
    poor = job("p", hi=8, type_models={"a": Linear(2.0, 0.5), "b": Linear(1.0, 0.5)})
    linear = job("l", hi=8, type_models={"a": Linear(1.0), "b": Linear(2.0)})
    decision = policy.decide([poor, linear], c, 0.0, {})
    check_decision(decision, [poor, linear], c)
    return types_of(decision, c)


def test_within_floor_keeps_where_the_job_runs_now() -> None:
    # Running on 8 of type 0, below the floor: kept (leaving it is weighed as any change), 4 still dropped.
    rows = [(0, 1, 1.0), (0, 2, 1.6), (0, 4, 2.0), (0, 8, 2.2), (1, 2, 4.0)]
    assert within_floor(rows, 0.5, current=(0, 8)) == [(0, 1, 1.0), (0, 2, 1.6), (0, 8, 2.2), (1, 2, 4.0)]
    assert within_floor(rows, 0.5, current=(1, 2)) == within_floor(rows, 0.5)


def test_within_floor_across_types_judges_a_slow_types_gpus_against_the_fast_types() -> None:
    # Type 0 gives 4 a GPU, 3 more for a second; type 1 scales perfectly, at 1 a GPU: a quarter of type 0's.
    rows = [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0), (1, 2, 2.0), (1, 4, 4.0)]
    assert within_floor(rows, 0.5) == rows
    assert within_floor(rows, 0.5, across_types=True) == [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0)]
    assert within_floor(rows, 0.25, across_types=True) == rows


def test_within_type_floor_keeps_only_the_smallest_configuration_of_a_type_slow_for_the_job() -> None:
    # Type 0 gives 4 a GPU on its smallest; type 1 1 a GPU (a quarter), type 2 2.5 on its smallest of 2 (0.31).
    rows = [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0), (1, 2, 2.0), (1, 4, 4.0), (2, 2, 2.5), (2, 4, 5.0)]
    assert within_type_floor(rows, 0.0) == rows
    assert within_type_floor(rows, 0.25) == rows  # a quarter is not below a quarter
    assert within_type_floor(rows, 0.3) == [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0), (2, 2, 2.5), (2, 4, 5.0)]
    assert within_type_floor(rows, 0.4) == [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0), (2, 2, 2.5)]
    # Where the job runs now is kept, whatever the floor; the fast type is never cut, however flat.
    assert within_type_floor(rows, 0.4, current=(1, 4)) == [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 1.0), (1, 4, 4.0),
                                                           (2, 2, 2.5)]
    assert within_type_floor([], 0.4) == []


def test_within_type_floor_judges_types_by_the_profile_where_given() -> None:
    # Rows rate type 1's one GPU at 0.5 of type 0's; its profile says 0.3: below a floor of 0.4 by the profile.
    rows = [(0, 1, 4.0), (0, 2, 7.0), (1, 1, 2.0), (1, 2, 3.5)]
    assert within_type_floor(rows, 0.4) == rows
    assert within_type_floor(rows, 0.4, per_gpu={0: 10.0, 1: 3.0}) == rows[:3]
    assert within_type_floor(rows, 0.4, per_gpu={0: 10.0}) == rows  # a type unprofiled: judged by the rows


@pytest.mark.parametrize(("floor", "want"), [(0.0, ("b", 8)), (0.5, ("b", 8)), (0.6, ("a", 4)), (None, ("b", 8))])
def test_a_job_is_not_grown_wide_on_a_type_slow_for_it(floor: float | None, want: tuple[str, int]) -> None:
    # Linear, a GPU of b giving 0.55 of one of a: 8 of b (8.8) beat all 4 of a (8.0) until the floor passes
    # 0.55, which leaves b its one GPU. None: the policy's default (off).
    c = cluster(("a", 1, 4), ("b", 1, 8))
    j = job("j", hi=8, type_models={"a": Linear(2.0), "b": Linear(1.1)})
    policy = TypedGoodputPolicy() if floor is None else TypedGoodputPolicy(type_floor=floor)
    decision = policy.decide([j], c, 0.0, {})
    check_decision(decision, [j], c)
    assert types_of(decision, c) == {"j": want}


# -- the price of a GPU (issue 54) ------------------------------------------------------------------


def test_priced_rows_divide_each_goodput_by_one_plus_the_price_of_its_gpus() -> None:
    rows = [(0, 1, 2.0), (0, 2, 3.0), (0, 4, 4.0), (1, 1, 1.0)]
    assert priced_rows(rows, 0.0) == rows
    assert priced_rows(rows, 0.5) == [(0, 1, 2.0 / 1.5), (0, 2, 1.5), (0, 4, 4.0 / 3.0), (1, 1, 1.0 / 1.5)]


@pytest.mark.parametrize(("price", "want"), [(0.0, 8), (0.25, 4), (0.5, 2), (None, 8)])
def test_a_priced_gpu_goes_to_a_job_only_while_its_time_saved_pays_for_it(price: float | None, want: int) -> None:
    # goodput 2 x GPUs ** 0.5 on a: 2 sqrt(n) / (1 + price x n) is greatest at n = 1 / price. The linear job
    # job's priced goodput 2n / (1 + price x n) still grows with every GPU: all 8 of its type whatever the price.
    # None: the policy's default.
    policy = TypedGoodputPolicy() if price is None else TypedGoodputPolicy(gpu_price=price)
    assert poor_and_linear_gpus(policy) == {"p": ("a", want), "l": ("b", 8)}


@pytest.mark.parametrize(("attained_h", "want"), [(0.0, 8), (1.9, 8), (2.0, 2), (5.0, 2)])
def test_the_price_acts_on_a_job_only_once_it_has_held_enough_gpu_hours(attained_h: float, want: int) -> None:
    # As the price test above at 0.5 (2 of a), but only once the job has held 2 GPU-hours: before, a young job
    # (likely short) grows as without the price.
    c = cluster(("a", 1, 8), ("b", 1, 8))
    poor = job("p", hi=8, type_models={"a": Linear(2.0, 0.5), "b": Linear(1.0, 0.5)},
               attained_gpu_s=attained_h * 3600.0)
    policy = TypedGoodputPolicy(gpu_price=0.5, thrift_after_gpu_h=2.0)
    decision = policy.decide([poor], c, 0.0, {})
    check_decision(decision, [poor], c)
    assert types_of(decision, c) == {"p": ("a", want)}


# -- configurations the job's model has not measured (issue 54) -----------------------------------------


@dataclass(frozen=True)
class Measured(Linear):
    """:class:`Linear`, with reports from up to ``measured`` GPUs: wider, its model extrapolates."""

    measured: int = 8

    def extrapolates(self, placement: tuple[int, ...]) -> bool:
        return sum(placement) > self.measured


def test_discounted_rows_lower_only_the_configurations_the_model_extrapolates_to() -> None:
    c = cluster(("a", 1, 8), ("b", 1, 8))
    j = job("p", hi=8, type_models={"a": Measured(1.0, measured=2)}, type_rates={"a": 1.0, "b": 2.0})
    rows = type_rates(j, type_shapes(c))
    assert discounted_rows(j, type_shapes(c), rows, 0.0) == rows
    # b is bootstrapped from a's model: judged by what a's reports measured.
    assert discounted_rows(j, type_shapes(c), rows, 0.5) == [
        (0, 1, 1.0), (0, 2, 2.0), (0, 4, 2.0), (0, 8, 4.0), (1, 1, 2.0), (1, 2, 4.0), (1, 4, 4.0), (1, 8, 8.0)]
    # Where it runs now is never discounted.
    assert (0, 8, 8.0) in discounted_rows(j, type_shapes(c), rows, 0.5, current=(0, 8))
    # No reports at all: the one-GPU profile rows are measured.
    fresh = job("f", type_rates={"a": 1.0, "b": 2.0})
    assert discounted_rows(fresh, type_shapes(c), type_rates(fresh, type_shapes(c)), 0.5) == [(0, 1, 1.0),
                                                                                              (1, 1, 2.0)]


@pytest.mark.parametrize(("share", "want"), [(0.0, 4), (0.5, 2)])
def test_a_job_grows_past_what_it_has_measured_only_where_the_discounted_rate_still_pays(share: float,
                                                                                       want: int) -> None:
    # goodput 2 sqrt(n) on a, measured up to 2 GPUs, at price 0.25: 4 GPUs at their rating (2 x 2 / 2 = 2.0
    # against 2 x 1.41 / 1.5 = 1.89 on 2), 2 with the unmeasured 4 rated half (1.0).
    c = cluster(("a", 1, 8), ("b", 1, 8))
    poor = job("p", hi=8, type_models={"a": Measured(2.0, 0.5, measured=2), "b": Measured(1.0, 0.5, measured=2)})
    decision = TypedGoodputPolicy(gpu_price=0.25, extrapolated_share=share).decide([poor], c, 0.0, {})
    check_decision(decision, [poor], c)
    assert types_of(decision, c) == {"p": ("a", want)}


# -- Sia's p-norm and the work a job has left (issue 54) ------------------------------------------------


def test_grows_is_a_power_above_zero_and_sias_p_norm_below() -> None:
    assert grows(4.0, 0.5) == 2.0
    assert grows(4.0, -0.5) == -0.5
    assert grows(1.0, -1.0) < grows(2.0, -1.0) < grows(4.0, -1.0)


def test_weighted_by_the_work_left_the_fast_gpu_goes_to_the_job_it_saves_most_time() -> None:
    # One fast GPU (2x for both), one slow. old has done 10 hours, new nothing: with the attained-service
    # weight (the default) new gets the fast one; weighted by the work left as goodput guesses it (service
    # power -1) and valued by minus its time (speed-up power -1), old does: the fast GPU saves it 10 times
    # the seconds.
    c = cluster(("fast", 1, 1), ("slow", 1, 1))
    models = {"fast": Linear(2.0), "slow": Linear(1.0)}
    old = job("old", hi=1, attained_gpu_s=36000.0, type_models=models)
    new = job("new", hi=1, type_models=models)
    for policy, fast in ((TypedGoodputPolicy(), "new"),
                         (TypedGoodputPolicy(speedup_power=-1.0, service_power=-1.0), "old")):
        decision = policy.decide([old, new], c, 0.0, {})
        check_decision(decision, [old, new], c)
        assert types_of(decision, c)[fast] == ("fast", 1)


def test_a_move_the_restart_leaves_nothing_of_is_worth_least_under_the_p_norm() -> None:
    # Younger than its restart: every move's speed-up is 0 by the restart's share; it stays, no error.
    c = cluster(("slow", 1, 1), ("fast", 1, 1))
    a = job("a", hi=1, restart_s=120.0, restarts=0, type_models={"slow": Linear(1.0), "fast": Linear(2.0)},
            running_since_s=0.0)
    policy = TypedGoodputPolicy(speedup_power=-1.0)
    assert types_of(policy.decide([a], c, 60.0, {"a": Allocation(("slow0",))}), c) == {"a": ("slow", 1)}
    assert grows(0.0, -1.0) == -1.0 / LEAST_SPEEDUP


def test_weighed_by_age_a_job_that_ran_wide_does_not_age_faster_for_it() -> None:
    # wide arrived an hour ago and ran on 8 GPUs (8 GPU-hours); narrow arrived two hours ago on one (2). In
    # GPU-seconds narrow is the younger and gets the one fast GPU; by age wide is.
    c = cluster(("fast", 1, 1), ("slow", 1, 1))
    models = {"fast": Linear(2.0), "slow": Linear(1.0)}
    wide = job("wide", hi=1, arrival_s=3600.0, attained_gpu_s=8 * 3600.0, type_models=models)
    narrow = job("narrow", hi=1, arrival_s=0.0, attained_gpu_s=2 * 3600.0, type_models=models)
    for policy, fast in ((TypedGoodputPolicy(), "narrow"), (TypedGoodputPolicy(weigh_by_age=True), "wide")):
        decision = policy.decide([wide, narrow], c, 7200.0, {})
        check_decision(decision, [wide, narrow], c)
        assert types_of(decision, c)[fast] == ("fast", 1)
