"""Unit tests (pure, no Slurm): goodput's batch exploration (``explore_batch``) for a job whose
reports ran one per-replica batch size, from which its throughput fit cannot separate fixed from
per-sample compute."""

from __future__ import annotations

from dlsub.policies.api import ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import BatchLimits, FittedPerformance, GradientStats, split_batch
from dlsub.policies.perf_models.throughput_fit import StepReport, ThroughputParams, fit

TRUE = ThroughputParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.2, beta_n=0.02, alpha_r=0.06, beta_r=0.008,
                        gamma=2.0)
LIMITS = BatchLimits(init_batch=128, max_batch=4096, min_local=16, max_local=256)
NOISY = GradientStats(sqr=1.0, var=500.0)  # big batches are worth a lot


def reports(sizes: list[tuple[int, int]], atomic: int = 32) -> list[StepReport]:
    return [StepReport(nodes, replicas, atomic, 0, float(TRUE.step_s(nodes, replicas, atomic, 0)))
            for nodes, replicas in sizes]


def test_the_fit_says_which_atomic_batches_it_has_seen() -> None:
    assert fit([]).atomics == ()
    assert fit(reports([(1, 1), (1, 4)], atomic=32) + reports([(1, 2)], atomic=16)).atomics == (16, 32)


def _job(model: FittedPerformance) -> JobView:
    return JobView("a", 0.0, gpus=1, min_gpus=1, max_gpus=64, batch_size=128, adaptive_batch=True,
                   progress=5000.0, model=model)


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
