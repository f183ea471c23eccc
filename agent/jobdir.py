"""Read what a job leaves in its directory: progress events and attempt records.

Everything in a job directory is written by its user, so to the agent it is
hostile input. The hardened reader here:

* opens the directory with ``O_DIRECTORY|O_NOFOLLOW`` and each file relative
  to it with ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_NOCTTY`` (a symlink, to
  ``/dev/zero`` or to another user's file, fails to open; a FIFO opens
  without blocking and is then refused);
* accepts only a directory and regular files owned by the job's uid;
* reads incrementally from a remembered ``(dev, inode, offset)``, at most
  :data:`MAX_READ_BYTES` per call, drops lines longer than
  :data:`MAX_LINE_BYTES`, and restarts from the tail when the file is
  replaced or shrinks;
* type- and range-checks every field; a bad event is skipped, never trusted
  in part.

A file it refuses raises :class:`Unreadable` with a reason in plain words.
``summarize_progress`` and ``read_attempts`` (``dlsub status``, on the
user's own directory) use the same reader.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlsub.contract import (
    ACTION_LEAVE,
    ACTION_MOVE,
    ACTION_REQUEUE,
    APPLICATION_FIELD,
    ATTEMPTS_FILE,
    BATCH_SOURCES,
    EVENT_CHECKPOINT,
    EVENT_END,
    EVENT_EXIT_FOR_RESUME,
    EVENT_FINISHED,
    EVENT_PROGRESS,
    EVENT_RESTORE,
    EVENT_START,
    PROGRESS_FILE,
    valid_application,
)
from dlsub.policies.batch_split import MAX_BATCH, BatchLimits

#: The most bytes read from one file in one call (one tick).
MAX_READ_BYTES = 1 << 20
#: A longer line is dropped unread: no event the contract writes comes close.
MAX_LINE_BYTES = 64 << 10
#: Lines parsed per file per call: a megabyte of one-byte lines would otherwise cost a tick half a second
#: (the rest is read on the next calls).
MAX_READ_LINES = 5000
#: Sane bounds for the fields of an event.
MIN_TIME, MAX_TIME = 946_684_800.0, 4_102_444_800.0  # 2000-01-01 .. 2100-01-01
MAX_STEP = 10**12
MAX_SAMPLES = 10**15
MAX_EPOCH = 10**9
MAX_ABS_LOSS = 1e12
#: Most micro-steps per optimiser step a report may claim.
MAX_ACCUMULATION = 10**6
#: Reports of the current attempt the step rate is measured over.
RATE_WINDOW = 20
#: Configurations (size and batch) whose measured rates a job's summary keeps, newest last.
MAX_CONFIGS = 32

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
# O_PATH: the agent's account may only traverse job directories (ACL u:dlsub:--x, or 0711), not list
# them; a path descriptor is enough to fstat the directory and open its two files relative to it.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Unreadable(Exception):
    """The agent will not read this directory or file; ``reason`` says why, for `dlsub why`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------- opening


def _owner_check(info: os.stat_result, uid: int | None, what: str) -> None:
    if uid is not None and info.st_uid != uid:
        raise Unreadable(f"{what} is owned by uid {info.st_uid}, not by the job's user (uid {uid})")


def open_dir(path: Path | str, uid: int | None, *, dir_fd: int | None = None, what: str | None = None) -> int:
    """A descriptor of the directory ``path``: a real directory (no symlink) owned by ``uid``.

    With ``dir_fd``, ``path`` is a name relative to that directory (a job
    directory's mailbox); ``what`` names it in errors.
    """
    what = what or f"the job directory {path}"
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unreadable(f"{what} is a symlink or not a directory") from None
        raise Unreadable(f"cannot open {what}: {exc.strerror}") from None
    _checked(fd, stat.S_ISDIR, f"{what} is not a directory", uid, what)
    return fd


def _checked(fd: int, right_kind: Callable[[int], bool], wrong_kind: str, uid: int | None,
             what: str) -> os.stat_result:
    """``fd``'s status, if it is of the right kind and owned by ``uid``; else it is closed and Unreadable raised."""
    try:
        info = os.fstat(fd)
        if not right_kind(info.st_mode):
            raise Unreadable(wrong_kind)
        _owner_check(info, uid, what)
    except BaseException:
        os.close(fd)
        raise
    return info


@dataclass
class Cursor:
    """Where reading a file stopped: the file's identity and the offset of the next unread byte."""

    dev: int
    ino: int
    offset: int
    skipping: bool = False  # inside an over-long line: drop bytes up to the next newline

    def to_dict(self) -> dict[str, Any]:
        return {"dev": self.dev, "ino": self.ino, "offset": self.offset, "skipping": self.skipping}

    @classmethod
    def from_dict(cls, raw: Any) -> Cursor | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(int(raw["dev"]), int(raw["ino"]), int(raw["offset"]), bool(raw.get("skipping")))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class Chunk:
    """What one bounded read of a file gave."""

    lines: list[bytes]
    cursor: Cursor | None
    restarted: bool = False  # new, replaced or shrunk: read again from its start (or tail)
    dropped: int = 0  # bytes passed over unread: before the tail, or in lines over MAX_LINE_BYTES


def read_new_lines(dir_fd: int, name: str, uid: int | None, cursor: Cursor | None,
                   max_bytes: int = MAX_READ_BYTES, max_lines: int = MAX_READ_LINES) -> Chunk:
    """Complete lines appended to ``name`` since ``cursor``: at most ``max_bytes`` and ``max_lines`` of them.

    A file that is new, was replaced or shrank is read again from its tail
    (its last ``max_bytes``). A file that does not exist yet gives nothing.
    """
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return Chunk([], None, cursor is not None)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable(f"{name} is a symlink (the agent reads only regular files)") from None
        raise Unreadable(f"cannot open {name}: {exc.strerror}") from None
    info = _checked(fd, stat.S_ISREG, f"{name} is not a regular file (a FIFO, device or directory)", uid, name)
    try:
        size = info.st_size
        restarted = cursor is None or (cursor.dev, cursor.ino) != (info.st_dev, info.st_ino) or size < cursor.offset
        if restarted:
            start = max(0, size - max_bytes)
            skipping = start > 0  # the tail begins mid-line: drop that partial line
        else:
            assert cursor is not None
            start, skipping = cursor.offset, cursor.skipping
        want = min(size - start, max_bytes)
        data = os.pread(fd, want, start) if want > 0 else b""
    finally:
        os.close(fd)
    dropped = start if restarted else 0
    pos = 0
    if skipping:
        newline = data.find(b"\n")
        if newline < 0:
            return Chunk([], Cursor(info.st_dev, info.st_ino, start + len(data), True), restarted,
                         dropped + len(data))
        pos, skipping = newline + 1, False
        dropped += pos
    last = data.rfind(b"\n")
    consumed = last + 1 if last >= pos else pos
    lines = []
    capped = False
    taken = 0  # lines looked at, empty and over-long ones too: each costs a step
    while pos < consumed:
        newline = data.find(b"\n", pos, consumed)  # found: data[consumed - 1] is a newline
        line = data[pos:newline]
        pos = newline + 1
        taken += 1
        if len(line) > MAX_LINE_BYTES:
            dropped += len(line)
        elif line:
            lines.append(line)
        if taken >= max_lines and pos < consumed:
            consumed, capped = pos, True  # the rest waits for the next call
            break
    if not capped and len(data) - consumed > MAX_LINE_BYTES:
        dropped += len(data) - consumed
        consumed, skipping = len(data), True  # an unfinished line already too long: drop it
    return Chunk(lines, Cursor(info.st_dev, info.st_ino, start + consumed, skipping), restarted, dropped)


# ---------------------------------------------------------------- checking events


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One JSON object, or None (not JSON, NaN/Infinity, huge integers, nesting too deep, not an object)."""
    try:
        value = _DECODER.decode(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return value if isinstance(value, dict) else None


class _BadField(Exception):
    """A field of the wrong type or out of range: the whole event is dropped."""


def _int(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _BadField
    return value


def _num(value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadField
    number = float(value)
    if not math.isfinite(number) or not lo <= number <= hi:
        raise _BadField
    return number


def _opt(raw: dict[str, Any], key: str, check: Any, *bounds: Any) -> Any:
    value = raw.get(key)
    return None if value is None else check(value, *bounds)


def _text(value: Any, limit: int = 64) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _BadField
    return value


def _one_of(value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _BadField
    return str(value)


def _batch_limits(value: Any) -> dict[str, int]:
    limits = BatchLimits.from_event(value)
    if limits is None:
        raise _BadField
    return limits.to_event()


_PROGRESS_EVENTS = (EVENT_START, EVENT_PROGRESS, EVENT_CHECKPOINT, EVENT_RESTORE, EVENT_EXIT_FOR_RESUME,
                    EVENT_FINISHED)


_PROGRESS_FIELDS: tuple[tuple[str, Any, tuple[Any, ...]], ...] = (
    ("step", _int, (0, MAX_STEP)),
    ("epoch", _num, (0, MAX_EPOCH)),
    ("loss", _num, (-MAX_ABS_LOSS, MAX_ABS_LOSS)),
    ("samples", _int, (0, MAX_SAMPLES)),
    ("total_steps", _int, (1, MAX_STEP)),
    ("total_epochs", _int, (1, MAX_EPOCH)),
    ("seq", _int, (0, MAX_STEP)),
    ("attempt", _text, ()),
    ("world_size", _int, (1, 10**6)),  # start events: the group's size (elastic jobs change it)
    ("nodes", _int, (1, 10**5)),
    # A script that lets dlsub choose its batch size: its declared limits (start events), the global
    # batch and micro-steps per optimiser step it runs, where that batch came from (start events), and
    # Pollux's gradient-noise statistics at the initial batch's scale (progress reports).
    ("batch_limits", _batch_limits, ()),
    ("batch_size", _int, (1, MAX_BATCH)),
    ("accumulation_steps", _int, (1, MAX_ACCUMULATION)),
    ("batch_from", _one_of, (BATCH_SOURCES,)),
    ("grad_sqr", _num, (0, math.inf)),
    ("grad_var", _num, (0, math.inf)),
)


def check_progress_event(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of a progress event the agent uses, each type- and range-checked; None if any is bad."""
    try:
        event = raw.get("event")
        if event not in _PROGRESS_EVENTS:
            return None
        checked: dict[str, Any] = {"event": event, "time": _num(raw.get("time"), MIN_TIME, MAX_TIME)}
        for key, check, bounds in _PROGRESS_FIELDS:
            value = raw.get(key)
            checked[key] = None if value is None else check(value, *bounds)
        return checked
    except _BadField:
        return None


def check_attempt_event(raw: dict[str, Any]) -> dict[str, Any] | None:
    """An attempt record (``start``/``end``) with checked fields; None if any is bad."""
    try:
        event = _text(raw.get("event"))
        if event not in (EVENT_START, EVENT_END):
            return None
        action = _opt(raw, "action", _text)
        if action not in (None, ACTION_REQUEUE, ACTION_MOVE, ACTION_LEAVE):
            return None
        checked = {
            "event": event,
            "time": _num(raw.get("time"), MIN_TIME, MAX_TIME),
            "slurm_job_id": _int(raw.get("slurm_job_id"), 1, 2**63),
            "restart": _int(raw.get("restart", 0), 0, 10**6),
            "rc": _opt(raw, "rc", _int, -(2**31), 2**31),
            "action": action,
            "signal": _opt(raw, "signal", _text),
            "node": _opt(raw, "node", _text, 256),
            "partition": _opt(raw, "partition", _text),
            "nodes": _opt(raw, "nodes", _text, 4096),
            "gpus": _opt(raw, "gpus", _text, 4096),
            "role": _opt(raw, "role", _text),
        }
        return {k: v for k, v in checked.items() if v is not None}
    except _BadField:
        return None


# ---------------------------------------------------------------- summaries


@dataclass(frozen=True)
class MeasuredConfig:
    """The rates a job measured on ``nodes`` nodes with ``replicas`` processes at one batch (None: not said)."""

    nodes: int
    replicas: int
    batch: int | None
    accumulation_steps: int | None  # micro-steps per optimiser step
    steps_per_s: float
    samples_per_s: float | None


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

    @property
    def measured(self) -> dict[tuple[int, int], tuple[float, float | None]]:
        """(nodes, replicas) -> (steps/s, samples/s or None), the newest measurement at each size."""
        return {(c.nodes, c.replicas): (c.steps_per_s, c.samples_per_s) for c in self.configs}

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

    def _measure(self, event: dict[str, Any]) -> None:
        """Fold one start or progress event into the rates measured at the job's current size and batch."""
        size = [event.get("nodes") or 1, event.get("world_size")]
        split = [event.get("batch_size") or 0, event.get("accumulation_steps") or 0]
        if event["event"] == EVENT_START:
            if event.get("batch_limits") is not None:
                self.batch_limits = event["batch_limits"]
            self.application = valid_application(event.get(APPLICATION_FIELD)) or self.application
        elif event.get("grad_sqr") is not None and event.get("grad_var") is not None:
            self.grads = [event["grad_sqr"], event["grad_var"]]
        if event["event"] == EVENT_START or (size[1] is not None and self.segment is not None
                                               and size[1] != self.segment["size"][1]):
            self.segment = {"size": size if size[1] is not None else [size[0], 1], "split": split, "points": []}
            if event["event"] == EVENT_START:
                return  # the time to start is not training: rates count from the first report
        if self.segment is None:
            return
        if split[0] and not self.segment["split"][0]:
            self.segment["split"] = split
        point = {k: event[k] for k in ("time", "step", "samples") if event.get(k) is not None}
        points = self.segment["points"] = [*self.segment["points"], point][-RATE_WINDOW:]
        steps = _rate(points[0], points[-1], "step") if len(points) > 1 else None
        if steps is not None:
            key = ",".join(str(int(v)) for v in (*self.segment["size"], *self.segment["split"]))
            # The newest MAX_CONFIGS configurations only: a file of made-up sizes costs a bounded amount.
            others = [(k, v) for k, v in self.measured.items() if k != key][-(MAX_CONFIGS - 1):]
            self.measured = {**dict(others), key: [steps, _rate(points[0], points[-1], "samples")]}

    def feed(self, event: dict[str, Any]) -> None:
        if self.first_time is None:
            self.first_time = event["time"]
        if self.latest_time is None or event["time"] > self.latest_time:
            self.latest_time = event["time"]
        kind = event["event"]
        if kind in (EVENT_START, EVENT_PROGRESS):
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
                            first_time=self.first_time, latest_time=self.latest_time, application=self.application)
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
            application=self.application,
        )

    def measured_configs(self) -> tuple[MeasuredConfig, ...]:
        """Every configuration the job has run at and measured, oldest first."""
        out = []
        for key, (steps, samples) in self.measured.items():
            parts = [int(part) for part in key.split(",")] + [0, 0]
            if steps is not None:
                out.append(MeasuredConfig(parts[0], parts[1], parts[2] or None, parts[3] or None, float(steps),
                                          None if samples is None else float(samples)))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies, which costs a big tick most of its time.
        return {"last": self.last, "window": list(self.window), "checkpoints": self.checkpoints,
                "checkpoint_step": self.checkpoint_step, "checkpoint_time": self.checkpoint_time,
                "finished": self.finished, "first_time": self.first_time, "latest_time": self.latest_time,
                "bad_events": self.bad_events, "segment": self.segment, "measured": self.measured,
                "batch_limits": self.batch_limits, "grads": self.grads, "application": self.application}

    @classmethod
    def from_dict(cls, raw: Any) -> ProgressSummary:
        if not isinstance(raw, dict):
            return cls()
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
