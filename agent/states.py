"""The states of a dlsub job, as users see them."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """A dlsub job's state, derived from Slurm's and the job directory.

    ``PENDING -> RUNNING -> COMPLETED | FAILED | CANCELLED | TIMEOUT``;
    ``RUNNING -> REQUEUED -> PENDING -> RUNNING`` when an attempt checkpoints
    and the job continues in a new attempt (time limit, preemption,
    ``dlsub requeue``, node failure). The terminal states never change again.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


_FROM_SLURM = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "PREEMPTED": JobState.REQUEUED,
}


def from_slurm(state: str) -> JobState:
    return _FROM_SLURM.get(state.upper(), JobState.UNKNOWN)
