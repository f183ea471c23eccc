"""A job's expected remaining time as a function of its GPU count.

Shared by the policies that weigh one more GPU for one job against
another (optimus, goodput). Uses the job's performance model on a packed
placement (whole nodes first), which is what the placement step aims for.
"""

from __future__ import annotations

import math

from dlsub.policies.api import JobView
from dlsub.policies.placement import packed_placement

# A job that has not said how much work is left is expected to need as much
# again as it has done: the least-attained-service rule, right for the
# heavy-tailed job lengths of shared clusters (Tiresias, NSDI '19). As in
# Tiresias's discretised form, the guess moves in steps: it is the work done
# rounded down to UNKNOWN_WORK_S x LEVEL_BASE**k (timed on one GPU), so it
# jumps only when the work done crosses the next level. A guess that grew
# with every interval would reorder jobs every interval, and each
# reordering preempts someone (4,006 restarts on Pollux's workload-7 at
# 1.0x; 754 in doublings). Levels four times apart (rather than two) cross
# less often in the middle of a medium job, which then lost its GPUs to
# every younger job. The first level is a GPU-hour: with less, a new job's
# first steps up could never pay back their restarts (goodput asks a resize
# to save 30 s x 10), and it would sit on one GPU until it had proved itself
# long.
UNKNOWN_WORK_S = 3600.0
LEVEL_BASE = 4


def level_guess(done: float, unit: float, base: int = LEVEL_BASE) -> float:
    """The work left expected of a job that has done ``done``: the largest
    ``unit x base**k`` (k >= 0) not above it, at least ``unit``. A step function of ``done``."""
    level = unit
    while unit > 0 and done >= level * base:
        level *= base
    return level


class RemainingTime:
    """``time(n)``: seconds left for ``job`` on ``n`` GPUs; ``batch(n)``: the batch size used.

    With ``adapt_batch`` the batch size is the one with the best goodput on
    that placement (when the job allows it); otherwise the job's own. With
    ``guess_remaining``, a job whose remaining work is unknown is expected
    to need as much again as it has done (at least :data:`UNKNOWN_WORK_S`
    on one GPU).
    """

    def __init__(self, job: JobView, gpus_per_node: int, *, adapt_batch: bool,
                 guess_remaining: bool = False) -> None:
        if job.model is None or (job.remaining is None and not guess_remaining):
            raise ValueError(f"job {job.name} has no performance model or remaining work")
        self.job = job
        self.gpus_per_node = gpus_per_node
        self.adapt_batch = adapt_batch and job.adaptive_batch
        self._cache: dict[int, tuple[float, int | None]] = {}
        self.guessed = job.remaining is None
        self.work = self._guess_work() if job.remaining is None else job.remaining

    def _guess_work(self) -> float:
        return level_guess(self.job.progress, self._rate(1)[1] * UNKNOWN_WORK_S)

    def _rate(self, gpus: int) -> tuple[int | None, float]:
        model, job = self.job.model, self.job
        assert model is not None
        placement = packed_placement(gpus, self.gpus_per_node)
        if self.adapt_batch or job.batch_size is None:
            return model.best_batch(placement)
        return job.batch_size, model.goodput(placement, job.batch_size)

    def _solve(self, gpus: int) -> tuple[float, int | None]:
        if gpus not in self._cache:
            batch, rate = self._rate(gpus)
            seconds = self.work / rate if rate > 0 else math.inf
            self._cache[gpus] = (seconds, batch)
        return self._cache[gpus]

    def time(self, gpus: int) -> float:
        return math.inf if gpus <= 0 else self._solve(gpus)[0]

    def batch(self, gpus: int) -> int | None:
        return self._solve(gpus)[1] if gpus > 0 else None

    def saving(self, gpus: int) -> float:
        """Seconds saved by going from ``gpus`` to ``gpus + 1``."""
        return self.time(gpus) - self.time(gpus + 1)
