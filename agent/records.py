"""The agent's typed records of what it has in flight, as its store keeps them (see :mod:`.agent_store`).

A move (or a continuation, or a return from a backfill window) is a
:class:`MoveRow` whose phase is a :class:`MovePhase`; a grow or shrink of an
elastic job is a :class:`ResizeRow` whose phase is a :class:`ResizePhase`.
Both are written ahead, before the agent asks Slurm, and advanced from what
Slurm shows after a crash.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from dlsub.policies.actions.kinds import ActionKind, MoveKind
from dlsub.policies.actions.move_views import MovePhase, MoveView


@dataclass(frozen=True)
class MoveRow:
    """One move in flight, keyed by (uid, Slurm job id)."""

    uid: int
    slurm_job_id: int
    dlsub_id: str
    kind: MoveKind
    phase: MovePhase
    target_partition: str
    target_gpus: int
    since: float  # when the phase was entered (the agent's clock)
    signals: int
    created: float | None
    time_limit_min: int | None
    restart_count: int | None  # Slurm's at the signal; None: recorded before restart counts were (migrated)
    target_gpu_type: str = ""  # a move to another kind of GPU (gres:gpu:KIND:N): that kind; "": none named

    @classmethod
    def from_dict(cls, m: dict[str, Any]) -> MoveRow:
        return cls(int(m["uid"]), int(m["slurm_job_id"]), str(m.get("dlsub_id") or ""), MoveKind(m["kind"]),
                   MovePhase(m["phase"]), str(m.get("target_partition") or ""), int(m.get("target_gpus") or 0),
                   float(m["since"]), int(m.get("signals") or 0), m.get("created"), m.get("time_limit_min"),
                   None if m.get("restart_count") is None else int(m["restart_count"]),
                   str(m.get("target_gpu_type") or ""))

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "kind": self.kind.value, "phase": self.phase.value}

    def key(self) -> tuple[int, int]:
        return self.uid, self.slurm_job_id

    def view(self, restart_count: int) -> MoveView:
        """What the move rules see of it: its fields of the same names (every field of a MoveView is one of
        a MoveRow), with Slurm's restart count at its signal known (``restart_count``)."""
        return MoveView(**{name: getattr(self, name) for name in _VIEWED}, restart_count=restart_count)


#: The fields a move's row hands to the move rules as they are (its restart count may be unknown in a row).
_VIEWED = tuple(f.name for f in fields(MoveView) if f.name != "restart_count")
#: The columns of the store's ``moves`` table: a MoveRow's fields, in order.
MOVE_COLUMNS = tuple(f.name for f in fields(MoveRow))


class ResizePhase(StrEnum):
    """planned → (grow: ended, the row is dropped) | (shrink: leaving → the row ends after ``leave_wait_s``,
    the checkpoint grace).

    ``planned`` is committed before Slurm is asked. A restarted agent that
    finds one resumes it from what Slurm shows: a grow whose worker is still
    held is released (once: a released worker is no longer held), a shrink
    counts as leaving from when it was planned (its signal may have gone; a
    worker is never told twice within the wait).
    """

    PLANNED = "planned"
    LEAVING = "leaving"
    ENDED = "ended"  # never stored: the record is dropped, Slurm shows the rest (a grow's released worker)


@dataclass(frozen=True)
class ResizeRow:
    """One resize in flight, keyed by its worker task's handle ("<array id>_<task id>")."""

    worker: str
    uid: int
    dlsub_id: str
    slurm_job_id: int  # the main job
    kind: ActionKind  # GROW | SHRINK
    phase: ResizePhase
    since: float  # when the phase was entered (the agent's clock)
    reason: str = ""
    partition: str | None = None
    batch_size: int | None = None
    accumulation_steps: int | None = None
    node: str | None = None  # a grow's: the node its worker is pinned to (pinned again when a crash resumes it)


RESIZE_COLUMNS = tuple(f.name for f in fields(ResizeRow))


__all__ = ["MOVE_COLUMNS", "RESIZE_COLUMNS", "MoveRow", "ResizePhase", "ResizeRow"]
