"""Unit tests (pure; no Slurm): how a job's declared total work ranks it, and when it is guessed instead."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlsub.policies.api import JobView
from dlsub.policies.perf_models.speedup import RemainingTime, timed


@dataclass
class Fit:
    max_replicas: int


class Linear:
    """One unit of work a second per GPU; ``fitted.max_replicas``: what its reports have run on."""

    def __init__(self, reported_on: int | None) -> None:
        if reported_on is not None:
            self.fitted = Fit(reported_on)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / sum(placement)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement))

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 32, float(sum(placement))


def curve(remaining: float | None, progress: float = 0.0, reported_on: int | None = 1,
          trust: float = math.inf) -> RemainingTime:
    job = JobView("j", 0.0, min_gpus=1, max_gpus=4, batch_size=32, remaining=remaining, progress=progress,
                  model=Linear(reported_on))
    return RemainingTime(job, 4, adapt_batch=True, guess_remaining=True, trust_declared=trust)


def test_a_declared_total_ranks_a_job_once_a_step_of_it_is_timed() -> None:
    assert curve(600.0).time(1) == 600.0 and not curve(600.0).guessed
    assert curve(600.0).basis == "remaining work declared"
    untimed = curve(600.0, reported_on=0)
    assert untimed.guessed and untimed.time(1) == 3600.0
    assert untimed.basis == "remaining work guessed: declared, but no step timed yet"
    assert timed(JobView("oracle", 0.0, model=Linear(None)))  # a model that knows every step


def test_a_job_past_its_declared_total_is_guessed_not_all_but_done() -> None:
    overdue = curve(0.0, progress=20_000.0)
    assert overdue.guessed and overdue.time(1) == 14_400.0  # as much again as done, in levels of 4
    assert overdue.basis == "remaining work guessed: past its declared total"
    assert not curve(0.0, progress=0.0).guessed  # nothing done and nothing left: a finished declaration


def test_a_declaration_longer_than_the_trust_allows_is_ranked_as_the_guess() -> None:
    assert not curve(10_000.0).guessed  # trusted without limit by default
    long = curve(10_000.0, trust=1.0)
    assert long.guessed and long.time(1) == 3600.0
    assert long.basis == "remaining work guessed: declared longer than the guess trusts"
    assert not curve(3000.0, trust=1.0).guessed  # shorter than the guess: it is served sooner


def test_without_declarations_the_trust_changes_no_decision() -> None:
    """The artifact's workloads declare nothing: goodput decides on them as it did before declarations had limits."""
    from dlsub.policies.api import ClusterView
    from dlsub.policies.goodput import GoodputPolicy

    jobs = [JobView(f"j{i}", float(i), min_gpus=1, max_gpus=8, batch_size=32, progress=500.0 * i,
                    attained_gpu_s=500.0 * i, model=Linear(2)) for i in range(6)]
    cluster = ClusterView.uniform(2, 4)
    decisions = [GoodputPolicy(trust_declared=trust).decide(jobs, cluster, 0.0, {}) for trust in (1.0, 4.0, math.inf)]
    assert decisions[0] == decisions[1] == decisions[2] and sum(a.gpus for a in decisions[0].values()) == 8
