"""The :class:`~dlsub.policies.api.PerformanceModel` of a job built from what it reported.

Throughput comes from :mod:`dlsub.policies.throughput_fit`; statistical
efficiency from the last gradient statistics the job reported (Pollux's
gradient noise scale: the squared norm of the gradient and its variance,
both at the scale of the job's initial batch size). A bigger total batch
``B`` makes ``(var + sqr) / (var / (B / B0) + sqr)`` times the progress of
one step at ``B0``. Until the job reports them, bigger batches are assumed
to gain nothing (``var = 0``), so the job keeps the smallest batch.

How a total batch runs on a number of replicas (per-replica batch,
gradient accumulation) is the job's own declared rule,
:func:`~dlsub.policies.batch_split.split_batch`, which the training library
runs too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dlsub.policies.batch_split import BatchLimits, split_batch
from dlsub.policies.throughput_fit import ThroughputFit

__all__ = ["NO_GAIN", "BatchLimits", "FittedPerformance", "GradientStats", "split_batch"]


@dataclass(frozen=True)
class GradientStats:
    """The gradient noise the job last reported, at its initial batch size's scale."""

    sqr: float
    var: float


NO_GAIN = GradientStats(sqr=1.0, var=0.0)

# How far beyond the most GPUs a job has run on a policy may size it. The
# fit says it extrapolates past twice (ThroughputFit.extrapolates), and
# Pollux stops there; but every step up is a restart, and a job that grew
# 1 -> 2 -> 4 -> 8 paid three of them before it ran at the size it
# needed. Four times (1 -> 4 -> 16) brought goodput's online average JCT
# from 1.35 to 1.23 times Pollux's on four of its workloads (workload-7 and
# -3 at 1.0x, -1 and -7 at 0.5x); the optimistic prior's error past 2x is
# corrected one interval later, when the job reports from the new size.
TRUSTED_FACTOR = 4


def split_batches(limits: BatchLimits, replicas: int, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`split_batch` for many total batches at once (as float arrays): the
    same arithmetic, element by element, so the results are identical."""
    batch = np.asarray(batches, dtype=float)
    local = np.ceil(batch / replicas - 1e-8)
    accum = np.maximum(0.0, np.ceil(local / limits.max_local - 1e-8) - 1)
    if replicas == 1:
        accum = np.where(batch > limits.init_batch, np.maximum(1.0, accum), accum)
    atomic = np.ceil(local / (accum + 1) - 1e-8)
    # int() of a positive float is its floor.
    atomic = np.minimum(atomic, np.floor(limits.max_batch / (replicas * (accum + 1))))
    return np.maximum(atomic, 1.0), accum


@dataclass(frozen=True)
class _BatchGrid:
    """The candidate total batches on a number of replicas, and how each runs."""

    candidates: tuple[int, ...]
    atomic: np.ndarray
    accum: np.ndarray
    totals: np.ndarray  # samples per optimiser step: replicas x atomic x (accum + 1)


@lru_cache(maxsize=4096)
def _batch_grid(limits: BatchLimits, replicas: int) -> _BatchGrid:
    # Shared by every job with the same declared limits (one per application
    # in a workload): a decision over 1,000 jobs builds each grid once.
    lo = max(limits.init_batch, limits.min_local * replicas)
    hi = limits.max_batch
    if lo >= hi:
        candidates = [hi]
    else:
        grid = {int(round(lo * (hi / lo) ** (i / 12))) for i in range(13)}
        grid.update(replicas * k for k in (limits.min_local, limits.max_local) if lo <= replicas * k <= hi)
        candidates = sorted(grid)
    atomic, accum = split_batches(limits, replicas, np.array(candidates, dtype=float))
    totals = replicas * atomic * (accum + 1)
    for array in (atomic, accum, totals):
        array.flags.writeable = False
    return _BatchGrid(tuple(candidates), atomic, accum, totals)


class FittedPerformance:
    """A job's performance as its reports say; immutable, so its batch searches are cached."""

    def __init__(self, fitted: ThroughputFit, limits: BatchLimits, grads: GradientStats = NO_GAIN) -> None:
        self.fitted = fitted
        self.limits = limits
        self.grads = grads
        self._best: dict[tuple[int, int], tuple[int, float]] = {}

    @property
    def trusted_gpus(self) -> int:
        """The most GPUs a policy may give the job on this model: :data:`TRUSTED_FACTOR`
        times the most it has run on (one before it has reported)."""
        return max(TRUSTED_FACTOR * self.fitted.max_replicas, 1)

    def extrapolates(self, placement: tuple[int, ...]) -> bool:
        used = [p for p in placement if p]
        return self.fitted.extrapolates(len(used), sum(used))

    def efficiency(self, batch: np.ndarray | float) -> np.ndarray:
        scale = np.asarray(batch, dtype=float) / self.limits.init_batch
        sqr, var = self.grads.sqr, self.grads.var
        return np.asarray((var + sqr) / (var / scale + sqr))

    def _run(self, placement: tuple[int, ...], batch_size: int) -> tuple[float, int]:
        """(seconds per optimiser step, samples per step) at a total ``batch_size``."""
        replicas = sum(placement)
        atomic, accum = split_batch(self.limits, replicas, batch_size)
        step = self.fitted.params.step_s_at(sum(1 for p in placement if p), replicas,
                                            np.array([atomic], dtype=float), np.array([accum], dtype=float))
        return float(step[0]), replicas * atomic * (accum + 1)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self._run(placement, batch_size)[0]

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        step, total = self._run(placement, batch_size)
        return float(self.efficiency(total)) / step

    def batch_candidates(self, replicas: int) -> list[int]:
        """From each replica's minimum to the job's maximum, on a geometric grid."""
        return list(_batch_grid(self.limits, replicas).candidates)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        replicas = sum(placement)
        key = (sum(1 for p in placement if p), replicas)
        if key not in self._best:
            grid = _batch_grid(self.limits, replicas)
            steps = self.fitted.params.step_s_at(key[0], replicas, grid.atomic, grid.accum)
            rates = self.efficiency(grid.totals) / steps
            best = int(np.argmax(rates))
            self._best[key] = (grid.candidates[best], float(rates[best]))
        return self._best[key]
