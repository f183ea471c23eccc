"""A job's declared batch-size limits, and how a total batch runs on a number of replicas.

One definition for the goodput policy (which predicts the step time of each
batch it considers) and the training library (which runs the batch the agent
picked, ``run.accumulation_steps`` micro-steps of ``run.micro_batch_size``
per replica): the step that runs is the step that was predicted.

Standard library only: the training library imports it inside containers
that have nothing but Python and torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlsub.contract import MAX_REPORTED_BATCH

#: The largest batch (total or per replica) a job may declare: far above any real one, and small
#: enough that products of it with replica counts stay exact in a float.
MAX_BATCH = MAX_REPORTED_BATCH  # the contract's bound on a reported batch
#: The keys of a declaration as the start event carries it (``batch_limits``).
EVENT_KEYS = ("init", "max", "local_min", "local_max")


@dataclass(frozen=True)
class BatchLimits:
    """What the job declared about its batch size (AdaptDL jobs declare these)."""

    init_batch: int  # the batch size its hyper-parameters were tuned for
    max_batch: int  # the largest total batch it allows
    min_local: int  # per replica, per micro-step
    max_local: int

    def to_event(self) -> dict[str, int]:
        return dict(zip(EVENT_KEYS, (self.init_batch, self.max_batch, self.min_local, self.max_local), strict=True))

    @classmethod
    def from_event(cls, raw: Any) -> BatchLimits | None:
        """The limits a start event's ``batch_limits`` declares, or None unless exactly those keys hold valid ones."""
        if not isinstance(raw, dict) or set(raw) != set(EVENT_KEYS):
            return None
        if limits_problem(raw["init"], raw["max"], raw["local_min"], raw["local_max"]) is not None:
            return None
        return cls(raw["init"], raw["max"], raw["local_min"], raw["local_max"])


def limits_problem(init: Any, max_batch: Any, local_min: Any, local_max: Any) -> str | None:
    """What is wrong with a declaration, in words; None when it is valid.

    Whole numbers (not bools) from 1 to :data:`MAX_BATCH`, with
    ``local_min <= local_max``, ``init <= max`` and ``local_min <= init``
    (one replica must be able to run the initial batch).
    """
    named = {"init": init, "max": max_batch, "local_min": local_min, "local_max": local_max}
    for name, value in named.items():
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name}={value!r} is not a whole number"
        if not 1 <= value <= MAX_BATCH:
            return f"{name}={value} is outside 1..{MAX_BATCH}"
    if local_min > local_max:
        return f"local_min={local_min} is above local_max={local_max}"
    if init > max_batch:
        return f"init={init} is above max={max_batch}"
    if local_min > init:
        return f"local_min={local_min} is above init={init}: one replica could not run the initial batch"
    return None


def split_batch(limits: BatchLimits, replicas: int, batch: int) -> tuple[int, int]:
    """(atomic batch per replica, extra accumulation steps) for a total ``batch``:
    accumulate above the per-replica maximum; one replica gains nothing from a
    bigger synchronous batch without accumulating (AdaptDL's rule: it measures
    the gradient noise across a replica's micro-steps, so it needs two)."""
    local = math.ceil(batch / replicas - 1e-8)
    accum = max(0, math.ceil(local / limits.max_local - 1e-8) - 1)  # never -1 (a tiny local share)
    if replicas == 1 and batch > limits.init_batch:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(limits.max_batch / (replicas * (accum + 1))))
    return max(atomic, 1), accum
