"""The values the agent's store holds and a tick writes: its rows, one tick's writes, and the store as a tick
reads it (:class:`StoreSnapshot`, read once at the tick's start).

Apart from :mod:`dlsub.agent.agent_store` (the SQLite file) so that the tick's steps that only read and
decide (observe, decide, act) hold values, never the store: an import contract keeps them from it, so
only the tick itself (:mod:`dlsub.agent.reconcile`) reads and writes the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlsub.agent.job_data import JobData
from dlsub.agent.records import MoveRow, ResizeRow
from dlsub.contract import JobState, check_transition


@dataclass(frozen=True)
class Decision:
    time: float
    uid: int | None
    dlsub_id: str
    slurm_job_id: int | None
    user: str
    kind: str
    reason: str
    details: dict[str, Any]


@dataclass(frozen=True)
class Binding:
    """Who owns a dlsub id: the uid that submitted it, and the evidence ("record" or "comment")."""

    uid: int
    source: str


@dataclass(frozen=True)
class NewBinding:
    """A dlsub id bound this tick to the uid that owns it, through this Slurm job (written to ``bindings``)."""

    dlsub_id: str
    uid: int
    slurm_job_id: int
    when: float
    source: str  # the evidence: "record" or "comment"


@dataclass
class JobRow:
    """One Slurm job the agent follows: (uid, slurm_job_id) and what it keeps about it."""

    uid: int
    slurm_job_id: int
    dlsub_id: str
    user: str
    state: JobState | None  # None: not seen in Slurm yet
    data: JobData = field(default_factory=JobData)

    def key(self) -> tuple[int, int]:
        return self.uid, self.slurm_job_id

    def encoded(self) -> str:
        return self.data.to_json()

    def set_state(self, new: JobState | str) -> None:
        """Move to ``new``; raises :class:`IllegalTransition` for a move the job-state model forbids."""
        self.state = check_transition(self.state, new)


@dataclass
class Writes:
    """Everything one tick (or one step of it) writes, committed in one transaction."""

    jobs: dict[tuple[int, int], JobRow] = field(default_factory=dict)
    bindings: list[NewBinding] = field(default_factory=list)  # a record-backed one replaces a comment-only one
    decisions: list[Decision] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    moves: dict[tuple[int, int], MoveRow] = field(default_factory=dict)
    ended_moves: set[tuple[int, int]] = field(default_factory=set)
    resizes: dict[str, ResizeRow] = field(default_factory=dict)
    ended_resizes: set[str] = field(default_factory=set)
    meta: dict[str, Any] = field(default_factory=dict)

    def record_decision(self, when: float, uid: int | None, dlsub_id: str, slurm_job_id: int | None, user: str,
                        kind: str, reason: str, details: dict[str, Any] | None = None) -> None:
        self.decisions.append(Decision(when, uid, dlsub_id, slurm_job_id, user, kind, reason, dict(details or {})))

    def copy(self) -> Writes:
        """A copy to add to, leaving this one as it is (the rows themselves are shared, never changed)."""
        return Writes(dict(self.jobs), list(self.bindings), list(self.decisions), list(self.progress),
                      list(self.attempts), dict(self.moves), set(self.ended_moves), dict(self.resizes),
                      set(self.ended_resizes), dict(self.meta))

    def updated_row(self, row: JobRow, **data: Any) -> JobRow:
        """The job's row with these fields of its data replaced, written: a new row over the one this tick
        wrote already (or ``row``), never a change to either."""
        base = self.jobs.get(row.key(), row)
        new = JobRow(base.uid, base.slurm_job_id, base.dlsub_id, base.user, base.state,
                     dataclasses.replace(base.data, **data))
        self.jobs[new.key()] = new
        return new

    def __bool__(self) -> bool:
        return bool(self.jobs or self.bindings or self.decisions or self.progress or self.attempts or self.moves
                    or self.ended_moves or self.resizes or self.ended_resizes or self.meta)


@dataclass(frozen=True)
class StoreSnapshot:
    """What the store holds that a tick reads, read once at its start in one read transaction."""

    jobs: Mapping[tuple[int, int], JobRow]
    bindings: Mapping[str, Binding]
    moves: Mapping[tuple[int, int], MoveRow]  # the moves in flight, by (uid, Slurm job id)
    resizes: Mapping[str, ResizeRow]  # the resizes in flight, by worker handle

    def followed_ids(self) -> set[int]:
        """The Slurm jobs the tick reads whole: those with a row, and those with a move in flight."""
        return {key[1] for key in self.jobs} | {key[1] for key in self.moves}


def moves_after(moves: Mapping[tuple[int, int], MoveRow], *writes: Writes) -> dict[tuple[int, int], MoveRow]:
    """The moves in flight once ``writes`` are committed over ``moves``, in order (ended ones go first, as in
    :meth:`~dlsub.agent.agent_store.AgentStore.write`)."""
    out = dict(moves)
    for w in writes:
        for key in w.ended_moves:
            out.pop(key, None)
        out.update(w.moves)
    return out


__all__ = ["Binding", "Decision", "JobRow", "NewBinding", "StoreSnapshot", "Writes", "moves_after"]
