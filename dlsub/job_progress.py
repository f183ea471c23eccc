"""What a job's progress and attempt events sum up to: its progress, its measured rates, its attempts.

The agent folds each tick's new lines (read and checked by :mod:`dlsub.jobdir`) into a
:class:`ProgressSummary` and an :class:`AttemptsSummary` it keeps in its store; ``dlsub status``,
the dashboard and the estimator read whole files with the readers at the end.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsub.contract import (
    ACTION_REQUEUE,
    ACTION_SUPERSEDED,
    APPLICATION_FIELD,
    ATTEMPTS_FILE,
    EVENT_CHECKPOINT,
    EVENT_END,
    EVENT_FINISHED,
    EVENT_POLLS,
    EVENT_PROGRESS,
    EVENT_START,
    PROGRESS_FILE,
    SAVES_ON_REQUEST,
    SIZE_EVENTS,
    valid_application,
    valid_gpu_type,
)
from dlsub.jobdir import (
    Unreadable,
    check_attempt_event,
    check_progress_event,
    open_dir,
    parse_line,
    read_new_lines,
)

#: Reports of the current attempt the step rate is measured over.
RATE_WINDOW = 20
#: Configurations (size and batch) whose measured rates a job's summary keeps, newest last.
MAX_CONFIGS = 32


@dataclass(frozen=True)
class MeasuredConfig:
    """The rates a job measured on ``nodes`` nodes with ``replicas`` processes at one batch (None: not said)."""

    nodes: int
    replicas: int
    batch: int | None
    accumulation_steps: int | None  # micro-steps per optimiser step
    steps_per_s: float
    samples_per_s: float | None
    gpu_type: str | None = None  # the kind of GPU it ran on, as its start event said (None: untyped or CPU)


def measured_sizes(configs: Iterable[MeasuredConfig]) -> dict[tuple[int, int], tuple[float, float | None]]:
    """(nodes, replicas) -> (steps/s, samples/s or None) of ``configs``, the newest at each size (the last)."""
    return {(c.nodes, c.replicas): (c.steps_per_s, c.samples_per_s) for c in configs}


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    epoch: float | None = None
    loss: float | None = None
    samples: int | None = None
    total_steps: int | None = None
    total_epochs: int | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    last_time: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    finished: bool = False
    checkpoints: int = 0  # checkpoint events seen, with a step or not (``run.save(state)``)
    first_time: float | None = None  # the first event seen (the job's own clock)
    latest_time: float | None = None  # the newest event of any kind (a checkpoint, say)
    configs: tuple[MeasuredConfig, ...] = ()  # what the job measured at each size and batch it has run
    batch_limits: dict[str, int] | None = None  # declared when it lets dlsub choose its batch size
    grads: tuple[float, float] | None = None  # its last gradient noise report (grad_sqr, grad_var)
    application: str | None = None  # its command's digest (contract.application_digest), as it said
    gpu_type: str | None = None  # the kind of GPU it trains on now, as its latest start event said
    # Its training's (re)starts seen: every attempt, and every re-forming of an elastic group, writes one.
    starts: int = 0

    @property
    def restarts(self) -> int:
        """Times its training restarted after its first start (a resize, a move, a requeue): what the
        simulator counts for the policies as re-allocations (pollux's restart factor; goodput across kinds
        counts them against moving the job again)."""
        return max(self.starts - 1, 0)

    @property
    def configs_here(self) -> tuple[MeasuredConfig, ...]:
        """What it measured on the kind of GPU it trains on now: a job's speed on another kind says nothing of
        its speed on this one."""
        return tuple(c for c in self.configs if c.gpu_type == self.gpu_type)

    @property
    def measured(self) -> dict[tuple[int, int], tuple[float, float | None]]:
        """(nodes, replicas) -> (steps/s, samples/s or None), the newest measurement at each size, on the kind
        of GPU it trains on now."""
        return measured_sizes(self.configs_here)

    @property
    def measured_by_type(self) -> dict[str, dict[tuple[int, int], tuple[float, float | None]]]:
        """Per kind of GPU it has run on (as its start events named it), (nodes, replicas) -> (steps/s,
        samples/s or None), the newest measurement at each size; what it measured on untyped GPUs is left
        out (it says nothing of one kind)."""
        out: dict[str, dict[tuple[int, int], tuple[float, float | None]]] = {}
        for c in self.configs:
            if c.gpu_type:
                out.setdefault(c.gpu_type, {})[(c.nodes, c.replicas)] = (c.steps_per_s, c.samples_per_s)
        return out

    def eta_s(self) -> float | None:
        if self.finished:
            return 0.0
        if self.total_steps is not None and self.step is not None and self.steps_per_s:
            return max(0.0, (self.total_steps - self.step) / self.steps_per_s)
        return None

    @property
    def ran_s(self) -> float | None:
        """How long the job has run by its own events (reports or, without them, checkpoints), on its own clock."""
        latest = self.latest_time if self.latest_time is not None else self.last_time
        if self.first_time is None or latest is None:
            return None
        return max(0.0, latest - self.first_time)


def _rate(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    if a.get(key) is None or b.get(key) is None:
        return None
    dt = float(b["time"]) - float(a["time"])
    if dt <= 0:
        return None
    rate = (float(b[key]) - float(a[key])) / dt
    return rate if rate > 0 and math.isfinite(rate) else None


@dataclass
class ProgressSummary:
    """A progress file folded event by event, so the agent never re-reads what it has read."""

    last: dict[str, Any] | None = None  # the last progress report
    window: list[dict[str, Any]] = field(default_factory=list)  # recent reports of the last one's attempt
    checkpoints: int = 0
    checkpoint_step: int | None = None
    checkpoint_time: float | None = None
    finished: bool = False
    first_time: float | None = None
    latest_time: float | None = None
    bad_events: int = 0
    # The size the job runs at since its last start (an elastic group re-forms with a new start event),
    # the batch it runs there, and that stretch's recent reports: their rates are what it measured.
    segment: dict[str, Any] | None = None
    # "nodes,replicas,batch,accumulation" (0: not said) -> [steps/s, samples/s or None], newest last.
    measured: dict[str, list[float | None]] = field(default_factory=dict)
    batch_limits: dict[str, int] | None = None  # what the job declared (it lets dlsub choose its batch)
    grads: list[float] | None = None  # its last gradient noise report: [grad_sqr, grad_var]
    application: str | None = None  # its command's digest, from its latest start event
    gpu_type: str | None = None  # the kind of GPU of its latest start event (valid_gpu_type)
    # Its training wrote a start event (``checkpointing.init()`` does, and each adapter through it): it uses
    # dlsub's library. Never one: a script that uses no library (the agent's only sign of it).
    started: bool = False
    # Since its latest start it saves whenever dlsub asks: the start said so (a framework adapter:
    # contract.SAVES_ON_REQUEST), or its loop has polled should_stop() since (contract.EVENT_POLLS). It may be
    # moved or continued before its first checkpoint.
    saves_on_request: bool = False
    # Start events folded (Progress.starts). A summary folded before it was kept counts from where it was.
    starts: int = 0

    def _measure(self, event: dict[str, Any]) -> None:
        """Fold one start or progress event into the rates measured at the job's current size and batch."""
        size = [event.get("nodes") or 1, event.get("world_size")]
        split = [event.get("batch_size") or 0, event.get("accumulation_steps") or 0]
        if event["event"] == EVENT_START:
            if event.get("batch_limits") is not None:
                self.batch_limits = event["batch_limits"]
            self.application = valid_application(event.get(APPLICATION_FIELD)) or self.application
            self.gpu_type = valid_gpu_type(event.get("gpu_type"))
        elif event.get("grad_sqr") is not None and event.get("grad_var") is not None:
            self.grads = [event["grad_sqr"], event["grad_var"]]
        sets_size = event["event"] in SIZE_EVENTS
        if sets_size or (size[1] is not None and self.segment is not None and size[1] != self.segment["size"][1]):
            self.segment = {"size": size if size[1] is not None else [size[0], 1], "split": split, "points": []}
            if sets_size:
                return  # the time to start (or re-form) is not training: rates count from the first report
        if self.segment is None:
            return
        if split[0] and not self.segment["split"][0]:
            self.segment["split"] = split
        point = {k: event[k] for k in ("time", "step", "samples", "counted") if event.get(k) is not None}
        earlier = self.segment["points"]
        if "counted" not in point:
            # The loop reports its own steps now: the library's counts of its should_stop() calls before (a
            # step basis of their own, and no samples) never enter a rate beside them.
            earlier = [p for p in earlier if "counted" not in p]
        points = self.segment["points"] = [*earlier, point][-RATE_WINDOW:]
        steps = _rate(points[0], points[-1], "step") if len(points) > 1 else None
        if steps is not None:
            key = ",".join(str(int(v)) for v in (*self.segment["size"], *self.segment["split"]))
            if self.gpu_type:  # "nodes,replicas,batch,accumulation@type": each kind of GPU measured apart
                key += "@" + self.gpu_type
            # The newest MAX_CONFIGS configurations only: a file of made-up sizes costs a bounded amount.
            others = [(k, v) for k, v in self.measured.items() if k != key][-(MAX_CONFIGS - 1):]
            self.measured = {**dict(others), key: [steps, _rate(points[0], points[-1], "samples")]}

    def feed(self, event: dict[str, Any]) -> None:
        if self.first_time is None:
            self.first_time = event["time"]
        if self.latest_time is None or event["time"] > self.latest_time:
            self.latest_time = event["time"]
        kind = event["event"]
        if kind == EVENT_START:
            self.started = True
            self.starts += 1
            self.saves_on_request = event.get("saves") == SAVES_ON_REQUEST
        elif kind == EVENT_POLLS:
            self.saves_on_request = True
        if kind in (*SIZE_EVENTS, EVENT_PROGRESS):
            self._measure(event)
        if kind == EVENT_PROGRESS:
            slim = {k: event[k] for k in ("time", "attempt", "step", "epoch", "loss", "samples", "total_steps",
                                          "total_epochs") if event.get(k) is not None}
            if self.last is None or slim.get("attempt") != self.last.get("attempt"):
                self.window = []  # a new attempt: its rate starts afresh
            point: dict[str, Any] = {k: slim[k] for k in ("time", "step", "samples") if k in slim}
            self.window = [*self.window, point][-RATE_WINDOW:]
            self.last = slim
        elif kind == EVENT_CHECKPOINT:
            # A checkpoint counts whether or not it names a step (``run.save(state)``);
            # its step is then the last report's.
            self.checkpoints += 1
            step = event.get("step")
            self.checkpoint_step = step if step is not None else (self.last or {}).get("step")
            self.checkpoint_time = event["time"]
        elif kind == EVENT_FINISHED:
            self.finished = True

    def progress(self) -> Progress:
        last = self.last
        if last is None:
            return Progress(finished=self.finished, checkpoints=self.checkpoints,
                            last_checkpoint_step=self.checkpoint_step, last_checkpoint_time=self.checkpoint_time,
                            first_time=self.first_time, latest_time=self.latest_time, application=self.application,
                            gpu_type=self.gpu_type, starts=self.starts)
        first = self.window[0] if self.window else last
        several = len(self.window) > 1
        return Progress(
            step=last.get("step"), epoch=last.get("epoch"), loss=last.get("loss"), samples=last.get("samples"),
            total_steps=last.get("total_steps"), total_epochs=last.get("total_epochs"),
            steps_per_s=_rate(first, self.window[-1], "step") if several else None,
            samples_per_s=_rate(first, self.window[-1], "samples") if several else None,
            last_time=last.get("time"), last_checkpoint_step=self.checkpoint_step,
            last_checkpoint_time=self.checkpoint_time, finished=self.finished, checkpoints=self.checkpoints,
            first_time=self.first_time, latest_time=self.latest_time, configs=self.measured_configs(),
            batch_limits=self.batch_limits, grads=None if self.grads is None else (self.grads[0], self.grads[1]),
            application=self.application, gpu_type=self.gpu_type, starts=self.starts,
        )

    def measured_configs(self) -> tuple[MeasuredConfig, ...]:
        """Every configuration the job has run at and measured, oldest first."""
        out = []
        for key, (steps, samples) in self.measured.items():
            sizes, _, gpu_type = key.partition("@")
            parts = [int(part) for part in sizes.split(",")] + [0, 0]
            if steps is not None:
                out.append(MeasuredConfig(parts[0], parts[1], parts[2] or None, parts[3] or None, float(steps),
                                          None if samples is None else float(samples), gpu_type or None))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies, which costs a big tick most of its time.
        return {"last": self.last, "window": list(self.window), "checkpoints": self.checkpoints,
                "checkpoint_step": self.checkpoint_step, "checkpoint_time": self.checkpoint_time,
                "finished": self.finished, "first_time": self.first_time, "latest_time": self.latest_time,
                "bad_events": self.bad_events, "segment": self.segment, "measured": self.measured,
                "batch_limits": self.batch_limits, "grads": self.grads, "application": self.application,
                "started": self.started, "saves_on_request": self.saves_on_request, "gpu_type": self.gpu_type,
                "starts": self.starts}

    @classmethod
    def from_dict(cls, raw: Any) -> ProgressSummary:
        if not isinstance(raw, dict):
            return cls()
        if "started" not in raw:
            # Folded before the summary kept it: a job with any event then wrote its start first.
            raw = {**raw, "started": raw.get("first_time") is not None}
        try:
            return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except TypeError:
            return cls()


@dataclass
class AttemptsSummary:
    """What the attempt records say about one Slurm job: how its attempts ended."""

    slurm_job_id: int
    requeues: int = 0  # resume-requeues (``end`` with action "requeue"); moves do not count
    last_end_action: str | None = None
    last_end_restart: int | None = None
    bad_events: int = 0

    def feed(self, event: dict[str, Any]) -> None:
        if event["event"] != EVENT_END or event["slurm_job_id"] != self.slurm_job_id:
            return
        if event.get("action") == ACTION_SUPERSEDED:
            return  # an older attempt that ended late, after a newer one began: not how the job's attempts ended
        self.last_end_action = event.get("action")
        self.last_end_restart = event["restart"]
        if event.get("action") == ACTION_REQUEUE:
            self.requeues += 1

    def to_dict(self) -> dict[str, Any]:
        return {"slurm_job_id": self.slurm_job_id, "requeues": self.requeues, "last_end_action": self.last_end_action,
                "last_end_restart": self.last_end_restart, "bad_events": self.bad_events}

    @classmethod
    def from_dict(cls, raw: Any, slurm_job_id: int) -> AttemptsSummary:
        if not isinstance(raw, dict) or raw.get("slurm_job_id") != slurm_job_id:
            return cls(slurm_job_id)
        try:
            return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except TypeError:
            return cls(slurm_job_id)


# ---------------------------------------------------------------- whole-file readers (dlsub status)


def _read_checked(job_dir: Path, name: str, check: Any) -> list[dict[str, Any]]:
    """The checked events of the last :data:`MAX_READ_BYTES` of one file; [] when it cannot be read."""
    try:
        dir_fd = open_dir(job_dir, None)
    except Unreadable:
        return []
    try:
        lines = read_new_lines(dir_fd, name, None, None).lines
    except Unreadable:
        return []
    finally:
        os.close(dir_fd)
    events = []
    for line in lines:
        raw = parse_line(line)
        checked = check(raw) if raw is not None else None
        if checked is not None:
            events.append(checked)
    return events


def read_events(path: Path) -> list[dict[str, Any]]:
    """JSON objects, one a line, read as :func:`read_new_lines` does (no symlinks, bounded), unchecked."""
    try:
        dir_fd = open_dir(path.parent, None)
    except Unreadable:
        return []
    try:
        lines = read_new_lines(dir_fd, path.name, None, None).lines
    except Unreadable:
        return []
    finally:
        os.close(dir_fd)
    return [value for line in lines if (value := parse_line(line)) is not None]


def summarize_progress(job_dir: Path) -> Progress:
    summary = ProgressSummary()
    for event in _read_checked(job_dir, PROGRESS_FILE, check_progress_event):
        summary.feed(event)
    return summary.progress()


def read_progress_events(job_dir: Path) -> list[dict[str, Any]]:
    return _read_checked(job_dir, PROGRESS_FILE, check_progress_event)


def read_attempts(job_dir: Path) -> list[dict[str, Any]]:
    return _read_checked(job_dir, ATTEMPTS_FILE, check_attempt_event)
