"""A job's expected remaining time as a function of its GPU count.

Shared by the policies that weigh one more GPU for one job against
another (optimus, goodput). Uses the job's performance model on a packed
placement (whole nodes first), which is what the placement step aims for.
"""

from __future__ import annotations

import math

from dlsub.policies.api import JobView
from dlsub.policies.placement import packed_placement


class RemainingTime:
    """``time(n)``: seconds left for ``job`` on ``n`` GPUs; ``batch(n)``: the batch size used.

    With ``adapt_batch`` the batch size is the one with the best goodput on
    that placement (when the job allows it); otherwise the job's own.
    """

    def __init__(self, job: JobView, gpus_per_node: int, *, adapt_batch: bool) -> None:
        if job.model is None or job.remaining is None:
            raise ValueError(f"job {job.name} has no performance model or remaining work")
        self.job = job
        self.gpus_per_node = gpus_per_node
        self.adapt_batch = adapt_batch and job.adaptive_batch
        self._cache: dict[int, tuple[float, int | None]] = {}

    def _solve(self, gpus: int) -> tuple[float, int | None]:
        if gpus not in self._cache:
            model, job = self.job.model, self.job
            assert model is not None and job.remaining is not None
            placement = packed_placement(gpus, self.gpus_per_node)
            if self.adapt_batch or job.batch_size is None:
                batch, rate = model.best_batch(placement)
            else:
                batch, rate = job.batch_size, model.goodput(placement, job.batch_size)
            seconds = job.remaining / rate if rate > 0 else math.inf
            self._cache[gpus] = (seconds, batch)
        return self._cache[gpus]

    def time(self, gpus: int) -> float:
        return math.inf if gpus <= 0 else self._solve(gpus)[0]

    def batch(self, gpus: int) -> int | None:
        return self._solve(gpus)[1] if gpus > 0 else None

    def saving(self, gpus: int) -> float:
        """Seconds saved by going from ``gpus`` to ``gpus + 1``."""
        return self.time(gpus) - self.time(gpus + 1)
