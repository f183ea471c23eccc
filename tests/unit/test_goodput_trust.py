"""Unit tests (pure, no Slurm): the trust regions goodput may put on a job's fitted
model, in its batch size (``batch_trust``) and across nodes (``node_trust``)."""

from __future__ import annotations

import pytest

from dlsub.policies.api import ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import (
    BatchLimits,
    FittedPerformance,
    GradientStats,
    search_batches,
    split_batch,
)
from dlsub.policies.perf_models.throughput_fit import StepReport, ThroughputParams, fit

TRUE = ThroughputParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.2, beta_n=0.02, alpha_r=0.06, beta_r=0.008,
                        gamma=2.0)
LIMITS = BatchLimits(init_batch=128, max_batch=4096, min_local=16, max_local=256)
NOISY = GradientStats(sqr=1.0, var=500.0)  # big batches are worth a lot


def reports(sizes: list[tuple[int, int]], atomic: int = 32) -> list[StepReport]:
    return [StepReport(nodes, replicas, atomic, 0, float(TRUE.step_s(nodes, replicas, atomic, 0)))
            for nodes, replicas in sizes]


def test_the_fit_says_the_largest_total_batch_it_has_seen() -> None:
    assert fit([]).max_batch == 0
    assert fit(reports([(1, 1), (1, 4)], atomic=32)).max_batch == 128
    assert fit([StepReport(1, 2, 16, 3, 0.5)]).max_batch == 2 * 16 * 4


def test_a_batch_trusted_model_searches_no_higher_than_its_cap() -> None:
    model = FittedPerformance(fit(reports([(1, 1), (1, 4)])), LIMITS, NOISY)
    capped = model.batch_trusted(2.0)
    assert capped.batch_cap == 256 and capped is model.batch_trusted(2.0), "kept, so its searches are cached"
    assert model.best_batch((4,))[0] > 256, "without the cap the noise pulls the batch up"
    for placement in [(1,), (2,), (4,), (4, 4), (4, 4, 4, 4)]:
        batch, rate = capped.best_batch(placement)
        allowed = [b for b in capped.batch_candidates(sum(placement)) if b <= 256]
        expected = allowed or capped.batch_candidates(sum(placement))[:1]
        best = max(expected, key=lambda b: (capped.goodput(placement, b), -b))
        assert batch == best and rate == pytest.approx(capped.goodput(placement, best), rel=1e-12)
    # (4, 4, 4, 4): 16 replicas at 16 each is already 256; more replicas than the cap allows keep their smallest.
    assert capped.best_batch((4,) * 8)[0] == 8 * 4 * 16


def test_no_cap_before_any_report_nor_at_the_jobs_own_maximum() -> None:
    unreported = FittedPerformance(fit([]), LIMITS, NOISY)
    assert unreported.batch_trusted(2.0) is unreported
    big = FittedPerformance(fit(reports([(1, 8)], atomic=256)), LIMITS, NOISY)
    assert big.batch_trusted(2.0) is big  # 2 x 2048 reaches the maximum already
    model = FittedPerformance(fit(reports([(1, 1)])), LIMITS, NOISY)
    assert model.batch_trusted(0.0) is model


def test_capped_and_uncapped_models_searched_together_find_what_each_finds_alone() -> None:
    fitted = fit(reports([(1, 1), (1, 2), (1, 4)]))
    placements = [(1,), (2,), (4,), (4, 4)]
    models = [FittedPerformance(fitted, LIMITS, NOISY), FittedPerformance(fitted, LIMITS, NOISY).batch_trusted(2.0),
              FittedPerformance(fitted, LIMITS, NOISY).batch_trusted(4.0)]
    alone = [[FittedPerformance(fitted, LIMITS, NOISY, m.batch_cap).best_batch(p) for p in placements]
             for m in models]
    search_batches(models, placements)
    for model, expected in zip(models, alone, strict=True):
        assert [model.best_batch(p) for p in placements] == expected


def _job(model: FittedPerformance) -> JobView:
    return JobView("a", 0.0, gpus=1, min_gpus=1, max_gpus=64, batch_size=128, adaptive_batch=True,
                   progress=5000.0, model=model)


def test_node_trust_holds_a_job_that_never_crossed_nodes_to_that_many_nodes() -> None:
    in_node = FittedPerformance(fit(reports([(1, 1), (1, 2), (1, 4)])), LIMITS, NOISY)
    cluster = ClusterView.uniform(16, 4)
    assert GoodputPolicy().decide([_job(in_node)], cluster, 0.0, {})["a"].gpus == 16
    assert GoodputPolicy(node_trust=2).decide([_job(in_node)], cluster, 0.0, {})["a"].gpus == 8
    # Once it has run across nodes the ordinary trust (four times the most GPUs seen) applies.
    across = FittedPerformance(fit(reports([(1, 1), (1, 4), (2, 8)])), LIMITS, NOISY)
    assert GoodputPolicy(node_trust=2).decide([_job(across)], cluster, 0.0, {})["a"].gpus > 8


def test_batch_trust_holds_the_batch_the_policy_picks() -> None:
    model = FittedPerformance(fit(reports([(1, 1), (1, 2), (1, 4)])), LIMITS, NOISY)
    cluster = ClusterView.uniform(16, 4)
    free = GoodputPolicy().decide([_job(model)], cluster, 0.0, {})["a"]
    held = GoodputPolicy(batch_trust=2.0).decide([_job(model)], cluster, 0.0, {})["a"]
    assert free.batch_size is not None and free.batch_size > 256
    assert held.batch_size is not None and held.batch_size <= max(256, 4 * held.gpus * 16)


def test_a_job_that_ran_one_atomic_batch_is_given_another_to_separate_fixed_from_per_sample_compute() -> None:
    one_atomic = FittedPerformance(fit(reports([(1, 1), (1, 2), (1, 4)], atomic=32)), LIMITS, NOISY)
    assert one_atomic.fitted.atomics == (32,)
    cluster = ClusterView.uniform(16, 4)
    plain = GoodputPolicy().decide([_job(one_atomic)], cluster, 0.0, {})["a"]
    explored = GoodputPolicy(explore_batch=1.5).decide([_job(one_atomic)], cluster, 0.0, {})["a"]
    assert explored.gpus == plain.gpus
    assert explored.batch_size is not None
    atomic = split_batch(LIMITS, explored.gpus, explored.batch_size)[0]
    assert max(atomic, 32) >= 1.5 * min(atomic, 32)
    # Two atomic sizes seen: the fit can tell the parts apart, and the model's own best batch is used.
    two = FittedPerformance(fit(reports([(1, 1), (1, 4)], atomic=32) + reports([(1, 2)], atomic=64)), LIMITS, NOISY)
    assert two.fitted.atomics == (32, 64)
    assert GoodputPolicy(explore_batch=1.5).decide([_job(two)], cluster, 0.0, {}) == \
        GoodputPolicy().decide([_job(two)], cluster, 0.0, {})
