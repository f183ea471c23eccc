"""What the simulator tells a policy about a job: its application's measured
performance at the job's current epoch (the model a job would have
profiled by then), as a :class:`dlsub.policies.api.PerformanceModel`."""

from __future__ import annotations

import functools

import numpy as np

from dlsub.sim.apps import Application, normalise


class AppPerformance:
    """One application at one epoch; shared by every job of that application and epoch."""

    def __init__(self, app: Application, epoch: int, max_batch_size: int | None = None) -> None:
        self.app = app
        self.epoch = epoch
        self.max_batch_size = max_batch_size or app.max_batch_size
        self._best: dict[tuple[int, ...], tuple[int, float]] = {}

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return self.app.step_time(placement, self.app.batch_config(sum(placement), batch_size))

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        config = self.app.batch_config(sum(placement), batch_size)
        return self.app.goodput(placement, config, self.epoch)

    def batch_candidates(self, replicas: int) -> list[int]:
        """Batch sizes worth trying on ``replicas`` (:func:`batch_candidates`)."""
        return batch_candidates(self.app, self.max_batch_size, replicas)

    def batch_capped(self, cap: int, replicas: int) -> AppPerformance:
        """This model with its batch search on ``replicas`` ending at ``cap`` (at the replicas' least
        batch where that exceeds ``cap``): itself when ``cap`` does not bind."""
        app = self.app
        top = max(cap, app.init_batch_size, app.min_local_bsz * replicas)
        return self if top >= self.max_batch_size else performance_at(app, self.epoch, top)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        key = tuple(sorted(placement))
        if key not in self._best:
            candidates, totals, steps = search_grid(self.app, self.max_batch_size, normalise(placement))
            rates = self.app.efficiencies(totals, self.epoch) / steps
            best = int(np.argmax(rates))
            self._best[key] = (candidates[best], float(rates[best]))
        return self._best[key]


def batch_candidates(app: Application, max_batch_size: int, replicas: int) -> list[int]:
    """Batch sizes worth trying on ``replicas``: from each replica's minimum up to ``max_batch_size``, on a
    geometric grid plus the measured sizes, so that a search is a few dozen evaluations."""
    lo = max(app.init_batch_size, app.min_local_bsz * replicas)
    hi = max_batch_size
    if lo >= hi:
        return [hi]
    steps = 12
    grid = {int(round(lo * (hi / lo) ** (i / steps))) for i in range(steps + 1)}
    grid.update(int(b) for b in app.batch_sizes if lo <= b <= hi)
    # Multiples of the replica count split evenly.
    grid.update(replicas * k for k in (app.min_local_bsz, app.max_local_bsz) if lo <= replicas * k <= hi)
    return sorted(grid)


@functools.lru_cache(maxsize=1 << 16)
def search_grid(app: Application, max_batch_size: int,
                placement: tuple[int, ...]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The batch search's candidates on ``placement`` (normalised), their total batch sizes and their step
    times: the same at every epoch of the application (only the statistical efficiency changes with the
    epoch), so computed once for all of them, not again at each epoch a job reaches in a replay."""
    replicas = sum(placement)
    candidates = batch_candidates(app, max_batch_size, replicas)
    configs = [app.batch_config(replicas, batch) for batch in candidates]
    totals = np.array([config.total(replicas) for config in configs], dtype=float)
    steps = np.array([app.step_time(placement, config) for config in configs])
    return candidates, totals, steps


@functools.lru_cache(maxsize=4096)
def performance_at(app: Application, epoch: int, max_batch_size: int | None = None) -> AppPerformance:
    return AppPerformance(app, epoch, max_batch_size)
