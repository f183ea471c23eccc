"""What ``dlsub estimate`` predicts from its profiling runs (pure: measurements in, numbers out).

A profiling run trains a few dozen steps at one batch size on one
partition and stops by itself (``DLSUB_PROFILE_STEPS``). From its progress
and attempt records come a :class:`ProfileRun`: the steady-state step time
(warm-up steps left out, the median over windows of an epoch's steps,
so a burst of contention or one late report does not skew it but a
checkpoint at each epoch's end counts), the peak memory, the
steps an epoch has, and the fixed cost of an attempt (container start,
imports, data loading, and the end of the attempt), measured apart from the
steps so that a short profile still predicts a long run.

Across batch sizes, per partition: memory and step time are fitted as
lines in the batch size (a fixed part, the model and the runtime, plus a
part per sample), so batch sizes that were not run get predictions too.
Walltime is steps × step time plus, for each attempt the partition's
MaxTime forces, the attempt's fixed cost and the restart overhead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlsub.contract import valid_gpu_type

#: Reports at or below this share of a profile's steps are warm-up (first
#: iterations allocate, JIT and fill caches); at least the first report is dropped.
WARMUP_SHARE = 0.2


class FitError(ValueError):
    """A profile too thin to fit; the message says what was missing."""


@dataclass(frozen=True)
class ProfileRun:
    """One profiling run: one partition, one global batch size."""

    partition: str
    batch_size: int
    step_s: float  # steady-state seconds per step
    memory_mb: float  # peak resident memory of one training process
    steps_per_epoch: int | None
    startup_s: float  # attempt start to the first step's report
    teardown_s: float  # last report to the attempt's end
    steps: int  # steps the profile ran
    cuda_memory_mb: float | None = None
    losses: tuple[tuple[int, float], ...] = ()  # (step, loss), for a --target-loss horizon
    declared_epochs: int | None = None  # the script's own init(total_epochs=)
    # The kind of GPU it ran on (its attempt's start record, else the kind its job asked Slurm for); None:
    # untyped GPUs, or none.
    gpu_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"partition": self.partition, "batch_size": self.batch_size, "step_s": self.step_s,
               "memory_mb": self.memory_mb, "steps_per_epoch": self.steps_per_epoch,
               "startup_s": self.startup_s, "teardown_s": self.teardown_s, "steps": self.steps,
               "cuda_memory_mb": self.cuda_memory_mb, "losses": [list(p) for p in self.losses],
               "declared_epochs": self.declared_epochs}
        if self.gpu_type is not None:  # untyped profiles keep the shape they had
            out["gpu_type"] = self.gpu_type
        return out

    @property
    def run_s(self) -> float:
        """About how long the profiling job ran: its start-up, its steps and its end."""
        return self.startup_s + self.steps * self.step_s + self.teardown_s

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ProfileRun:
        return cls(str(raw["partition"]), int(raw["batch_size"]), float(raw["step_s"]), float(raw["memory_mb"]),
                   None if raw.get("steps_per_epoch") is None else int(raw["steps_per_epoch"]),
                   float(raw["startup_s"]), float(raw["teardown_s"]), int(raw["steps"]),
                   None if raw.get("cuda_memory_mb") is None else float(raw["cuda_memory_mb"]),
                   tuple((int(s), float(v)) for s, v in raw.get("losses") or ()),
                   None if raw.get("declared_epochs") is None else int(raw["declared_epochs"]),
                   valid_gpu_type(raw.get("gpu_type")))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def steady_step_time(points: Sequence[tuple[int, float]], period: int | None = None) -> float:
    """Seconds per step from (step, time) reports, warm-up left out.

    The median of the step times over windows of at least ``period`` steps
    (the steps of an epoch), one window from each report: a burst of
    contention from a neighbour on a shared node (or one slow report)
    moves a mean or a least-squares slope, not the median, while a cost
    the training pays once an epoch (an evaluation pass, a checkpoint at
    the epoch's end) lies in every window and so stays in the step time.
    With windows of single report intervals such a cost fell in a minority
    of them and the median dropped it. When the profile's steady part is
    shorter than a period, that cost cannot be seen; the windows are then
    the report intervals.
    """
    ordered = sorted({s: t for s, t in points}.items())
    if len(ordered) < 2:
        raise FitError("the profiling run reported progress fewer than twice; it needs more steps")
    last_step = ordered[-1][0]
    steady = [(s, t) for s, t in ordered[1:] if s > WARMUP_SHARE * last_step]
    if len(steady) < 2:
        steady = ordered[-2:]
    per_step = _window_step_times(steady, max(1, period or 1)) or _window_step_times(steady, 1)
    slope = float(statistics.median(per_step))
    if not math.isfinite(slope) or slope <= 0:
        raise FitError("the profiling run's step times do not increase with its steps")
    return slope


def _window_step_times(points: Sequence[tuple[int, float]], span: int) -> list[float]:
    """Seconds per step from each report to the first later report at least ``span`` steps on."""
    times: list[float] = []
    for i, (s0, t0) in enumerate(points):
        later = next(((s, t) for s, t in points[i + 1:] if s - s0 >= span), None)
        if later is None:
            break  # the reports after this one are closer to the end still
        times.append((later[1] - t0) / (later[0] - s0))
    return times


def profile_from_events(partition: str, batch_size: int, progress: Sequence[dict[str, Any]],
                        attempts: Sequence[dict[str, Any]]) -> ProfileRun:
    """A :class:`ProfileRun` from a profiling job's ``progress.jsonl`` and ``attempts.jsonl`` records."""
    reports = [e for e in progress if e.get("event") == "progress"
               and _num(e.get("step")) is not None and _num(e.get("time")) is not None]
    if not reports:
        raise FitError("the profiling run reported no progress: does the script call run.report(step=...)?")
    points = [(int(e["step"]), float(e["time"])) for e in reports]
    spe = [int(v) for e in reports if (v := _num(e.get("steps_per_epoch"))) is not None and v >= 1]
    if not spe:
        # A fractional epoch says it too: steps / epochs.
        spe = [round(float(e["step"]) / float(e["epoch"])) for e in reports
               if (_num(e.get("epoch")) or 0) > 0 and float(e["epoch"]) != int(float(e["epoch"]))]
    step_s = steady_step_time(points, period=spe[-1] if spe else None)
    memory = max((_num(e.get("peak_rss_mb")) or 0.0 for e in progress), default=0.0)
    cuda = [c for e in progress if (c := _num(e.get("cuda_peak_mb"))) is not None]
    starts = [float(a["time"]) for a in attempts if a.get("event") == "start" and _num(a.get("time")) is not None]
    ends = [float(a["time"]) for a in attempts if a.get("event") == "end" and _num(a.get("time")) is not None]
    first_step, first_time = min(points)
    last_time = max(t for _, t in points)
    # Attempt start -> first report, less the steps done by then at the steady rate.
    startup = (first_time - starts[0] - first_step * step_s) if starts else 0.0
    teardown = (ends[-1] - last_time) if ends else 0.0
    losses = tuple((int(e["step"]), float(e["loss"])) for e in reports if _num(e.get("loss")) is not None)
    declared = [int(v) for e in reports if (v := _num(e.get("total_epochs"))) is not None and v >= 1]
    kinds = {k for a in attempts if a.get("event") == "start" for k in str(a.get("gpu_type") or "").split(",") if k}
    if len(kinds) > 1:
        raise FitError(f"it ran on GPUs of several kinds ({', '.join(sorted(kinds))}); profile one kind at a time")
    return ProfileRun(partition, batch_size, step_s, memory, spe[-1] if spe else None, max(0.0, startup),
                   max(0.0, teardown), max(s for s, _ in points), max(cuda) if cuda else None, losses,
                   declared[-1] if declared else None, valid_gpu_type(kinds.pop()) if kinds else None)


@dataclass(frozen=True)
class Line:
    """``value(bs) = fixed + per_sample × bs``, from a least-squares fit."""

    fixed: float
    per_sample: float

    def __call__(self, batch_size: float) -> float:
        return self.fixed + self.per_sample * batch_size


def fit_line(batch_sizes: Sequence[float], values: Sequence[float], *, through_origin_if_single: bool) -> Line:
    """A line through (batch size, value); never a negative per-sample part.

    One point: proportional to the batch size (step time) or constant
    (memory), as ``through_origin_if_single`` says.
    """
    if not batch_sizes or len(batch_sizes) != len(values):
        raise FitError("no profiles to fit")
    # NumPy here, not at the top: `dlsub submit` and `dlsub status` import this module (through the CLI's
    # --from-estimate) and NumPy's import was 150 ms of the 350 ms every dlsub command spent importing.
    import numpy as np

    xs, ys = np.asarray(batch_sizes, dtype=float), np.asarray(values, dtype=float)
    if len(set(xs.tolist())) == 1:
        mean = float(ys.mean())
        return Line(0.0, mean / float(xs[0])) if through_origin_if_single else Line(mean, 0.0)
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope < 0:  # noise on a flat curve: a constant is the honest fit
        return Line(float(ys.mean()), 0.0)
    if intercept < 0 and through_origin_if_single:
        # Step time cannot go below zero for small batches: fit through the origin instead.
        return Line(0.0, float((xs @ ys) / (xs @ xs)))
    return Line(float(intercept), float(slope))


@dataclass(frozen=True)
class PartitionFit:
    """Per-partition predictions at any batch size, from that partition's profiles."""

    partition: str
    step_s: Line
    memory_mb: Line
    samples_per_epoch: float | None
    startup_s: float
    teardown_s: float
    measured: dict[int, ProfileRun]

    def step_time(self, batch_size: int) -> float:
        if batch_size in self.measured:
            return self.measured[batch_size].step_s
        return max(1e-6, self.step_s(batch_size))

    def memory(self, batch_size: int) -> float:
        if batch_size in self.measured:
            return self.measured[batch_size].memory_mb
        return max(1.0, self.memory_mb(batch_size))

    def steps_per_epoch(self, batch_size: int) -> int | None:
        known = self.measured.get(batch_size)
        if known is not None and known.steps_per_epoch:
            return known.steps_per_epoch
        if self.samples_per_epoch is None:
            return None
        return max(1, int(self.samples_per_epoch // batch_size))

    @property
    def attempt_overhead_s(self) -> float:
        return self.startup_s + self.teardown_s


def fit_partition(profiles: Sequence[ProfileRun]) -> PartitionFit:
    """Fit one partition's profiles (at least one)."""
    if not profiles:
        raise FitError("no profiles to fit")
    names = {p.partition for p in profiles}
    if len(names) != 1:
        raise FitError(f"profiles of several partitions ({', '.join(sorted(names))}) fitted together")
    kinds = {p.gpu_type for p in profiles}
    if len(kinds) != 1:
        # One kind's step times never stand for another's.
        raise FitError(f"profiles of several GPU types ({', '.join(sorted(k or 'untyped' for k in kinds))}) "
                       "fitted together")
    sizes = [p.batch_size for p in profiles]
    epochs = [p.steps_per_epoch * p.batch_size for p in profiles if p.steps_per_epoch]
    return PartitionFit(
        partition=profiles[0].partition,
        step_s=fit_line(sizes, [p.step_s for p in profiles], through_origin_if_single=True),
        memory_mb=fit_line(sizes, [p.memory_mb for p in profiles], through_origin_if_single=False),
        # Samples an epoch covers (a partial last batch dropped): the most any profile saw.
        samples_per_epoch=float(max(epochs)) if epochs else None,
        startup_s=float(statistics.median([p.startup_s for p in profiles])),
        teardown_s=float(statistics.median([p.teardown_s for p in profiles])),
        measured={p.batch_size: p for p in profiles},
    )


@dataclass(frozen=True)
class Walltime:
    seconds: float
    attempts: int  # 1 + continuations the time limit forces


def walltime(train_s: float, overhead_s: float, max_time_s: float | None, *, restart_s: float = 0.0,
             grace_s: float = 0.0) -> Walltime:
    """Steps' time plus each attempt's fixed cost; a MaxTime forces continuations, each adding ``restart_s``.

    Each attempt can train for MaxTime less its fixed cost and the
    checkpoint grace before the limit. None for MaxTime: one attempt.
    """
    if train_s < 0 or overhead_s < 0:
        raise ValueError("times must not be negative")
    if max_time_s is None:
        return Walltime(train_s + overhead_s, 1)
    usable = max_time_s - overhead_s - grace_s
    if usable <= 0:
        return Walltime(math.inf, 0)  # no attempt fits in the partition's MaxTime
    attempts = max(1, math.ceil(train_s / usable))
    return Walltime(train_s + attempts * overhead_s + (attempts - 1) * restart_s, attempts)


def node_hours(seconds: float, nodes: int = 1) -> float:
    return seconds / 3600.0 * nodes


def cost(seconds: float, nodes: int, cost_per_node_hour: float) -> float:
    """What a run costs at the partition's price: node-hours × ``cost_per_node_hour``."""
    return node_hours(seconds, nodes) * cost_per_node_hour
