"""Workloads of our own at any load, built as the Pollux paper built its own (OSDI '21, section 5.1).

The paper samples jobs from Microsoft's Philly trace and gives each one of
its six applications of the same size class, by the job's GPU-time: Small
(under 1 GPU-hour: cifar10, ncf), Medium (1-10: bert, deepspeech2), Large
(10-100: yolov3), XLarge (100 and over: imagenet); within a class the
application is drawn uniformly. Arrivals keep the trace job's time of day
within the paper's 8-hour window; 1.0x load is 160 jobs in it, and a load
scales the number of jobs sampled from the same window (0.5x: 80, 2.0x:
320). Read off the artifact's own workloads, which this reproduces: their
arrivals follow, half-hour by half-hour, the trace's submissions between
02:00 and 10:00 of every day (the window), and their classes come in the
trace's proportions there (Small 80%, Medium 14%, Large 4%, XLarge 2%).
Each row's ``num_replicas`` and ``batch_size`` (what fixed-size baselines
run) is drawn uniformly from the settings the artifact's workloads give
that application.

What a user states about a job's length (``stated_epochs``, see
:mod:`dlsub.sim.workload`) is its application's epochs times a
factor drawn log-uniformly in ``[1/error, error]``, and blank for a
``missing`` share of the jobs: the column a policy that weighs remaining
work is tested against. A job still trains its application's epochs.

Pure but for :func:`read_philly`; seeded, so one seed is one workload.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dlsub.sim.apps import EPOCHS
from dlsub.sim.workload import WorkloadError, WorkloadJob

JOBS_AT_FULL_LOAD = 160
WINDOW_START_H = 2
WINDOW_H = 8
# Upper bound of each class in GPU-hours, and its applications.
CLASSES: tuple[tuple[float, tuple[str, ...]], ...] = (
    (1.0, ("cifar10", "ncf")),
    (10.0, ("bert", "deepspeech2")),
    (100.0, ("yolov3",)),
    (math.inf, ("imagenet",)),
)
# (num_replicas, batch_size) the artifact's workloads give each application.
TUNED: dict[str, tuple[tuple[int, int], ...]] = {
    "bert": ((6, 384), (8, 384), (12, 384), (16, 384)),
    "cifar10": ((6, 2048), (8, 2048), (12, 4096), (16, 4096)),
    "deepspeech2": ((6, 320), (8, 320), (12, 640)),
    "imagenet": ((24, 3200), (32, 6400), (48, 6400)),
    "ncf": ((1, 32768),),
    "yolov3": ((4, 64),),
}


@dataclass(frozen=True)
class TraceJob:
    """A Philly job in the window: seconds after the window opened that day, and its GPU-time in seconds."""

    offset_s: int
    gpu_s: float


@dataclass(frozen=True)
class Statements:
    """What users state of their jobs' lengths: ``missing`` share blank, the rest off by up to ``error`` times."""

    missing: float = 0.5
    error: float = 2.0


def read_philly(path: Path) -> list[TraceJob]:
    """The trace's jobs submitted inside the window (any day)."""
    jobs = []
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                when = datetime.fromisoformat(row["timestamp"])
                offset = (when.hour - WINDOW_START_H) * 3600 + when.minute * 60 + when.second
                if 0 <= offset < WINDOW_H * 3600:
                    jobs.append(TraceJob(offset, float(row["gpu_time"])))
    except (OSError, KeyError, ValueError) as exc:
        raise WorkloadError(f"cannot read the Philly trace {path}: {exc}") from None
    if not jobs:
        raise WorkloadError(f"{path}: no job submitted between {WINDOW_START_H:02d}:00 and "
                            f"{WINDOW_START_H + WINDOW_H:02d}:00")
    return jobs


def application_for(gpu_s: float, rng: random.Random) -> str:
    hours = gpu_s / 3600.0
    for bound, apps in CLASSES:
        if hours < bound:
            return rng.choice(apps)
    raise AssertionError("the last class has no bound")


def stated_epochs(app: str, statements: Statements, rng: random.Random) -> float | None:
    # Both draws are made for every job, so the missing share does not shift the errors of the rest.
    blank = rng.random() < statements.missing
    factor = math.exp(rng.uniform(-1.0, 1.0) * math.log(max(statements.error, 1.0)))
    return None if blank else round(EPOCHS[app] * factor, 2)


def generate(trace: list[TraceJob], load: float, seed: int,
             statements: Statements | None = Statements()) -> list[WorkloadJob]:
    """``round(160 x load)`` jobs sampled from ``trace`` without replacement, in arrival order.
    ``statements`` None: no stated lengths at all (the column stays blank)."""
    count = round(JOBS_AT_FULL_LOAD * load)
    if not 0 < count <= len(trace):
        raise WorkloadError(f"load {load:g}: {count} jobs; the window has {len(trace)}")
    rng = random.Random(seed)
    # Statements draw from their own stream: with or without them, a seed gives the same jobs.
    told = random.Random(f"stated-{seed}")
    picked = sorted(rng.sample(trace, count), key=lambda job: job.offset_s)
    jobs = []
    for index, job in enumerate(picked):
        app = application_for(job.gpu_s, rng)
        replicas, batch = rng.choice(TUNED[app])
        stated = stated_epochs(app, statements, told) if statements is not None else None
        jobs.append(WorkloadJob(f"{app}-{index}", float(job.offset_s), app, replicas, batch,
                                stated_epochs=stated))
    return jobs
