"""Act: what the agent does in Slurm for each kind of action, in one table.

``STEPS`` maps each :class:`ActionKind` to its step: the write-ahead
(``prepare``, a function: record the decision, and a move's or resize's
intent, in the tick's first transaction), the Slurm call (none for the
kinds that change nothing in Slurm, ``kinds.BOOKKEEPING``), the phase its
record enters once the call is made (a move's :class:`MovePhase`, a resize's
:class:`ResizePhase`; ``ResizePhase.ENDED``: the record is dropped, Slurm
shows the rest), and its failpoints (where a crash test
may kill the tick: ``before`` the call, once it is ``sent`` and not yet
recorded, and ``after`` its outcome is recorded).

This is the module that sends the move signal (``MOVE_SIGNAL``, USR2, to a
job's batch shell), requeues held a job that does not checkpoint to restart
it elsewhere, and releases or signals an elastic job's workers.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from dlsub.agent import failpoints
from dlsub.agent.decide import Plan
from dlsub.agent.job_mailbox import MailboxError, publish_batch
from dlsub.agent.observe import Observation
from dlsub.agent.records import MoveRow, ResizePhase, ResizeRow
from dlsub.agent.store_rows import JobRow, Writes, moves_after
from dlsub.contract import CHECKPOINT_SIGNAL, MOVE_SIGNAL
from dlsub.policies.actions.kinds import BOOKKEEPING, MoveKind
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.move_views import Action, MovePhase
from dlsub.policies.actions.resize_rules import ElasticJob, Resize
from dlsub.slurm_plugins.client import SlurmClient, SlurmError

log = logging.getLogger("dlsub.agent")

Item = Action | Resize


ItemT = TypeVar("ItemT", Action, Resize)


@dataclass(frozen=True)
class Step(Generic[ItemT]):
    """What the agent does for one kind of action (see the module's docstring): a move's kinds are steps of an
    :class:`Action`, a resize's of a :class:`Resize`."""

    prepare: Callable[[Observation, ItemT, float, Writes], None]  # writes it ahead
    call: Callable[[SlurmClient, ItemT], None] | None = None  # None: bookkeeping (kinds.BOOKKEEPING)
    phase: MovePhase | ResizePhase | None = None
    before: str = ""
    sent: str = ""
    after: str = ""


@dataclass(frozen=True)
class Outcome:
    """What one tick's act step did: what to record, the actions done (bookkeeping ones included), and the
    items whose ``after`` failpoints come once that is recorded."""

    writes: Writes
    done: tuple[Action, ...]
    finished: tuple[Item, ...]


def _retarget(client: SlurmClient, a: Action) -> None:
    client.retarget(a.slurm_job_id, a.partition or "", a.gpus or 0, a.time_limit_min, a.gpu_type)


def _place(client: SlurmClient, a: Action) -> None:
    """A waiting job's kind of GPU. One that Slurm started since the tick read the queue has nothing to place."""
    try:
        _retarget(client, a)
    except SlurmError as exc:
        if "no longer pending" not in str(exc):
            raise
        log.info("job %s started before it was placed: %s", a.slurm_job_id, exc)


def _handle(r: Resize) -> str:
    assert r.worker is not None, f"a {r.kind} names its worker task"
    return r.worker


def _array(r: Resize) -> int:
    assert r.array is not None, f"a {r.kind} names its worker array"
    return r.array


def _grow(client: SlurmClient, r: Resize) -> None:
    """Point the held worker at its main job's partition and the node the rules chose (where its GPUs were
    counted), then release it.

    A Slurm that refuses the node's pin still gets the release, once the worker is on its main job's partition:
    the worker then starts wherever its GPUs are idle there, which is where a grow went before workers were
    pinned. One that refuses the partition gets none (the grow fails): a worker left on the partition its main
    job was placed away from would start on another model of GPU."""
    assert r.worker is not None
    try:
        client.point_at_node(r.worker, r.node, r.partition)
    except SlurmError as exc:
        if not r.node:
            raise  # the partition alone was refused
        log.warning("could not point worker %s at %s (%s); releasing it unpinned", r.worker, r.node, exc)
        client.point_at_node(r.worker, None, r.partition)
    client.release(r.worker)


def written_ahead(kind: K) -> bool:
    """Whether a resize of this kind keeps a record in the store's ``resizes`` while in flight."""
    return STEPS[kind].phase is not None


# ---------------------------------------------------------------- the write-ahead and act steps of a tick
def prepare(plan: Plan, obs: Observation, now: float) -> Writes:
    """The write-ahead, in one place: what observing changed in the agent's rows, then each decision of the plan
    (and a move's or resize's intent), and the resizes in flight as the plan goes on with them, committed before
    anything is done in Slurm."""
    writes = obs.changes.copy()
    writes.resizes.update(plan.resize_rows)
    writes.ended_resizes |= plan.ended_resizes
    for action in (*plan.moves, *plan.placements):
        MOVE_STEPS[action.kind].prepare(obs, action, now, writes)
    for resize in plan.resizes:
        RESIZE_STEPS[resize.kind].prepare(obs, resize, now, writes)
    for action in plan.kind_moves:
        MOVE_STEPS[action.kind].prepare(obs, action, now, writes)
    return writes


def _no_fence() -> None:
    return None


def act(client: SlurmClient, obs: Observation, plan: Plan, ahead: Writes, now: float,
        fence: Callable[[], None] = _no_fence) -> Outcome:
    """Carry out what was written ahead (``ahead``): resizes, then moves. Changes nothing it is given.

    ``fence`` is called before each action's Slurm calls, outside the handling of one job's failure: an agent
    that no longer holds its lease (it raises :class:`~dlsub.agent.lease.Deposed`) stops there, asking
    Slurm nothing more (the new holder finishes what was written ahead)."""
    outcome = Writes()
    finished: list[Item] = []
    for resize in (*plan.resumed, *plan.resizes):
        failpoints.reach(RESIZE_STEPS[resize.kind].before)
        fence()
        if _resize(client, obs, resize, now, outcome):
            finished.append(resize)
    moves = moves_after(obs.store.moves, ahead)  # the moves in flight as the write-ahead left them
    done = [a for a in plan.actions() if a.kind in BOOKKEEPING]
    for action in plan.actions():
        if action.kind in BOOKKEEPING:
            continue
        failpoints.reach(MOVE_STEPS[action.kind].before)
        fence()
        try:
            _perform(client, moves, obs, action, now, outcome)
            done.append(action)
            log.info("%s %s (Slurm %s): %s", action.kind, action.dlsub_id, action.slurm_job_id, action.reason)
        except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
            row = obs.followed[action.slurm_job_id].row
            outcome.record_decision(now, row.uid, row.dlsub_id, action.slurm_job_id, row.user, "error",
                                    f"{action.kind} failed: {exc}")
            log.warning("%s %s failed: %s", action.kind, action.dlsub_id, exc)
    return Outcome(outcome, tuple(done), (*done, *finished))


# ---------------------------------------------------------------- carry out
def _perform(client: SlurmClient, moves: Mapping[tuple[int, int], MoveRow], obs: Observation, action: Action,
             now: float, outcome: Writes) -> None:
    """Carry out one move action in Slurm and note the move's new phase."""
    step = MOVE_STEPS[action.kind]
    if step.call is None:
        raise ValueError(f"unknown action {action.kind}")
    key = obs.followed[action.slurm_job_id].row.key()
    move = moves.get(key) if step.phase is not None else None
    step.call(client, action)
    failpoints.reach(step.sent)
    if move is None or not isinstance(step.phase, MovePhase):
        return
    record = dataclasses.replace(outcome.moves.get(key, move), phase=step.phase)
    if step.phase in (MovePhase.SIGNALLED, MovePhase.RELEASED):
        record = dataclasses.replace(record, since=now)
    if step.phase == MovePhase.SIGNALLED:
        record = dataclasses.replace(record, signals=move.signals + 1)
    outcome.moves[key] = record


def _resize(client: SlurmClient, obs: Observation, resize: Resize, now: float, outcome: Writes) -> bool:
    """Carry out one resize in Slurm and note its outcome; False: it failed (recorded as an error)."""
    job = _elastic_job(obs, resize)
    step = RESIZE_STEPS[resize.kind]
    try:
        assert step.call is not None
        if resize.batch_size is not None and resize.accumulation_steps is not None:
            _tell_batch(obs, job, resize, now, outcome)
        step.call(client, resize)
        failpoints.reach(step.sent)
        if step.phase == ResizePhase.ENDED and resize.worker is not None:
            outcome.ended_resizes.add(resize.worker)
        elif step.phase == ResizePhase.LEAVING and resize.worker is not None:
            outcome.resizes[resize.worker] = ResizeRow(
                resize.worker, job.uid, job.dlsub_id, job.slurm_job_id, resize.kind, ResizePhase.LEAVING, now,
                resize.reason, resize.partition)
        log.info("%s %s (worker %s): %s", resize.kind, resize.dlsub_id, _worker_text(resize), resize.reason)
        return True
    except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
        if written_ahead(resize.kind) and resize.worker is not None:
            outcome.ended_resizes.add(resize.worker)  # not done: decided afresh next tick
        outcome.record_decision(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, "error",
                                f"{resize.kind} failed: {exc}")
        log.warning("%s %s failed: %s", resize.kind, resize.dlsub_id, exc)
        return False


def _worker_text(resize: Resize) -> str | None:
    """The worker a resize is about, as its decision says it: a task's handle, or the array it ends."""
    return resize.worker if resize.array is None else str(resize.array)


def _elastic_job(obs: Observation, resize: Resize) -> ElasticJob:
    return next(j for j in obs.elastic if j.dlsub_id == resize.dlsub_id)


def _tell_batch(obs: Observation, job: ElasticJob, resize: Resize, now: float, outcome: Writes) -> None:
    """Leave the batch the policy picked in the job's mailbox before it resizes (it reads it as it restarts);
    a mailbox that cannot be written costs the job only the new batch."""
    assert resize.batch_size is not None and resize.accumulation_steps is not None
    job_dir = obs.elastic_dirs.get(job.dlsub_id)
    try:
        if not job_dir:
            raise MailboxError("no job directory is known for it")
        publish_batch(Path(job_dir), job.uid, resize.batch_size, resize.accumulation_steps, resize.reason)
    except (MailboxError, ValueError) as exc:
        outcome.record_decision(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, "skipped",
                                f"the new batch size ({resize.batch_size}) was not told to the job: {exc}; it "
                                "keeps the batch it has")


# ---------------------------------------------------------------- write-ahead, one function per kind of step
def _prepare_nothing(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    return None


def _row(obs: Observation, action: Action, writes: Writes) -> JobRow:
    """The job's row as this tick has it so far (what the write-ahead holds of it, else what was observed)."""
    row = obs.followed[action.slurm_job_id].row
    return writes.jobs.get(row.key(), row)


def _prepare_note(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    followed = obs.followed[action.slurm_job_id]
    row = _row(obs, action, writes)
    if row.data.last_note != action.reason:
        writes.updated_row(row, last_note=action.reason)
        writes.record_decision(now, row.uid, row.dlsub_id, followed.job.job_id, row.user, "wait", action.reason,
                               action.details)


def _prepare_move(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    followed = obs.followed[action.slurm_job_id]
    row, job = _row(obs, action, writes), followed.job
    if followed.info is not None and followed.info.move is None:
        kind = MoveKind.CONTINUE if action.kind == K.SIGNAL_CONTINUE else action.move_kind
        writes.moves[row.key()] = MoveRow(
            row.uid, job.job_id, row.dlsub_id, kind, MovePhase.PLANNED, action.partition or "", action.gpus or 0,
            now, 0, now, action.time_limit_min, job.restart_count, action.gpu_type)
        if kind == MoveKind.CONTINUE:
            writes.updated_row(row, continuations=row.data.continuations + 1)
        writes.record_decision(now, row.uid, row.dlsub_id, job.job_id, row.user, kind, action.reason,
                               action.details)


def _prepare_send_for_gpu(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    """A move whose requeue its launcher made: recorded as signalled before that requeue (restart count one
    less), so that the next tick retargets and releases it as any move; nothing to do in Slurm now."""
    followed = obs.followed[action.slurm_job_id]
    row, job = followed.row, followed.job
    if followed.info is not None and followed.info.move is None:
        writes.moves[row.key()] = MoveRow(
            row.uid, job.job_id, row.dlsub_id, MoveKind.NEEDS_GPU, MovePhase.SIGNALLED, action.partition or "",
            action.gpus or 0, now, 0, now, None, max(0, job.restart_count - 1), action.gpu_type)
        writes.record_decision(now, row.uid, row.dlsub_id, job.job_id, row.user, MoveKind.NEEDS_GPU,
                               action.reason, action.details)


def _prepare_end_move(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    followed = obs.followed[action.slurm_job_id]
    row = _row(obs, action, writes)
    key = row.key()
    move = followed.info.move if followed.info is not None else None
    writes.ended_moves.add(key)
    writes.moves.pop(key, None)
    if move is not None and move.kind == MoveKind.RETURN:
        writes.updated_row(row, backfilled_from=None)
    what = "done" if action.kind == K.FINISH_MOVE else "abandoned"
    writes.record_decision(now, row.uid, row.dlsub_id, followed.job.job_id, row.user,
                           f"{move.kind if move else MoveKind.MOVE}-{what}", action.reason)


def _prepare_backfill(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    followed = obs.followed[action.slurm_job_id]
    # Where it came from and its own limit are known before it leaves.
    row = writes.updated_row(_row(obs, action, writes), backfilled_from=followed.job.partition,
                             backfilled_limit_min=followed.request.time_limit_min)
    writes.record_decision(now, row.uid, row.dlsub_id, followed.job.job_id, row.user, "backfill", action.reason,
                           action.details)


def _prepare_place(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    followed = obs.followed[action.slurm_job_id]
    writes.record_decision(now, followed.row.uid, followed.row.dlsub_id, followed.job.job_id, followed.row.user,
                           "place", action.reason, action.details)


def _prepare_launch_release(obs: Observation, action: Action, now: float, writes: Writes) -> None:
    """Counted before the release is sent: a crash in between costs one of the job's releases, never more."""
    followed = obs.followed[action.slurm_job_id]
    before = _row(obs, action, writes)
    row = writes.updated_row(before, launch_releases=before.data.launch_releases + 1)
    writes.record_decision(now, row.uid, row.dlsub_id, followed.job.job_id, row.user, action.kind, action.reason)


def _prepare_resize(obs: Observation, resize: Resize, now: float, writes: Writes) -> None:
    job = _elastic_job(obs, resize)
    writes.record_decision(now, job.uid, job.dlsub_id, job.slurm_job_id, job.user, resize.kind, resize.reason,
                           {"worker": _worker_text(resize), "partition": resize.partition, "node": resize.node,
                            "nodes_before": job.members_now, "gpus_before": job.gpus_now})
    if written_ahead(resize.kind) and resize.worker is not None:
        writes.resizes[resize.worker] = ResizeRow(
            resize.worker, job.uid, job.dlsub_id, job.slurm_job_id, resize.kind, ResizePhase.PLANNED, now,
            resize.reason, resize.partition, resize.batch_size, resize.accumulation_steps, resize.node)


MOVE_STEPS: dict[K, Step[Action]] = {
    K.SIGNAL_MOVE: Step(_prepare_move, lambda c, a: c.cancel(a.slurm_job_id, signal=MOVE_SIGNAL, batch=True),
                        MovePhase.SIGNALLED, before="move-planned", sent="move-signal-sent", after="move-signalled"),
    # A job that does not checkpoint has nothing to save: the agent requeues it held itself, and the move goes
    # on from there (RETARGET, RELEASE) as any move does, through the move's failpoints.
    K.RESTART: Step(_prepare_move, lambda c, a: c.requeue_held(a.slurm_job_id), MovePhase.SIGNALLED,
                    before="move-planned", sent="move-signal-sent", after="move-signalled"),
    K.SIGNAL_CONTINUE: Step(_prepare_move,
                            lambda c, a: c.cancel(a.slurm_job_id, signal=CHECKPOINT_SIGNAL, batch=True),
                            MovePhase.SIGNALLED),
    K.RETARGET: Step(_prepare_nothing, _retarget, MovePhase.UPDATED, before="move-retarget", sent="move-updated"),
    K.RELEASE: Step(_prepare_nothing, lambda c, a: c.release(a.slurm_job_id), MovePhase.RELEASED,
                    after="move-released"),
    K.SEND_FOR_GPU: Step(_prepare_send_for_gpu),
    K.BACKFILL: Step(_prepare_backfill, _retarget),  # not a move: no record, no phase
    K.FINISH_MOVE: Step(_prepare_end_move),
    K.ABANDON_MOVE: Step(_prepare_end_move),
    K.NOTE: Step(_prepare_note),
    # Not a move: no record, no phase. Decided again each tick from Slurm's request, and asking twice is harmless.
    K.PLACE: Step(_prepare_place, _place),
    # Not a move: no record, no phase; counted on the job's row (move_rules.MAX_LAUNCH_RELEASES).
    K.RELEASE_FAILED_LAUNCH: Step(_prepare_launch_release, lambda c, a: c.release(a.slurm_job_id)),
}
RESIZE_STEPS: dict[K, Step[Resize]] = {
    K.GROW: Step(_prepare_resize, _grow, ResizePhase.ENDED, before="grow-planned",
                 sent="grow-released", after="grow-recorded"),
    K.SHRINK: Step(_prepare_resize, lambda c, r: c.signal_task(_handle(r), MOVE_SIGNAL), ResizePhase.LEAVING,
                   before="shrink-planned", sent="shrink-signal-sent", after="shrink-signalled"),
    # Not written ahead: decided again from Slurm each tick while workers are left, and cancelling twice is
    # harmless.
    K.END_WORKERS: Step(_prepare_resize, lambda c, r: c.cancel(_array(r))),
}
#: Every kind's step (the failpoints and the write-ahead records look a kind up here).
STEPS: dict[K, Step[Action] | Step[Resize]] = {**MOVE_STEPS, **RESIZE_STEPS}


__all__ = ["MOVE_STEPS", "RESIZE_STEPS", "STEPS", "Item", "Outcome", "Step", "act", "prepare", "written_ahead"]
