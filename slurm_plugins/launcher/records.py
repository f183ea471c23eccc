"""The files the batch launcher writes and reads in the job directory (names from dlsub.contract).

* ``attempts.jsonl``: one ``start`` and one ``end`` line per attempt (and
  per worker run), appended whole under a POSIX lock; the agent reads them
  (dlsub/jobdir.py).
* ``attempts/requeues``: the count of resume-requeues, written whole.
* ``attempts/rendezvous``: a gang's rendezvous for late joiners.
* ``attempts/<container>.exit``: the container launcher's own exit status.

A file that cannot be written costs its record, never the attempt: the
error is said on stderr and the launcher goes on, as the batch shell did.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dlsub import contract
from dlsub.slurm_plugins.launcher.config import Role, SlurmStep
from dlsub.slurm_plugins.launcher.policy import Rendezvous


def say(message: str) -> None:
    """One line on stderr (Slurm's output file), in one write: safe in a signal handler, never cut."""
    try:
        os.write(sys.stderr.fileno(), (message + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


#: A field of an attempt record: text (a JSON string) or a number.
Field = tuple[str, "str | int"]


def _json_value(value: str | int) -> str:
    return str(value) if isinstance(value, int) else json.dumps(value)


def _number(text: str) -> str | int:
    """One of Slurm's numbers (job id, restart count, node count), as a JSON number."""
    return int(text) if text.isdigit() else text


def timestamp(ns: int | None = None) -> str:
    """Seconds since the epoch with nanoseconds, as ``date +%s.%N`` prints them."""
    ns = time.time_ns() if ns is None else ns
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def attempt_line(event: str, step: SlurmStep, role: Role, extra: Sequence[Field] = (),
                 now: str | None = None) -> str:
    """One line of ``attempts.jsonl``: the event, when, which Slurm job and restart, where, and ``extra``."""
    fields: list[Field] = [("slurm_job_id", _number(step.job_id)), ("restart", _number(step.restart)),
                           ("node", step.node_name), ("partition", step.partition), ("role", role.value), *extra]
    words = [f'"event":{json.dumps(event)}', f'"time":{now or timestamp()}',
             *(f'"{key}":{_json_value(value)}' for key, value in fields)]
    return "{" + ",".join(words) + "}\n"


def _write_once(path: Path, text: str, flags: int) -> None:
    """``text`` in one write(2), mode 0666 less the umask, as the shell's redirections create files."""
    fd = os.open(path, os.O_WRONLY | flags, 0o666)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


#: How long an append waits for another host's lock on the file before it writes without it.
APPEND_LOCK_WAIT_S = 10.0


def _lock_for_append(fd: int, path: Path, wait_s: float) -> None:
    """An exclusive POSIX lock on the open file ``fd``, waited for up to ``wait_s`` (every 50 ms).

    Why: the main launcher and the workers append to one file from different nodes. A local file system
    appends each write(2) whole at the end, but NFS does not: each client writes at the end as it last saw it,
    so two hosts appending at once can write over each other's line. Under a lock both NFS's lock manager and
    the client's cache agree (taking it revalidates the file's size, closing the file writes the line back
    before the lock goes). A lock that is not free within ``wait_s`` (a dead host's, until the server
    reclaims it) or a file system without locks costs only the guarantee: the line is written anyway."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                return  # no locks here (NFS mounted nolock says ENOLCK, some FUSE file systems ENOSYS)
        if time.monotonic() >= deadline:
            say(f"dlsub: {path} stayed locked for {wait_s:g} s; appending without the lock")
            return
        time.sleep(0.05)


def append_line(path: Path, line: str, *, lock_wait_s: float = APPEND_LOCK_WAIT_S) -> None:
    """Append ``line`` in one write (O_APPEND) under an exclusive POSIX lock (:func:`_lock_for_append`),
    creating the file as the shell's ``>>`` does."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        say(f"dlsub: cannot write {path}: {exc.strerror}")
        return
    try:
        _lock_for_append(fd, path, lock_wait_s)
        os.write(fd, line.encode("utf-8"))
    except OSError as exc:
        say(f"dlsub: cannot write {path}: {exc.strerror}")
    finally:
        os.close(fd)  # writes the line back (NFS) before it lets the lock go


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` under a temporary name, then rename it over ``path`` (readers see all or nothing)."""
    partial = path.with_name(path.name + ".tmp")
    try:
        _write_once(partial, text, os.O_CREAT | os.O_TRUNC)
        os.replace(partial, path)
    except OSError as exc:
        say(f"dlsub: cannot write {path}: {exc.strerror}")


def read_head(path: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of a regular file (symbolic links followed); None when there is none."""
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def read_first_line(path: Path, limit: int = 1 << 20) -> str:
    """The first line of ``path`` ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.readline(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def remove(path: Path) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class AttemptLog:
    """``attempts.jsonl`` of one job, written by one role on one node."""

    def __init__(self, path: Path, step: SlurmStep, role: Role) -> None:
        self.path, self.step, self.role = path, step, role

    def start(self, extra: Sequence[Field]) -> None:
        append_line(self.path, attempt_line(contract.EVENT_START, self.step, self.role, extra))

    def end(self, rc: int, *, signal: str | None = None, action: str | None = None) -> None:
        """The end of this attempt (or worker run): its status, and what it asked for (``action``, one of
        contract.ATTEMPT_ACTIONS) or the signal that stopped it ("" for none)."""
        extra: list[Field] = [("rc", rc)]
        if action is not None:
            extra.append(("action", action))
        elif signal is not None:
            extra.append(("signal", signal))
        append_line(self.path, attempt_line(contract.EVENT_END, self.step, self.role, extra))


def write_rendezvous(path: Path, rendezvous: Rendezvous) -> None:
    write_whole(path, rendezvous.line())


def write_requeue_count(path: Path, count: int) -> None:
    write_whole(path, f"{count}\n")
