"""Unit tests (pure): the throughput model fitted from a job's own reports,
and the performance model built on it."""

from __future__ import annotations

import numpy as np
import pytest

from dlsub.policies.api import JobView
from dlsub.policies.perf_models.fitted_model import (
    BatchLimits,
    FittedPerformance,
    GradientStats,
    search_batches,
    split_batch,
    split_batches,
)
from dlsub.policies.perf_models.throughput_fit import (
    PRIOR,
    StepReport,
    ThroughputParams,
    _log_step,
    _log_step_gradient,
    fit,
)
from dlsub.policies.registry import get_policy
from dlsub.sim.apps import load_application
from dlsub.sim.workload import POLLUX_DIR

TRUE = ThroughputParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.2, beta_n=0.02, alpha_r=0.06, beta_r=0.008,
                        gamma=2.0)
# (nodes, replicas) a job might have run at on 8-GPU nodes.
SIZES = [(1, 1), (1, 2), (1, 4), (1, 6), (1, 8), (2, 8), (3, 12), (2, 16), (4, 32)]


def reports(params: ThroughputParams, noise: float, seed: int, sizes: list[tuple[int, int]] = SIZES,
            atomics: tuple[int, ...] = (8, 32, 128), repeats: int = 2) -> list[StepReport]:
    """Noisy reports (log-normal, ``noise`` sigma) from a job whose true parameters are ``params``."""
    rng = np.random.default_rng(seed)
    out = []
    for nodes, replicas in sizes:
        for atomic in atomics:
            for accum in (0, 1):
                step = float(params.step_s(nodes, replicas, atomic, accum))
                compute = float(params.compute_s(atomic))
                for _ in range(repeats):
                    out.append(StepReport(nodes, replicas, atomic, accum, step * np.exp(rng.normal(0, noise)),
                                          compute * np.exp(rng.normal(0, noise)) if accum else None))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_parameters_from_noisy_reports(seed: int) -> None:
    fitted = fit(reports(TRUE, noise=0.02, seed=seed))
    ratio = fitted.params.as_array() / TRUE.as_array()
    assert np.all(np.abs(ratio - 1) < 0.10), dict(zip(("ac", "bc", "an", "bn", "ar", "br", "g"), ratio.round(3),
                                                      strict=True))
    assert fitted.rmsle < 0.05 and fitted.max_replicas == 32 and fitted.max_nodes == 4


def test_fit_is_exact_without_noise_and_deterministic() -> None:
    data = reports(TRUE, noise=0.0, seed=0, repeats=1)
    a, b = fit(data), fit(data)
    assert a == b
    np.testing.assert_allclose(a.params.as_array(), TRUE.as_array(), rtol=1e-3)


def test_fit_predicts_unseen_sizes_within_twice_the_largest_seen() -> None:
    seen = [(1, 1), (1, 2), (1, 4), (2, 4), (2, 8)]
    fitted = fit(reports(TRUE, noise=0.03, seed=4, sizes=seen))
    assert fitted.trusted_replicas == 16
    for nodes, replicas in [(1, 3), (2, 6), (3, 12), (4, 16)]:
        predicted = float(fitted.params.step_s(nodes, replicas, 32, 0))
        assert predicted == pytest.approx(float(TRUE.step_s(nodes, replicas, 32, 0)), rel=0.10)
        assert not fitted.extrapolates(nodes, replicas)
    assert fitted.extrapolates(5, 20), "beyond twice the most replicas seen"


def test_throughput_reports_convert_to_step_times() -> None:
    report = StepReport.from_samples_per_s(2, 8, 32, 1, samples_per_s=1024.0)
    assert report.step_s == pytest.approx(8 * 32 * 2 / 1024.0)


def test_prior_until_data_and_optimistic_about_what_is_unseen() -> None:
    empty = fit([])
    assert empty.params == PRIOR and empty.reports == 0 and empty.trusted_replicas == 1
    assert empty.extrapolates(1, 2) and not empty.extrapolates(1, 1)
    one_gpu = fit([StepReport(1, 1, 32, 0, 0.2), StepReport(1, 1, 64, 0, 0.3)])
    # Only one GPU seen: synchronisation unknown, so assumed free (Pollux's
    # optimism, which is what makes trying 2 GPUs worth it) and 2 trusted.
    assert float(one_gpu.params.sync_s(1, 2)) < 1e-6 and one_gpu.trusted_replicas == 2
    assert float(one_gpu.params.step_s(1, 1, 48, 0)) == pytest.approx(0.25, rel=1e-3)
    assert one_gpu.extrapolates(2, 2), "no report crossed nodes"
    # Seen within a node only: crossing nodes costs at least as much.
    in_node = fit(reports(TRUE, noise=0.0, seed=0, sizes=[(1, 1), (1, 2), (1, 4)], repeats=1))
    assert float(in_node.params.sync_s(2, 4)) >= float(in_node.params.sync_s(1, 4)) - 1e-9


def test_split_batch_matches_the_simulators_rule() -> None:
    for name in ("cifar10", "yolov3", "bert", "imagenet"):
        app = load_application(POLLUX_DIR / "traces" / name)
        limits = BatchLimits(app.init_batch_size, app.max_batch_size, app.min_local_bsz, app.max_local_bsz)
        for replicas in (1, 2, 3, 4, 8, 16, 64):
            for batch in np.geomspace(app.init_batch_size, app.max_batch_size, 9).astype(int):
                config = app.batch_config(replicas, int(batch))
                assert split_batch(limits, replicas, int(batch)) == (config.atomic, config.accum_steps)


def test_fitted_model_is_a_performance_model_the_goodput_policy_takes() -> None:
    limits = BatchLimits(init_batch=128, max_batch=4096, min_local=16, max_local=256)
    fitted = fit(reports(TRUE, noise=0.0, seed=0, sizes=[(1, 1), (1, 2), (1, 4)], repeats=1))
    noisy = FittedPerformance(fitted, limits, GradientStats(sqr=1.0, var=50.0))
    quiet = FittedPerformance(fitted, limits)  # no gradient noise reported yet: no gain from bigger batches
    assert quiet.best_batch((4,))[0] == 4 * 32 or quiet.best_batch((4,))[0] == max(128, 4 * 16)
    assert noisy.best_batch((4,))[0] > quiet.best_batch((4,))[0], "noise makes big batches worth it"
    assert noisy.goodput((4,), 512) == pytest.approx(noisy.efficiency(512) / noisy.step_time((4,), 512))
    assert noisy.trusted_gpus == 16 and noisy.extrapolates((4, 4, 4)) and not noisy.extrapolates((4,))
    job = JobView("a", 0.0, gpus=1, min_gpus=1, max_gpus=64, batch_size=128, adaptive_batch=True,
                  progress=5000.0, model=noisy)
    from dlsub.policies.api import ClusterView
    decision = get_policy("goodput").decide([job], ClusterView.uniform(16, 4), 0.0, {})
    # Scales well, but no further than the policy trusts its reports: four times the 4 GPUs seen.
    assert decision["a"].gpus == 16


LIMITS = [BatchLimits(128, 4096, 16, 256), BatchLimits(64, 64, 8, 64), BatchLimits(32, 12800, 8, 32)]


def test_vectorised_split_is_the_scalar_rule() -> None:
    for limits in LIMITS:
        for replicas in (1, 2, 3, 4, 7, 16, 64):
            batches = np.unique(np.geomspace(1, 2 * limits.max_batch, 40).astype(int))
            atomic, accum = split_batches(limits, replicas, batches)
            assert [(int(a), int(s)) for a, s in zip(atomic, accum, strict=True)] == \
                [split_batch(limits, replicas, int(b)) for b in batches]


@pytest.mark.parametrize("params", [TRUE, PRIOR, ThroughputParams(0.3, 1e-4, 2.0, 0.5, 0.01, 1e-8, 9.5)])
def test_step_time_at_one_configuration_is_the_vectorised_formula(params: ThroughputParams) -> None:
    atomic = np.array([1.0, 8, 32, 33, 512])
    for nodes, replicas in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 5), (4, 16), (16, 64)]:
        for accum in (0.0, 3.0):
            accums = np.full_like(atomic, accum)
            # Bit for bit: the policy's decisions must not depend on which path ran.
            np.testing.assert_array_equal(params.step_s_at(nodes, replicas, atomic, accums),
                                          params.step_s(nodes, replicas, atomic, accums))


def straightforward_rate(fitted: ThroughputParams, limits: BatchLimits, grads: GradientStats,
                         placement: tuple[int, ...], batch: int) -> float:
    """Goodput as the model's docstrings define it, one batch at a time, with no cache."""
    replicas, nodes = sum(placement), len(placement)
    atomic, accum = split_batch(limits, replicas, batch)
    step = float(fitted.step_s(nodes, replicas, atomic, accum))
    scale = replicas * atomic * (accum + 1) / limits.init_batch
    return (grads.var + grads.sqr) / (grads.var / scale + grads.sqr) / step


def test_best_batch_is_the_straightforward_search() -> None:
    """The cached, shared batch grid gives what searching each candidate one by one gives."""
    fitted = fit(reports(TRUE, noise=0.05, seed=3, sizes=[(1, 1), (1, 2), (1, 4), (2, 8)], repeats=1))
    for limits in LIMITS:
        for grads in (GradientStats(1.0, 0.0), GradientStats(1.0, 50.0), GradientStats(0.2, 3000.0)):
            model = FittedPerformance(fitted, limits, grads)
            for placement in [(1,), (2,), (4,), (4, 1), (4, 4), (4, 4, 4, 4)]:
                rates = {b: straightforward_rate(fitted.params, limits, grads, placement, b)
                         for b in model.batch_candidates(sum(placement))}
                best = max(rates, key=lambda b: (rates[b], -b))  # the first of equals, as argmax
                assert model.best_batch(placement) == (best, pytest.approx(rates[best], rel=1e-12))
                for batch, rate in rates.items():
                    assert model.goodput(placement, batch) == pytest.approx(rate, rel=1e-12)


def test_searching_many_models_together_finds_what_each_finds_alone() -> None:
    """search_batches (one array pass over many jobs, as a decision does) against best_batch one model at a time."""
    fits = [fit(reports(TRUE, noise=0.05, seed=seed, sizes=sizes, repeats=1))
            for seed, sizes in enumerate([[(1, 1)], [(1, 1), (1, 2), (1, 4)], [(1, 1), (1, 4), (2, 8)]])]
    placements = [(1,), (2,), (3,), (4,), (4, 1), (4, 4)]
    for limits in LIMITS:
        models = [FittedPerformance(fitted, limits, grads) for fitted in fits
                  for grads in (GradientStats(1.0, 0.0), GradientStats(0.2, 3000.0))]
        alone = [[FittedPerformance(m.fitted, limits, m.grads).best_batch(p) for p in placements] for m in models]
        models[0].best_batch((2,))  # one already known: kept, the rest searched
        search_batches([*models, None, "not a model"], placements)
        for model, expected in zip(models, alone, strict=True):
            for placement, (batch, rate) in zip(placements, expected, strict=True):
                assert model._best[(len(placement), sum(placement))] == (batch, pytest.approx(rate, rel=1e-12))


@pytest.mark.parametrize("seed", range(5))
def test_the_fits_gradient_is_the_models_slope(seed: int) -> None:
    """The least-squares search is given the model's derivatives: check them by central differences."""
    rng = np.random.default_rng(seed)
    nodes = np.array([1, 1, 1, 2, 4, 1, 2, 1], dtype=float)
    replicas = np.array([1, 2, 4, 8, 16, 3, 2, 1], dtype=float)
    atomic = np.array([8, 32, 64, 16, 32, 8, 128, 256], dtype=float)
    accum = np.array([0, 1, 0, 2, 0, 0, 1, 3], dtype=float)
    p = np.exp(rng.normal(-3, 1.5, 7))
    p[6] = rng.uniform(1, 10)
    gradient = _log_step_gradient(p, nodes, replicas, atomic, accum)
    for j in range(7):
        up, down, h = p.copy(), p.copy(), 1e-6 * p[j]
        up[j] += h
        down[j] -= h
        config = (nodes, replicas, atomic, accum)
        slope = (_log_step(up, *config) - _log_step(down, *config)) / (2 * h)
        np.testing.assert_allclose(gradient[:, j], slope, rtol=1e-4, atol=1e-6)
