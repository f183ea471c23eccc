"""Unit tests (pure; no Slurm, no fakes needed): a job's remaining time as the
policies see it, the guess for a job that did not say how long it is, and
how goodput ranks jobs on that guess."""

from __future__ import annotations

import pytest

from dlsub.policies.api import Allocation, ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.speedup import LEVEL_BASE, UNKNOWN_WORK_S, RemainingTime, level_guess


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


class Amdahl:
    """One GPU makes ``rate`` progress per second; ``n`` GPUs ``rate * n / (1 + serial * (n - 1))``."""

    def __init__(self, rate: float, serial: float) -> None:
        self.rate, self.serial = rate, serial

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / self.goodput(placement, batch_size)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        n = sum(placement)
        return self.rate * n / (1.0 + self.serial * (n - 1))

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 32, self.goodput(placement, 32)


def unknown_job(name: str, arrival: float, gpu_hours_done: float = 0.0, serial: float = 0.0) -> JobView:
    """A job of unknown length, up to 4 GPUs, that has done ``gpu_hours_done`` on one GPU."""
    return JobView(name, arrival, min_gpus=1, max_gpus=4, progress=gpu_hours_done * UNKNOWN_WORK_S,
                   model=Amdahl(1.0, serial))


def gpus(decision: dict[str, Allocation]) -> dict[str, int]:
    return {name: alloc.gpus for name, alloc in decision.items()}


def test_jobs_of_unknown_length_each_get_their_minimum_before_any_grows() -> None:
    # Ranked on a guess, the first job used to take the whole node and leave the others waiting.
    jobs = [unknown_job(f"j{i}", float(i)) for i in range(3)]
    decision = gpus(GoodputPolicy().decide(jobs, ClusterView.uniform(1, 4), 0.0, {}))
    assert set(decision) == {"j0", "j1", "j2"} and sum(decision.values()) == 4, decision


def test_spare_gpus_go_to_the_job_that_has_done_least_of_two_that_scale_alike() -> None:
    old, young = unknown_job("old", 0.0, gpu_hours_done=3.0), unknown_job("young", 50.0)
    decision = gpus(GoodputPolicy().decide([old, young], ClusterView.uniform(1, 4), 60.0, {}))
    assert decision == {"old": 1, "young": 3}


def test_spare_gpus_go_to_the_job_they_speed_up_most() -> None:
    poor, good = unknown_job("poor", 0.0, serial=0.9), unknown_job("good", 50.0, gpu_hours_done=3.0)
    decision = gpus(GoodputPolicy().decide([poor, good], ClusterView.uniform(1, 4), 60.0, {}))
    assert decision == {"poor": 1, "good": 3}, "the older job's speed-up outweighs its age"


def test_a_running_job_of_unknown_length_keeps_its_size_unless_the_gain_beats_the_restart_share() -> None:
    cluster = ClusterView.uniform(1, 4)
    on_two = {"j": Allocation(("n000", "n000"))}
    # 2 GPUs: 1.11x; 4 GPUs: 1.18x, less than 10% more: not worth a restart.
    flat = unknown_job("j", 0.0, serial=0.8)
    assert gpus(GoodputPolicy().decide([flat], cluster, 60.0, on_two)) == {"j": 2}
    # Perfect scaling: 4 GPUs are twice as fast as 2, well worth it.
    assert gpus(GoodputPolicy().decide([unknown_job("j", 0.0)], cluster, 60.0, on_two)) == {"j": 4}
    assert gpus(GoodputPolicy(restart_share=0.0).decide([flat], cluster, 60.0, on_two)) == {"j": 4}


def test_a_running_job_of_unknown_length_gets_its_size_back_before_a_newer_job_grows() -> None:
    running = {"old": Allocation(("n000",) * 3)}
    old, new = unknown_job("old", 0.0, gpu_hours_done=3.0), unknown_job("new", 50.0)
    decision = gpus(GoodputPolicy().decide([old, new], ClusterView.uniform(1, 4), 60.0, running))
    assert decision == {"old": 3, "new": 1}
    # Without a running size to return to, the newer job would have had the spare GPUs.
    assert gpus(GoodputPolicy().decide([old, new], ClusterView.uniform(1, 4), 60.0, {})) == {"old": 1, "new": 3}


def test_a_long_job_that_scales_is_not_starved_by_a_young_one_that_scales_less() -> None:
    """Attained service weighs by its square root: eight GPU-hours done make a job's speed-up count a third
    (not a ninth), so perfect scaling beats a young job that gains half as much per GPU."""
    long, young = unknown_job("long", 0.0, gpu_hours_done=8.0), unknown_job("young", 50.0, serial=0.5)
    decision = gpus(GoodputPolicy().decide([long, young], ClusterView.uniform(1, 4), 60.0, {}))
    assert decision == {"long": 3, "young": 1}
