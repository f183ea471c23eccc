"""The arithmetic of comparing two policies over arrival orders: average JCT, p99 JCT and GPU-hours per job.

A lead in average JCT bought with GPU-hours is no lead on a site that pays for them (issue 54), so every
comparison the benchmarks print (``benchmarks/goodput_vs_pollux.py``, ``benchmarks/goodput_vs_sia.py``)
gives the three figures side by side, each with the same interval: per arrival order, the mean over the
workloads of one policy's figure over the other's on the same jobs; then the mean of those over orders and
its 95% interval (Student's t). The claim sentence names the JCT ratio and the GPU-hours ratio together.

Pure: rows in, numbers and sentences out (the benchmarks run the simulations and read their raw files).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

# A run's figures, as SimResult.summary() names them, and how the benchmarks label them.
METRICS: dict[str, str] = {"avg_jct_s": "avg JCT", "p99_jct_s": "p99 JCT", "gpu_h_per_job": "GPU-h/job"}
# Looks a run up by (workload, arrival order); None where it has not run.
Lookup = Callable[[int, int], Mapping[str, float] | None]


@dataclass(frozen=True)
class Estimate:
    """A mean over arrival orders and its 95% interval (NaN bounds with one order: no interval)."""

    mean: float
    lo: float
    hi: float

    @property
    def shown(self) -> bool:
        return not math.isnan(self.lo)

    def text(self, digits: int = 3) -> str:
        if not self.shown:
            return f"{self.mean:.{digits}f} (one order, no interval)"
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def interval(values: Sequence[float]) -> Estimate:
    """Mean and 95% interval of the mean (Student's t); one value: no interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, math.nan, math.nan)
    half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, mean - half, mean + half)


def per_order(ours: Lookup, base: Lookup | None, metric: str, workloads: Sequence[int],
              orders: Sequence[int]) -> list[float]:
    """Per arrival order, the mean over ``workloads`` of our run's ``metric`` (over the baseline's on the same
    workload and order, when ``base`` is given). A workload either side has not run is left out of its order;
    an order with none is left out."""
    out = []
    for order in orders:
        values = []
        for w in workloads:
            a = ours(w, order)
            b = base(w, order) if base is not None else None
            if a is None or (base is not None and b is None):
                continue
            values.append(float(a[metric]) / float(b[metric]) if b is not None else float(a[metric]))
        if values:
            out.append(statistics.fmean(values))
    return out


def figures(ours: Lookup, base: Lookup | None, workloads: Sequence[int], orders: Sequence[int]) -> dict[str, Estimate]:
    """Every metric of :data:`METRICS`, as :func:`per_order` computes it, with its interval over orders."""
    return {metric: interval(values) for metric in METRICS
            if (values := per_order(ours, base, metric, workloads, orders))}


def verdict(ratio: Estimate, null: float = 1.0) -> str:
    """Where the interval lies against ``null`` (1: the two policies alike)."""
    if not ratio.shown:
        return "no interval (one order)"
    if ratio.hi < null:
        return f"below {null:g}"
    if ratio.lo > null:
        return f"above {null:g}"
    return f"holds {null:g}"


def goal_met(jct: Estimate, gpu_h: Estimate, goal: float) -> str:
    """Issue 54's goal on one comparison: average JCT at most ``goal`` times the baseline's at no more GPU-hours
    per job. "met" only when both intervals show it (JCT's upper bound at most ``goal``, GPU-hours' at most 1);
    "not met" when either shows the opposite; else "not shown either way"."""
    if not (jct.shown and gpu_h.shown):
        return "not shown either way (one order)"
    if jct.hi <= goal and gpu_h.hi <= 1.0:
        return "met"
    if jct.lo > goal or gpu_h.lo > 1.0:
        return "not met"
    return "not shown either way"


def claim(policy: str, base: str, ratios: Mapping[str, Estimate], goal: float, where: str) -> str:
    """One sentence with the JCT and GPU-hours ratios and their intervals, and whether the goal is met."""
    jct, gpu_h = ratios["avg_jct_s"], ratios["gpu_h_per_job"]

    def side(ratio: Estimate) -> str:
        where_ = verdict(ratio)
        if where_ == "below 1":
            return f"{1 - ratio.mean:.0%} less"
        if where_ == "above 1":
            return f"{ratio.mean - 1:.0%} more"
        return "not shown to differ"

    return (f"Claim: {where}, {policy}'s average JCT is {jct.text()} x {base}'s ({side(jct)}) at {gpu_h.text()} x "
            f"its GPU-hours per job ({side(gpu_h)}); the goal of <= {goal:.2f}x at no more GPU-hours is "
            f"{goal_met(jct, gpu_h, goal)}.")


def table(rows: Mapping[str, Mapping[str, Estimate]]) -> list[str]:
    """Lines: each policy's figures (mean over orders [95% interval]), hours for the JCTs."""
    out = [f"{'policy':>10} {'avg JCT h':>24} {'p99 JCT h':>24} {'GPU-h/job':>24}"]
    for name, est in rows.items():
        cells = []
        for metric in METRICS:
            e = est.get(metric)
            scale = 3600.0 if metric.endswith("_s") else 1.0
            cells.append("-" if e is None else Estimate(e.mean / scale, e.lo / scale, e.hi / scale).text())
        out.append(f"{name:>10} " + " ".join(f"{c:>24}" for c in cells))
    return out
