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
What the events sum up to is :mod:`dlsub.job_progress`, whose whole-file
readers (``dlsub status``, on the user's own directory) use the same reader.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub.batch_split import BatchLimits
from dlsub.contract import (
    ATTEMPT_ACTIONS,
    ATTEMPT_EVENTS,
    MAX_TIME,
    MIN_TIME,
    PROGRESS_EVENTS,
    PROGRESS_FIELDS,
)

#: The most bytes read from one file in one call (one tick).
MAX_READ_BYTES = 1 << 20
#: A longer line is dropped unread: no event the contract writes comes close.
MAX_LINE_BYTES = 64 << 10
#: Lines parsed per file per call: a megabyte of one-byte lines would otherwise cost a tick half a second
#: (the rest is read on the next calls).
MAX_READ_LINES = 5000

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


_KINDS: dict[str, Any] = {"int": _int, "num": _num, "text": _text, "one_of": _one_of,
                         "batch_limits": _batch_limits}
_PROGRESS_FIELDS = tuple((name, _KINDS[kind], bounds) for name, kind, bounds in PROGRESS_FIELDS)


def check_progress_event(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of a progress event the agent uses, each type- and range-checked; None if any is bad."""
    try:
        event = raw.get("event")
        if event not in PROGRESS_EVENTS:
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
        if event not in ATTEMPT_EVENTS:
            return None
        action = _opt(raw, "action", _text)
        if action is not None and action not in ATTEMPT_ACTIONS:
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
            "gpu_type": _opt(raw, "gpu_type", _text, 256),
            "role": _opt(raw, "role", _text),
            "dlsub_version": _opt(raw, "dlsub_version", _text, 64),
        }
        return {k: v for k, v in checked.items() if v is not None}
    except _BadField:
        return None
