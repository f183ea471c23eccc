"""A job's throughput, fitted from its own progress reports (the Pollux model).

Every report says how long one optimiser step took at one configuration:
nodes, replicas, the per-replica (atomic) batch and the gradient
accumulation steps. The model Pollux (OSDI '21, section 4.1) fits to such
reports has seven parameters:

- compute, one micro-step's forward and backward pass: ``alpha_c + beta_c * atomic``;
- synchronisation, the all-reduce: nothing on one replica;
  ``alpha_r + beta_r * (replicas - 2)`` within a node;
  ``alpha_n + beta_n * (replicas - 2)`` across nodes;
- ``gamma`` in [1, 10]: how far compute and synchronisation overlap; an
  optimiser step takes ``(compute**gamma + sync**gamma) ** (1/gamma)``
  plus ``accum_steps`` unsynchronised micro-steps.

:func:`fit` finds them by least squares on log step times (scipy's
L-BFGS-B). What the reports cannot tell apart stays at an optimistic
prior, as in Pollux: with no multi-replica report synchronisation costs
nothing, with no multi-node report crossing nodes costs what a node
costs, and with one atomic batch size half the compute time is fixed.
That optimism is what makes a job worth trying on more GPUs; the fit says
where it is guessing (:meth:`ThroughputFit.extrapolates`: beyond twice the
most replicas seen, :attr:`trusted_replicas`); how far a policy acts on the
guess is its own choice (:data:`dlsub.policies.perf_models.fitted_model.TRUSTED_FACTOR`).

Pure: plain values in, a value out; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np
import scipy.optimize

GAMMA_MAX = 10.0
# Lower bounds away from zero keep the log-space objective finite.
FLOOR = 1e-8
# The search stops when a step changes the cost (or the parameters) by less
# than this fraction. scipy's default, 1e-8, took about twice the iterations
# for fits whose error differed in the seventh digit.
TOLERANCE = 1e-6


@dataclass(frozen=True)
class StepReport:
    """One measured optimiser step time at one configuration.

    ``compute_s`` is one unsynchronised micro-step's time, where the job
    measured it (it does when it accumulates gradients); it separates
    compute from synchronisation.
    """

    nodes: int
    replicas: int
    atomic_batch: int
    accum_steps: int
    step_s: float
    compute_s: float | None = None

    @classmethod
    def from_samples_per_s(cls, nodes: int, replicas: int, atomic_batch: int, accum_steps: int,
                           samples_per_s: float) -> StepReport:
        """A report given as throughput: one step processes replicas × atomic × (accum + 1) samples."""
        samples = replicas * atomic_batch * (accum_steps + 1)
        return cls(nodes, replicas, atomic_batch, accum_steps, samples / samples_per_s)


@dataclass(frozen=True)
class ThroughputParams:
    alpha_c: float = 0.1
    beta_c: float = 0.01
    alpha_n: float = 0.1
    beta_n: float = 0.01
    alpha_r: float = 0.1
    beta_r: float = 0.01
    gamma: float = 1.0

    def as_array(self) -> np.ndarray:
        """A fresh (writable) array of the parameters, in field order."""
        return np.array([getattr(self, name) for name in _PARAMS], dtype=float)

    @cached_property
    def _array(self) -> np.ndarray:
        # Built once: the goodput policy evaluates step times thousands of
        # times per decision, and rebuilding the array from the fields each
        # time cost more than the arithmetic.
        values = self.as_array()
        values.flags.writeable = False
        return values

    @classmethod
    def from_array(cls, values: Sequence[float] | np.ndarray) -> ThroughputParams:
        return cls(*(float(v) for v in values))

    def compute_s(self, atomic: np.ndarray | float) -> np.ndarray:
        return np.asarray(self.alpha_c + self.beta_c * np.asarray(atomic, dtype=float))

    def sync_s(self, nodes: np.ndarray | float, replicas: np.ndarray | float) -> np.ndarray:
        return _sync(self._array, np.asarray(nodes, dtype=float), np.asarray(replicas, dtype=float))

    def step_s(self, nodes: np.ndarray | float, replicas: np.ndarray | float, atomic: np.ndarray | float,
               accum_steps: np.ndarray | float) -> np.ndarray:
        """Seconds per optimiser step (vectorised over any of the arguments)."""
        return np.asarray(np.exp(_log_step(self._array, np.asarray(nodes, dtype=float),
                                           np.asarray(replicas, dtype=float), np.asarray(atomic, dtype=float),
                                           np.asarray(accum_steps, dtype=float))))

    def step_s_at(self, nodes: int, replicas: int, atomic: np.ndarray, accum_steps: np.ndarray) -> np.ndarray:
        """:meth:`step_s` at one node and replica count, for many batch splits:
        the same values, without the per-element synchronisation arrays (the
        goodput policy's batch search calls it thousands of times a decision)."""
        return np.asarray(np.exp(_log_step_synced(self._array, _sync_at(self._array, nodes, replicas),
                                                  atomic, accum_steps)))


def step_s_of_many(params: Sequence[ThroughputParams], groups: Sequence[tuple[int, int]], sizes: Sequence[int],
                   atomic: np.ndarray, accum_steps: np.ndarray) -> np.ndarray:
    """:meth:`ThroughputParams.step_s_at` of many jobs at once, for consecutive
    groups of batch splits: group ``i`` at ``groups[i]`` (nodes, replicas)
    with ``sizes[i]`` splits. One row per job."""
    p = np.stack([one._array for one in params]).T[..., None]  # p[i]: a column, one row per job
    sync = np.repeat(np.array([[_sync_at(one._array, nodes, replicas) for nodes, replicas in groups]
                               for one in params]), sizes, axis=1)
    return np.asarray(np.exp(_log_step_synced(p, sync, atomic, accum_steps)))


_PARAMS = tuple(f.name for f in fields(ThroughputParams))

# The prior: Pollux's starting point, before a job has reported anything.
PRIOR = ThroughputParams()


def _sync(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    across = nodes > 1
    alpha = np.where(across, p[2], p[4])
    beta = np.where(across, p[3], p[5])
    sync = alpha + beta * np.maximum(replicas - 2, 0)
    return np.where(replicas > 1, sync, 0.0)


def _sync_at(p: np.ndarray, nodes: int, replicas: int) -> float:
    """:func:`_sync` at one configuration (the same arithmetic, without arrays)."""
    if replicas <= 1:
        return 0.0
    alpha, beta = (p[2], p[3]) if nodes > 1 else (p[4], p[5])
    return float(alpha + beta * max(replicas - 2, 0))


def _log_step(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, atomic: np.ndarray,
              accum: np.ndarray) -> np.ndarray:
    return _log_step_synced(p, _sync(p, nodes, replicas), atomic, accum)


def _log_step_synced(p: np.ndarray, sync: np.ndarray | float, atomic: np.ndarray,
                     accum: np.ndarray) -> np.ndarray:
    compute = p[0] + p[1] * atomic
    gamma = p[6]
    # (c^g + s^g)^(1/g), in logs so that large gamma does not overflow.
    lc = np.log(compute)
    ls = np.log(np.maximum(sync, FLOOR * FLOOR))
    top = np.maximum(lc, ls)
    synced = np.exp(top + np.log(np.exp(gamma * (lc - top)) + np.exp(gamma * (ls - top))) / gamma)
    return np.asarray(np.log(synced + accum * compute))


def _log_step_gradient(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, atomic: np.ndarray,
                       accum: np.ndarray) -> np.ndarray:
    """d :func:`_log_step` / d p: one row per configuration, one column per parameter.

    Given to the least-squares search so that it need not difference the
    model seven times per iteration (which was most of a fit's time)."""
    compute = p[0] + p[1] * atomic
    sync = _sync(p, nodes, replicas)
    gamma = p[6]
    clamped = sync <= FLOOR * FLOOR  # below the floor the step does not move with sync
    held = np.maximum(sync, FLOOR * FLOOR)
    lc, ls = np.log(compute), np.log(held)
    top = np.maximum(lc, ls)
    wc, ws = np.exp(gamma * (lc - top)), np.exp(gamma * (ls - top))
    log_synced = top + np.log(wc + ws) / gamma
    synced = np.exp(log_synced)
    total = synced + accum * compute
    share_c, share_s = wc / (wc + ws), ws / (wc + ws)
    # d synced / d compute, d sync, d gamma for (c^g + s^g)^(1/g).
    by_compute = (synced * share_c / compute + accum) / total
    by_sync = np.where(clamped, 0.0, synced * share_s / held) / total
    by_gamma = synced * (share_c * lc + share_s * ls - log_synced) / gamma / total
    across = (nodes > 1).astype(float)
    within = 1.0 - across
    beyond_two = np.maximum(replicas - 2, 0)
    return np.stack([by_compute, by_compute * atomic,
                     by_sync * across, by_sync * across * beyond_two,
                     by_sync * within, by_sync * within * beyond_two,
                     by_gamma], axis=1)


@dataclass(frozen=True)
class ThroughputFit:
    """Fitted parameters and what they rest on."""

    params: ThroughputParams
    reports: int
    max_replicas: int  # the most replicas any report ran on (0: none yet)
    max_nodes: int
    rmsle: float  # root mean squared log error on the reports (0 with none)

    @property
    def trusted_replicas(self) -> int:
        """Replica counts up to which predictions are trusted: twice the most seen, at least 1."""
        return max(2 * self.max_replicas, 1)

    def extrapolates(self, nodes: int, replicas: int) -> bool:
        """True where a prediction goes beyond what the reports support: more
        than twice the replicas seen, or across nodes when no report did."""
        return replicas > self.trusted_replicas or (nodes > 1 and self.max_nodes <= 1)


def fit(reports: Sequence[StepReport], prior: ThroughputParams = PRIOR) -> ThroughputFit:
    """The Pollux throughput model that best explains ``reports`` (the prior when there are none)."""
    if not reports:
        return ThroughputFit(prior, 0, 0, 0, 0.0)
    nodes = np.array([r.nodes for r in reports], dtype=float)
    replicas = np.array([r.replicas for r in reports], dtype=float)
    atomic = np.array([r.atomic_batch for r in reports], dtype=float)
    accum = np.array([r.accum_steps for r in reports], dtype=float)
    log_step = np.log(np.array([r.step_s for r in reports], dtype=float))
    timed = [i for i, r in enumerate(reports) if r.compute_s is not None]
    log_compute = np.log(np.array([reports[i].compute_s for i in timed], dtype=float))
    timed_atomic = atomic[timed]

    start = prior.as_array()
    lower = np.array([FLOOR] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [GAMMA_MAX])
    # One replica's steps are pure compute: anchor compute's scale on them
    # (or on the reports' smallest step) rather than on the prior's guess.
    single = replicas == 1
    base = np.exp(np.min(log_step[single] - np.log(1 + accum[single]))) if single.any() else \
        float(np.exp(np.min(log_step - np.log(1 + accum))))
    start[0], start[1] = base / 2, base / 2 / max(float(np.mean(atomic)), 1.0)
    pinned: dict[int, float] = {}
    if len(np.unique(atomic)) == 1:
        # One atomic batch size cannot split fixed from per-sample compute:
        # fix half as per-sample, which is optimistic about bigger batches.
        pinned[0] = base / 2
    multi_in_node = (replicas > 1) & (nodes == 1)
    if not (nodes > 1).any():
        pinned[2], pinned[3] = FLOOR, FLOOR  # raised to the in-node cost below
    if not multi_in_node.any():
        pinned[4], pinned[5] = FLOOR, FLOOR
    if not (replicas > 2).any():
        pinned[3], pinned[5] = FLOOR, FLOOR
    if not (replicas > 1).any():
        pinned[6] = 1.0
    for index, value in pinned.items():
        start[index] = lower[index] = upper[index] = value
    for index in range(6):
        if index not in pinned:
            start[index] = max(start[index], 1e-4)
    free = [i for i in range(7) if i not in pinned]
    compute_weight = math.sqrt(len(reports) / len(timed)) if timed else 0.0

    def residuals(x: np.ndarray) -> np.ndarray:
        # Searched in logs: the parameters span orders of magnitude.
        p = start.copy()
        p[free] = np.exp(x)
        parts = [_log_step(p, nodes, replicas, atomic, accum) - log_step]
        if timed:
            parts.append(compute_weight * (np.log(p[0] + p[1] * timed_atomic) - log_compute))
        # A gentle pull towards gamma = 1 and towards no retrogression (Pollux
        # does the same): when the data allow both, prefer the simpler story.
        parts.append(0.01 * np.array([p[6] - 1, p[3] / p[2], p[5] / p[4]]))
        return np.concatenate(parts)

    def jacobian(x: np.ndarray) -> np.ndarray:
        p = start.copy()
        p[free] = np.exp(x)
        rows = [_log_step_gradient(p, nodes, replicas, atomic, accum)]
        if timed:
            timed_rows = np.zeros((len(timed), 7))
            per_compute = compute_weight / (p[0] + p[1] * timed_atomic)
            timed_rows[:, 0], timed_rows[:, 1] = per_compute, per_compute * timed_atomic
            rows.append(timed_rows)
        pull = np.zeros((3, 7))
        pull[0, 6] = 0.01
        pull[1, 2], pull[1, 3] = -0.01 * p[3] / p[2] ** 2, 0.01 / p[2]
        pull[2, 4], pull[2, 5] = -0.01 * p[5] / p[4] ** 2, 0.01 / p[4]
        rows.append(pull)
        # Searched in logs: d/dx = d/dp * p.
        return np.asarray(np.concatenate(rows)[:, free] * p[free])

    if free:
        lo, hi = np.log(lower[free]), np.log(upper[free])
        best: scipy.optimize.OptimizeResult | None = None
        # Overlap (gamma) makes the surface bumpy: start from little and from much.
        for gamma0 in ((1.0, 3.0) if 6 in free else (start[6],)):
            x0 = np.log(np.clip(start[free], lower[free], upper[free]))
            if 6 in free:
                x0[free.index(6)] = math.log(gamma0) + (1e-6 if gamma0 == 1.0 else 0.0)
            x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
            result = scipy.optimize.least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi), x_scale=1.0,
                                                  ftol=TOLERANCE, xtol=TOLERANCE, gtol=TOLERANCE)
            if best is None or result.cost < best.cost:
                best = result
        assert best is not None
        start[free] = np.exp(best.x)
    params = start
    if not (nodes > 1).any():
        # Prior: crossing nodes costs at least what synchronising within one does.
        params[2] = max(params[2], params[4])
        params[3] = max(params[3], params[5])
    residual = _log_step(params, nodes, replicas, atomic, accum) - log_step
    fitted = ThroughputParams.from_array(params)
    fitted._array  # noqa: B018  (built with the fit, once per report, not in the first decision after it)
    return ThroughputFit(
        fitted,
        len(reports),
        int(replicas.max()),
        int(nodes.max()),
        float(math.sqrt(float(np.mean(residual ** 2)))),
    )
