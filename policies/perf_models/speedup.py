"""A job's expected remaining time as a function of its GPU count.

Shared by the policies that weigh one more GPU for one job against
another (optimus, goodput). Uses the job's performance model on a packed
placement (whole nodes first), which is what the placement step aims for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from dlsub.policies.api import JobView, PerformanceModel
from dlsub.policies.perf_models.fitted_model import search_batches
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
# every younger job. The first level is a GPU-hour. goodput ranks jobs of
# unknown length on this guess (who gets a minimum first, whose size is
# given back first) and weights their speed-ups by the service attained in
# the same unit; it no longer grows them on it (see goodput's docstring).
UNKNOWN_WORK_S = 3600.0
LEVEL_BASE = 4


def level_guess(done: float, unit: float, base: int = LEVEL_BASE) -> float:
    """The work left expected of a job that has done ``done``: the largest
    ``unit x base**k`` (k >= 0) not above it, at least ``unit``. A step function of ``done``."""
    level = unit
    while unit > 0 and done >= level * base:
        level *= base
    return level


def timed(job: JobView) -> bool:
    """Whether the job's model has measured a step of it (its own report, or its command's history): only
    then can it turn work into seconds. A fitted model that has seen none times a step by its prior, off by
    up to 10^6 on the Pollux applications (ncf: 65 million seconds for a one-minute job); the oracle's
    knows every step."""
    seen = getattr(getattr(job.model, "fitted", None), "max_replicas", None)
    return not isinstance(seen, int) or seen > 0


def searches_batch(job: JobView, adapt_batch: bool) -> bool:
    """Whether the job's batch size is the best one for each placement (it
    lets the policy choose, or has none of its own) rather than its own."""
    return (adapt_batch and job.adaptive_batch) or job.batch_size is None


def fixed_batch(job: JobView) -> int | None:
    """The batch size a policy that may choose batches judges the job at: None for the best one on each
    placement (the job lets it choose, or has none of its own), else the job's own."""
    return None if searches_batch(job, adapt_batch=True) else job.batch_size


def goodput_at(model: PerformanceModel, placement: tuple[int, ...], batch: int | None) -> float:
    """The model's goodput on ``placement``: at its best batch there (``batch`` None), else at ``batch``."""
    return model.best_batch(placement)[1] if batch is None else model.goodput(placement, batch)


T = TypeVar("T")
#: One decision's results per model: (id of the model, the rest of the key) -> (the model, the result).
ModelMemo = dict[tuple[object, ...], tuple[object, T]]


def per_model(memo: ModelMemo[T] | None, model: object, key: tuple[object, ...], compute: Callable[[], T]) -> T:
    """``compute()``, memoised for one decision in ``memo`` under the model and ``key``: thousands of jobs
    share a few hundred models (one per application and epoch in the simulator). The model is kept beside
    its result so that its id is not reused while the memo lives. Callers must not change the result."""
    full = (id(model), *key)
    found = memo.get(full) if memo is not None else None
    if found is not None and found[0] is model:
        return found[1]
    result = compute()
    if memo is not None:
        memo[full] = (model, result)
    return result


class RemainingTime:
    """``time(n)``: seconds left for ``job`` on ``n`` GPUs; ``batch(n)``: the batch size used.

    With ``adapt_batch`` the batch size is the one with the best goodput on
    that placement (when the job allows it); otherwise the job's own. With
    ``guess_remaining``, a job whose remaining work is unknown (or not yet
    timeable, or that has run past what it declared) is expected to need as much again as it has
    done (at least :data:`UNKNOWN_WORK_S` on one GPU).
    """

    def __init__(self, job: JobView, gpus_per_node: int, *, adapt_batch: bool,
                 guess_remaining: bool = False, trust_declared: float = math.inf) -> None:
        if job.model is None or (job.remaining is None and not guess_remaining):
            raise ValueError(f"job {job.name} has no performance model or remaining work")
        self.job = job
        self.gpus_per_node = gpus_per_node
        self.searches_batch = searches_batch(job, adapt_batch)
        self._cache: dict[int, tuple[float, int | None]] = {}
        self._placed: dict[tuple[int, ...], float] = {}  # time_on, by placement
        # What a user declares is work (steps); it ranks a job only once a measured step time turns it into
        # seconds. Before that, and once the job has run past its declared total (told 0 left, still
        # running: it was wrong by an unknown amount), the job is guessed like one that declared nothing:
        # never ranked on a prior's seconds, nor as all but done.
        self.untimed = job.remaining is not None and not timed(job)
        self.overdue = job.remaining is not None and job.remaining <= 0.0 and job.progress > 0.0
        self.guessed = job.remaining is None or self.untimed or self.overdue
        self.work = job.remaining if job.remaining is not None and not self.guessed else self._guess_work()
        # A declaration may make a job look shorter than the guess, and so served sooner, but only so much
        # longer (``trust_declared`` times the guess): past that, the job is ranked and sized as guessed.
        self.long = not self.guessed and self.work > trust_declared * self._guess_work()
        if self.long:
            self.guessed, self.work = True, self._guess_work()

    @property
    def basis(self) -> str:
        """How the remaining work was known, in words for ``dlsub why``."""
        if self.overdue:
            return "remaining work guessed: past its declared total"
        if self.long:
            return "remaining work guessed: declared longer than the guess trusts"
        if self.untimed:
            return "remaining work guessed: declared, but no step timed yet"
        return "remaining work guessed: none declared" if self.guessed else "remaining work declared"

    def _guess_work(self) -> float:
        return level_guess(self.job.progress, self._rate(1)[1] * UNKNOWN_WORK_S)

    def _rate(self, gpus: int) -> tuple[int | None, float]:
        model, job = self.job.model, self.job
        assert model is not None
        placement = packed_placement(gpus, self.gpus_per_node)
        own = job.batch_size
        if self.searches_batch or own is None:  # (searches_batch covers None; this tells mypy)
            return model.best_batch(placement)
        return own, model.goodput(placement, own)

    def _solve(self, gpus: int) -> tuple[float, int | None]:
        if gpus not in self._cache:
            batch, rate = self._rate(gpus)
            seconds = self.work / rate if rate > 0 else math.inf
            self._cache[gpus] = (seconds, batch)
        return self._cache[gpus]

    def prefetch(self, counts: range) -> None:
        """Search the batch sizes of several GPU counts at once (a fitted
        model does them in one pass, and keeps what it found)."""
        todo = [n for n in counts if n > 0 and n not in self._cache]
        if self.searches_batch and todo:
            search_batches([self.job.model], [packed_placement(n, self.gpus_per_node) for n in todo])

    def time(self, gpus: int) -> float:
        return math.inf if gpus <= 0 else self._solve(gpus)[0]

    def time_on(self, placement: tuple[int, ...]) -> float:
        """Seconds left on ``placement`` (GPUs per node, any order), as :meth:`time` on a packed one: at the
        best batch there, or the job's own. The same as ``time(n)`` where ``placement`` is packed."""
        gpus = sum(placement)
        if gpus <= 0:
            return math.inf
        if len(placement) <= len(packed_placement(gpus, self.gpus_per_node)):
            return self.time(gpus)
        shape = tuple(sorted(placement, reverse=True))
        if shape not in self._placed:
            model, own = self.job.model, self.job.batch_size
            assert model is not None
            rate = model.best_batch(shape)[1] if self.searches_batch or own is None else model.goodput(shape, own)
            self._placed[shape] = self.work / rate if rate > 0 else math.inf
        return self._placed[shape]

    def batch(self, gpus: int) -> int | None:
        return self._solve(gpus)[1] if gpus > 0 else None

    def speedup(self, gpus: int) -> float:
        """How many times faster than on one GPU the job runs on ``gpus`` (0 on none)."""
        one = self.time(1)
        return 0.0 if gpus <= 0 or not 0.0 < one < math.inf else one / self.time(gpus)

    @property
    def service_s(self) -> float:
        """The work the job has done, in seconds of one GPU at its present pace."""
        rate = self._rate(1)[1]
        return self.job.progress / rate if rate > 0 else 0.0

    def saving(self, gpus: int) -> float:
        """Seconds saved by going from ``gpus`` to ``gpus + 1``."""
        return self.time(gpus) - self.time(gpus + 1)
