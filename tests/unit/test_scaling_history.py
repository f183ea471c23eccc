"""Unit tests (pure; no Slurm, no fakes needed): a new job's throughput fit starts
from what earlier jobs of its application measured (policies/perf_models/scaling_history.py)."""

from __future__ import annotations

from dlsub.policies.api import ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import BatchLimits, FittedPerformance, GradientStats
from dlsub.policies.perf_models.scaling_history import ScalingHistory, config_of
from dlsub.policies.perf_models.throughput_fit import StepReport, ThroughputParams, fit

#: An application that scales well: compute 0.2 s a step at 32 a replica, a cheap all-reduce.
TRUE = ThroughputParams(alpha_c=0.05, beta_c=0.005, alpha_n=0.02, beta_n=0.001, alpha_r=0.01, beta_r=0.001,
                        gamma=2.0)
LIMITS = BatchLimits(init_batch=32, max_batch=32 * 16, min_local=8, max_local=64)


def measured(nodes: int, replicas: int, atomic: int = 32, params: ThroughputParams = TRUE) -> StepReport:
    return StepReport(nodes, replicas, atomic, 0, float(params.step_s(nodes, replicas, atomic, 0)))


def test_a_job_that_has_reported_nothing_gets_its_applications_reports() -> None:
    history = ScalingHistory()
    earlier = [measured(1, 1), measured(1, 4), measured(2, 8)]
    history.record("app", "earlier", earlier)
    assert history.reports_for("app", "new", []) == earlier
    assert history.reports_for("another app", "new", []) == [], "one application's history is not another's"


def test_the_jobs_own_report_wins_at_a_configuration_both_measured() -> None:
    history = ScalingHistory()
    history.record("app", "earlier", [measured(1, 1), measured(1, 4)])
    mine = StepReport(1, 1, 32, 0, measured(1, 1).step_s * 1.2)  # within AGREEMENT
    reports = history.reports_for("app", "new", [mine])
    assert reports == [mine, measured(1, 4)]


def test_an_earlier_job_that_disagrees_with_the_jobs_own_reports_is_left_out() -> None:
    """Another model under the same name: three times slower where both ran. An earlier run of the same
    model still counts."""
    history = ScalingHistory()
    history.record("train", "same model", [measured(1, 1), measured(2, 8)])
    history.record("train", "other model", [StepReport(1, 1, 32, 0, 3 * measured(1, 1).step_s), measured(1, 4)])
    mine = measured(1, 1)
    assert history.reports_for("train", "new", [mine]) == [mine, measured(2, 8)]
    history.record("train", "new", [mine])
    assert history.reports_for("train", "new", [mine]) == [mine, measured(2, 8)], "its own word is no check"
    slower = StepReport(1, 1, 32, 0, 3 * measured(1, 1).step_s)
    assert history.reports_for("train", "third", [slower]) == [slower, measured(1, 4)]


def test_the_latest_word_per_configuration_is_kept_and_the_history_is_bounded() -> None:
    history = ScalingHistory(max_keys=2, max_configs=3)
    history.record("a", "earlier", [measured(1, 1)])
    newer = StepReport(1, 1, 32, 0, measured(1, 1).step_s * 1.1)
    history.record("a", "earlier", [newer])
    assert history.reports_for("a", "new", []) == [newer]
    history.record("a", "earlier", [measured(1, r) for r in (2, 3, 4)])
    assert [config_of(r) for r in history.reports_for("a", "new", [])] == [(1, r, 32, 0) for r in (2, 3, 4)]
    history.record("b", "earlier", [measured(1, 1)])
    history.record("c", "earlier", [measured(1, 1)])
    assert history.reports_for("a", "new", []) == [], "the least recently recorded application went first"
    assert history.reports_for("b", "new", []) and history.reports_for("c", "new", [])


def test_an_application_dropped_and_recorded_again_is_never_answered_from_before() -> None:
    """The answer a job got is cached by its application's version: an application pushed out and recorded
    anew must not reach the version it had, or the job would be told what the dropped history said."""
    history = ScalingHistory(max_keys=1)
    history.record("a", "earlier", [measured(1, 4)])
    assert history.reports_for("a", "new", []) == [measured(1, 4)]
    history.record("b", "earlier", [measured(1, 1)])  # "a" pushed out
    history.record("a", "other", [measured(2, 8)])  # "a" again, one change: as many as before
    assert history.reports_for("a", "new", []) == [measured(2, 8)]


def test_a_new_job_of_an_application_that_scales_starts_at_the_size_it_scales_to() -> None:
    """Without history a new job is trusted with one GPU; with its application's, it is sized at once."""
    history = ScalingHistory()
    history.record("app", "earlier", [measured(1, 1), measured(1, 4), measured(2, 8), measured(4, 16)])

    def first_decision(reports: list[StepReport]) -> int:
        # Noisy gradients: a batch 16 times bigger makes almost 16 times the progress.
        model = FittedPerformance(fit(reports), LIMITS, GradientStats(sqr=1.0, var=100.0))
        job = JobView("new", 0.0, min_gpus=1, max_gpus=16, batch_size=32, adaptive_batch=True, model=model)
        return GoodputPolicy().decide([job], ClusterView.uniform(4, 4), 0.0, {})["new"].gpus

    assert first_decision(history.reports_for("unseen", "new", [])) == 1
    assert first_decision(history.reports_for("app", "new", [])) == 16


def test_a_job_that_has_not_reported_its_gradient_noise_takes_its_applications_first() -> None:
    history = ScalingHistory()
    assert history.first_grads("app") is None
    history.record("app", "earlier", [measured(1, 1)], GradientStats(sqr=1.0, var=5.0))
    history.record("app", "earlier", [measured(1, 2)], GradientStats(sqr=0.2, var=40.0))  # later in its training
    history.record("app", "second", [measured(1, 1)], GradientStats(sqr=3.0, var=1.0))
    assert history.first_grads("app") == GradientStats(sqr=1.0, var=5.0), "the start of a training, not its end"
    assert history.first_grads("another app") is None
