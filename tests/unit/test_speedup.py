"""Unit tests (pure; no Slurm, no fakes needed): a job's remaining time as the
policies see it, the guess for a job that did not say how long it is, and
how goodput ranks jobs on that guess."""

from __future__ import annotations

import pytest

from dlsub.policies.api import Allocation, ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.speedup import LEVEL_BASE, UNKNOWN_WORK_S, RemainingTime, level_guess


class Constant:
    """One GPU makes ``rate`` progress per second; each more GPU as much again."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / (self.rate * sum(placement))

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.rate * sum(placement)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 32, self.goodput(placement, 32)


def test_the_guess_is_a_step_function_of_the_work_done() -> None:
    unit = 10.0
    # At least the unit; then the work done rounded down to unit x base**k.
    assert [level_guess(done, unit, 2) for done in (0, 5, 19.99, 20, 39.9, 40, 41, 79, 80, 1000)] == \
        [10, 10, 10, 20, 20, 40, 40, 40, 80, 640]
    assert [level_guess(done, unit, 4) for done in (0, 39.9, 40, 159, 160, 1000)] == [10, 10, 40, 40, 160, 640]
    steps = [level_guess(done / 10, unit) for done in range(0, 50000)]
    # It changes only where the work done crosses a level, never between.
    changes = [i / 10 for i in range(1, len(steps)) if steps[i] != steps[i - 1]]
    assert changes == [unit * LEVEL_BASE ** k for k in range(1, 5)]
    assert all(b >= a for a, b in zip(steps, steps[1:], strict=False)), "never shrinks as work is done"


@pytest.mark.parametrize("done", [0.0, 3000.0, 30000.0, 1e6])
def test_unknown_work_is_the_level_guess_on_one_gpu(done: float) -> None:
    rate = 2.0
    job = JobView("j", 0.0, min_gpus=1, max_gpus=8, progress=done, model=Constant(rate))
    curve = RemainingTime(job, 4, adapt_batch=True, guess_remaining=True)
    assert curve.guessed and curve.work == level_guess(done, rate * UNKNOWN_WORK_S)
    assert curve.time(1) == pytest.approx(curve.work / rate)
    assert curve.time(4) == pytest.approx(curve.time(1) / 4)
    known = RemainingTime(JobView("k", 0.0, remaining=5.0, progress=done, model=Constant(rate)), 4,
                          adapt_batch=True, guess_remaining=True)
    assert known.work == 5.0 and not known.guessed, "a declared length is used as told"


def one_gpu_job(name: str, arrival: float, levels_done: int) -> JobView:
    """A job of unknown length that has done a GPU-hour x LEVEL_BASE**levels_done of work."""
    done = UNKNOWN_WORK_S * LEVEL_BASE ** levels_done if levels_done >= 0 else 0.0
    return JobView(name, arrival, min_gpus=1, max_gpus=1, progress=done, model=Constant(1.0))


def test_a_running_job_crossing_a_level_keeps_its_gpu_against_the_level_below() -> None:
    cluster = ClusterView.uniform(1, 1)
    running = {"old": Allocation(("n000",))}
    policy = GoodputPolicy()
    # "old" has just crossed into level 1; "new" (younger) waits at level 0.
    old, new = one_gpu_job("old", 0.0, 1), one_gpu_job("new", 10.0, -1)
    assert set(policy.decide([old, new], cluster, 60.0, running)) == {"old"}, "hysteresis: no preemption yet"
    assert set(policy.decide([old, new], cluster, 60.0, {})) == {"new"}, "waiting, the shorter guess goes first"
    # Two levels apart, the running job yields.
    older = one_gpu_job("old", 0.0, 2)
    assert set(policy.decide([older, new], cluster, 60.0, running)) == {"new"}
