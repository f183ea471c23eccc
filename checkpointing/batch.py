"""Letting dlsub choose a script's batch size: the declaration and the choice at each (re)start.

A script opts in with ``checkpointing.init(batch_size=BatchSizes(...))``.
At every ``init()`` (each start, requeue, move, and each time an elastic
group re-forms after a grow or shrink) the run's global batch is, in order:

1. ``$DLSUB_BATCH_SIZE``: the channel ``dlsub estimate`` sets for its
   profiling runs (and ``dlsub submit --from-estimate`` for the batch it
   chose): a batch asked for by name wins;
2. the batch the agent left in the job's mailbox
   (:data:`~dlsub.contract.BATCH_FILE`), if it is within the declared
   ``init..max``;
3. the declared initial batch.

That batch is then split over the replicas by the rule the goodput policy
predicts with (:func:`~dlsub.batch_split.split_batch`): each
replica runs :attr:`BatchChoice.accumulation_steps` micro-steps of
:attr:`BatchChoice.micro_batch_size` samples per optimiser step, and the
global batch is what that adds up to (the asked-for batch rounded so every
replica does the same work, never above ``max``).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub import contract
from dlsub.batch_split import BatchLimits, limits_problem, split_batch

#: Set by ``dlsub estimate`` in a profiling run's environment (and read here only).
BATCH_SIZE_ENV = contract.ENV_BATCH_SIZE
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class BatchSizes:
    """What a script that lets dlsub choose its batch size declares (AdaptDL's limits).

    ``init``: the global batch its hyper-parameters were tuned for; ``max``:
    the largest global batch it allows; ``local_max`` and ``local_min``: the
    most and least samples one replica processes in one micro-step (what
    fits in its memory, and what keeps it efficient).
    """

    init: int
    max: int
    local_max: int
    local_min: int = 1

    def __post_init__(self) -> None:
        problem = limits_problem(self.init, self.max, self.local_min, self.local_max)
        if problem is not None:
            raise ValueError(f"BatchSizes({self.init!r}, max={self.max!r}, local_max={self.local_max!r}, "
                             f"local_min={self.local_min!r}): {problem}")

    @property
    def limits(self) -> BatchLimits:
        return BatchLimits(init_batch=self.init, max_batch=self.max, min_local=self.local_min,
                           max_local=self.local_max)


@dataclass(frozen=True)
class BatchChoice:
    """The batch a run uses from this (re)start on, and where it came from."""

    batch_size: int  # global: world_size × micro_batch_size × accumulation_steps
    accumulation_steps: int  # micro-steps per optimiser step, 1 without accumulation
    micro_batch_size: int  # samples per replica per micro-step
    source: str  # one of contract.BATCH_SOURCES
    reason: str | None = None  # the agent's, when it chose


def env_batch_size() -> int | None:
    """``$DLSUB_BATCH_SIZE`` as a whole number >= 1, or None."""
    try:
        value = float(os.environ.get(BATCH_SIZE_ENV, ""))
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value >= 1 and value == int(value) else None


def read_mailbox(job_dir: Path) -> dict[str, Any] | None:
    """The agent's last batch message for this job, or None (no mailbox, nothing there, or not a message).

    Bounded and without following links: a mailbox is only ever an agent's
    small file, and a training must never hang or fail on a bad one.
    """
    try:
        fd = os.open(contract.batch_file(job_dir), _READ_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, contract.MAILBOX_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > contract.MAILBOX_MAX_BYTES:
        return None
    try:
        message = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def asked_batch(sizes: BatchSizes, job_dir: Path) -> tuple[int, str, str | None]:
    """(global batch asked for, its source, the agent's reason): environment, then mailbox, then ``init``."""
    from_env = env_batch_size()
    if from_env is not None:
        return from_env, "environment", None
    message = read_mailbox(job_dir) or {}
    batch = message.get("batch_size")
    if isinstance(batch, int) and not isinstance(batch, bool) and sizes.init <= batch <= sizes.max:
        reason = message.get("reason")
        return batch, "agent", reason if isinstance(reason, str) else None
    return sizes.init, "declared", None


def split(sizes: BatchSizes, world_size: int, batch: int, source: str, reason: str | None = None) -> BatchChoice:
    """How ``world_size`` replicas run a global ``batch``: the policy's rule, in micro-steps per optimiser step."""
    micro, extra = split_batch(sizes.limits, max(1, world_size), batch)
    steps = extra + 1  # split_batch counts the micro-steps beyond the first
    return BatchChoice(max(1, world_size) * micro * steps, steps, micro, source, reason)
