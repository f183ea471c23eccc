"""What an attempt does when its container has ended: pure functions of what happened, no I/O.

The main job (its batch step), in this order, each falling through to the
next when its Slurm call fails:

0. **superseded**: a newer attempt of the job began while this one ran (its
   node was cut off or its slurmd lost, and Slurm requeued the job elsewhere):
   the Slurm job is the newer attempt's now, so this one touches nothing in
   Slurm (no requeue, no end of the workers) and just ends (issue 53).

1. **move**: the training checkpointed (exit ``RESUME_EXIT_CODE``) after the
   agent's move signal, and no stop came: requeue the job *held*, for the
   agent to point it elsewhere. Moves do not count as continuations.
2. **continue**: it checkpointed and asked to be resumed, with no stop: requeue
   it where it is, while its continuations (``max_continuations``) last;
   past them the job ends with the resume code.
2b. **needs-gpu**: it failed, with no stop, on an attempt without GPUs of a job
   that asked for them (immediate mode on CPUs), a training process having died
   of torch's no-GPU error: requeue it held, for the agent to send it to wait
   for its GPU partition, as ideal mode would have. Once per job, so no loop.
3. **end**: anything else ends the attempt with the container's status. After
   a stop (scancel, preemption) Slurm decides what follows, so the worker
   array waits (the agent cancels it once the job has ended); any other end is
   final and ends the workers too.

A worker: cancelled (a stop) ends as Slurm says; its launcher's 0 (the
group's training finished) ends it; anything else (asked to leave, the group
stopped or broke) sends it back to the held pool.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dlsub import contract


class MainEnding(StrEnum):
    """What the main job tries, in this order (:func:`main_ending`)."""

    SUPERSEDED = "superseded"  # a newer attempt runs the job: end here, touching nothing in Slurm
    MOVE = "move"  # requeue held for the agent (scontrol requeuehold); a failure falls through
    CONTINUE = "continue"  # requeue to resume here (scontrol requeue), if continuations are left
    NEEDS_GPU = "needs-gpu"  # requeue held for the agent to send it to its GPU partition (scontrol requeuehold)
    END = "end"  # the attempt ends with the container's status


class WorkerEnding(StrEnum):
    CANCELLED = "cancelled"  # stopped: Slurm ends it (the job, or this worker, was cancelled)
    FINISHED = "finished"  # its group's training finished
    LEAVE = "leave"  # back to the held pool (scontrol requeuehold), whence the agent may release it again


@dataclass(frozen=True)
class Stopped:
    """How the container's run ended, as the batch shell saw it."""

    rc: int
    #: The last signal forwarded to the container (contract.CHECKPOINT_SIGNAL, LEAVE_SIGNAL, STOP_SIGNAL); "": none.
    signal: str = ""
    #: The agent's move signal arrived (contract.MOVE_SIGNAL).
    move_requested: bool = False
    #: A training process died of torch's no-GPU error on an attempt without GPUs of a job that asked for them,
    #: which was never sent back for them before.
    needs_gpu: bool = False
    #: A newer attempt of the job began while this one ran (the attempts file), or the container's launcher
    #: stopped the training for one (contract.SUPERSEDED_EXIT_CODE).
    superseded: bool = False

    @property
    def stopped(self) -> bool:
        """scancel or preemption (contract.STOP_SIGNAL): Slurm, not dlsub, decides what follows."""
        return self.signal == contract.STOP_SIGNAL

    @property
    def resumable(self) -> bool:
        """Checkpointed and asking to be resumed, with no stop."""
        return self.rc == contract.RESUME_EXIT_CODE and not self.stopped


def main_ending(run: Stopped, failed: Sequence[MainEnding] = ()) -> MainEnding:
    """What the main job tries next after its container ended, ``failed`` having been tried (their Slurm
    calls failed). END always holds."""
    if run.superseded:
        return MainEnding.SUPERSEDED
    if run.resumable and run.move_requested and MainEnding.MOVE not in failed:
        return MainEnding.MOVE
    if run.resumable and MainEnding.CONTINUE not in failed:
        return MainEnding.CONTINUE
    if (run.needs_gpu and run.rc not in (0, contract.RESUME_EXIT_CODE) and not run.stopped
            and not run.move_requested and MainEnding.NEEDS_GPU not in failed):
        return MainEnding.NEEDS_GPU
    return MainEnding.END


def may_continue(used: int, max_continuations: int) -> bool:
    """Whether one more resume-requeue is allowed after ``used`` of them."""
    return used < max_continuations


def ends_workers(run: Stopped) -> bool:
    """Whether the job's end here is final, so its worker array ends with it (not after a stop: Slurm may
    requeue a preempted job, and the workers wait held for it)."""
    return not run.stopped


def worker_ending(run: Stopped) -> WorkerEnding:
    """What a worker does once its container ended. Done only when the training says so: its launcher exits
    0 only when its group's rank 0 recorded this attempt's training as finished (a group that stopped or
    re-formed without this worker exits 85)."""
    if run.stopped:
        return WorkerEnding.CANCELLED
    if run.rc == 0 and not run.move_requested and not run.signal:
        return WorkerEnding.FINISHED
    return WorkerEnding.LEAVE


_WHITESPACE = string.whitespace.encode()


def digits_in(head: bytes) -> int | None:
    """A count or status a file holds (its first bytes, whitespace anywhere dropped): digits only, else None.
    The files are the job's user's own: anything else is not a number."""
    text = bytes(b for b in head if b not in _WHITESPACE)
    return int(text) if text and text.isdigit() else None


def requeues_used(head: bytes | None) -> int:
    """The resume-requeues counted so far (the first 20 bytes of the count file; None: no file). Anything but
    digits reads as 0."""
    count = digits_in(head) if head is not None else None
    return 0 if count is None else count


#: podman run exits 125-127 for its own errors and 128 + N when a signal kills it.
PODMAN_OWN_STATUS = 125


def recorded_status(rc: int, record: bytes | None) -> int | None:
    """The container's exit status from its launcher's record (its first 8 bytes; None: no record), where it
    counts: ``podman run`` exited 125 or more, so it may have lost the status.

    podman run exits 125-127 for its own errors, and also when a signal it proxies meets the container's exit
    ("container has already been removed": a second stop request while the training leaves with 85). And
    ``scancel --batch`` signals the batch shell's children too: a second move signal just as the container
    ends kills podman run itself (128 + the signal: 140 for USR2), as the agent's repeated request after a
    restart did in a live test. The container's launcher wrote its own status before it exited: that one
    counts then, digits only.
    """
    if rc < PODMAN_OWN_STATUS or record is None:
        return None
    return digits_in(record)


@dataclass(frozen=True)
class Rendezvous:
    """Where a gang's group meets, as the main job wrote it for late joiners (contract.RENDEZVOUS_FILE)."""

    endpoint: str  # host:port
    attempt: str  # <slurm job id>-<restart>
    main_job_id: str

    def line(self) -> str:
        return f"{self.endpoint} {self.attempt} {self.main_job_id}\n"


_ENDPOINT = re.compile(r"[A-Za-z0-9._-]+:[0-9]+")
_ATTEMPT = re.compile(r"[0-9]+-[0-9]+")
_JOB_ID = re.compile(r"[0-9]+")
# bash's `read -r a b c`: fields split on spaces and tabs, the last one taking the rest of the line.
_READ3 = re.compile(r"([^ \t]*)[ \t]*([^ \t]*)[ \t]*(.*)", re.DOTALL)


def read_rendezvous(line: str) -> Rendezvous | None:
    """The rendezvous file's first line, if it is one (the file is the job's user's: checked word by word)."""
    match = _READ3.fullmatch(line.split("\n", 1)[0].strip(" \t"))
    assert match is not None  # the pattern matches every line
    endpoint, attempt, main = match.group(1), match.group(2), match.group(3).rstrip(" \t")
    if _ENDPOINT.fullmatch(endpoint) and _ATTEMPT.fullmatch(attempt) and _JOB_ID.fullmatch(main):
        return Rendezvous(endpoint, attempt, main)
    return None
