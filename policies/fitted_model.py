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


class FittedPerformance:
    """A job's performance as its reports say; immutable, so its batch searches are cached."""

    def __init__(self, fitted: ThroughputFit, limits: BatchLimits, grads: GradientStats = NO_GAIN) -> None:
        self.fitted = fitted
        self.limits = limits
        self.grads = grads
        self._best: dict[tuple[int, int], tuple[int, float]] = {}

    @property
    def trusted_gpus(self) -> int:
        """The most GPUs the reports support a prediction for (twice the most seen)."""
        return self.fitted.trusted_replicas

    def extrapolates(self, placement: tuple[int, ...]) -> bool:
        used = [p for p in placement if p]
        return self.fitted.extrapolates(len(used), sum(used))

    def efficiency(self, batch: np.ndarray | float) -> np.ndarray:
        scale = np.asarray(batch, dtype=float) / self.limits.init_batch
        sqr, var = self.grads.sqr, self.grads.var
        return np.asarray((var + sqr) / (var / scale + sqr))

    def _configs(self, placement: tuple[int, ...], batches: list[int]) -> tuple[np.ndarray, ...]:
        replicas = sum(placement)
        nodes = sum(1 for p in placement if p)
        splits = [split_batch(self.limits, replicas, b) for b in batches]
        atomic = np.array([s[0] for s in splits], dtype=float)
        accum = np.array([s[1] for s in splits], dtype=float)
        steps = self.fitted.params.step_s(nodes, replicas, atomic, accum)
        totals = replicas * atomic * (accum + 1)
        return steps, totals

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(self._configs(placement, [batch_size])[0][0])

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        steps, totals = self._configs(placement, [batch_size])
        return float(self.efficiency(totals)[0] / steps[0])

    def batch_candidates(self, replicas: int) -> list[int]:
        """From each replica's minimum to the job's maximum, on a geometric grid."""
        lim = self.limits
        lo = max(lim.init_batch, lim.min_local * replicas)
        hi = lim.max_batch
        if lo >= hi:
            return [hi]
        grid = {int(round(lo * (hi / lo) ** (i / 12))) for i in range(13)}
        grid.update(replicas * k for k in (lim.min_local, lim.max_local) if lo <= replicas * k <= hi)
        return sorted(grid)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        replicas = sum(placement)
        key = (sum(1 for p in placement if p), replicas)
        if key not in self._best:
            candidates = self.batch_candidates(replicas)
            steps, totals = self._configs(placement, candidates)
            rates = self.efficiency(totals) / steps
            best = int(np.argmax(rates))
            self._best[key] = (candidates[best], float(rates[best]))
        return self._best[key]
