"""The agent's side of a job's mailbox: telling the training the batch size it picked.

``jobs/<id>/agent/`` (:data:`~dlsub.contract.AGENT_MAILBOX_DIR`) belongs to
the job's user, who may have put anything there or in its place: a symlink to
a file of the agent's, a directory of someone else's, a FIFO. So the writer
here

* opens the job directory and then the mailbox relative to it, each with
  ``O_DIRECTORY|O_NOFOLLOW`` (:func:`dlsub.jobdir.open_dir`), and
  refuses either unless it is a real directory owned by the job's uid;
* never opens an existing name for writing: it writes a fresh ``O_EXCL``
  temporary file (mode 0644, so the job's user can read it: the mailbox is
  0700 to everyone but the user and the agent) and ``rename``s it over
  :data:`~dlsub.contract.BATCH_FILE`; rename replaces a symlink there, it
  does not follow it;
* writes at most :data:`~dlsub.contract.MAILBOX_MAX_BYTES`.

Any refusal or failure raises :class:`MailboxError` with the reason; the
caller logs it and goes on (the job keeps the batch it has).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from dlsub.batch_split import MAX_BATCH
from dlsub.contract import AGENT_MAILBOX_DIR, BATCH_FILE, MAILBOX_MAX_BYTES
from dlsub.jobdir import Unreadable, open_dir

#: Longest reason kept (the job's log prints it; ``dlsub why`` has the full story).
MAX_REASON_CHARS = 300
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class MailboxError(Exception):
    """The agent did not leave its message in a job's mailbox; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def batch_message(batch_size: int, accumulation_steps: int, reason: str, now: float) -> bytes:
    """The bytes of :data:`~dlsub.contract.BATCH_FILE`; ValueError for values no job could run."""
    for name, value in (("batch_size", batch_size), ("accumulation_steps", accumulation_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
            raise ValueError(f"{name}={value!r} is not a whole number in 1..{MAX_BATCH}")
    one_line = " ".join(str(reason).split())[:MAX_REASON_CHARS]
    data = json.dumps({"batch_size": batch_size, "accumulation_steps": accumulation_steps, "reason": one_line,
                       "time": round(now, 3)}).encode("utf-8")
    assert len(data) <= MAILBOX_MAX_BYTES  # the reason is capped far below it
    return data


def publish_batch(job_dir: Path, owner_uid: int, batch_size: int, accumulation_steps: int, reason: str) -> None:
    """Leave ``batch_size`` (global) and ``accumulation_steps`` (micro-steps per optimiser step) for the job.

    The training reads them at its next (re)start; publish before resizing.
    Raises :class:`MailboxError` (or ValueError for impossible values).
    """
    data = batch_message(batch_size, accumulation_steps, reason, time.time())
    try:
        job_fd = open_dir(job_dir, owner_uid)
    except Unreadable as exc:
        raise MailboxError(exc.reason) from None
    try:
        box_fd = open_dir(AGENT_MAILBOX_DIR, owner_uid, dir_fd=job_fd,
                          what=f"the mailbox {job_dir / AGENT_MAILBOX_DIR}")
    except Unreadable as exc:
        raise MailboxError(exc.reason) from None
    finally:
        os.close(job_fd)
    try:
        _replace(box_fd, BATCH_FILE, data)
    finally:
        os.close(box_fd)


#: What the agent leaves in a mailbox: the job's user (and the job) must read it.
_FILE_MODE = 0o644


def _replace(dir_fd: int, name: str, data: bytes) -> None:
    """Make ``name`` in ``dir_fd`` a new file holding ``data``, all at once, without writing through any link."""
    temp = f".{name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(temp, _NEW_FILE, _FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        raise MailboxError(f"cannot create a file in the mailbox: {exc.strerror}") from None
    try:
        try:
            os.fchmod(fd, _FILE_MODE)  # whatever the agent's umask: the job's user must read it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass  # the owner may have removed it already; nothing of ours is left to clean
        raise MailboxError(f"cannot write {name} in the mailbox: {exc.strerror}") from None
