"""Unit tests (pure; no Slurm, no fakes needed): a job's remaining time as the
policies see it, and the guess for a job that did not say how long it is."""

from __future__ import annotations

import pytest

from dlsub.policies.api import JobView
from dlsub.policies.speedup import UNKNOWN_WORK_S, RemainingTime, doubling_guess


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
    # At least the unit; then the work done rounded down to unit x 2**k.
    assert [doubling_guess(done, unit) for done in (0, 5, 19.99, 20, 39.9, 40, 41, 79, 80, 1000)] == \
        [10, 10, 10, 20, 20, 40, 40, 40, 80, 640]
    steps = [doubling_guess(done / 10, unit) for done in range(0, 5000)]
    # It changes only where the work done crosses a doubling, never between.
    changes = [i / 10 for i in range(1, len(steps)) if steps[i] != steps[i - 1]]
    assert changes == [20, 40, 80, 160, 320]
    assert all(b >= a for a, b in zip(steps, steps[1:], strict=False)), "never shrinks as work is done"


@pytest.mark.parametrize("done", [0.0, 3000.0, 9000.0, 1e6])
def test_unknown_work_is_the_doubling_guess_on_one_gpu(done: float) -> None:
    rate = 2.0
    job = JobView("j", 0.0, min_gpus=1, max_gpus=8, progress=done, model=Constant(rate))
    curve = RemainingTime(job, 4, adapt_batch=True, guess_remaining=True)
    assert curve.work == doubling_guess(done, rate * UNKNOWN_WORK_S)
    assert curve.time(1) == pytest.approx(curve.work / rate)
    assert curve.time(4) == pytest.approx(curve.time(1) / 4)
    known = RemainingTime(JobView("k", 0.0, remaining=5.0, progress=done, model=Constant(rate)), 4,
                          adapt_batch=True, guess_remaining=True)
    assert known.work == 5.0, "a declared length is used as told"
