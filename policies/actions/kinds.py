"""Every kind of action the agent carries out, moves and resizes alike (pure: no I/O).

One vocabulary for the action rules (:mod:`.move_rules`, :mod:`.resize_rules`)
and the agent, which looks each kind up in one table (``dlsub.agent.act``:
its write-ahead step, its Slurm call, the phase it leads to, its
failpoints). The values are what decisions and logs have always said.

A move (or a return from a backfill window): SIGNAL_MOVE, then once the job
is requeued held RETARGET and RELEASE, then FINISH_MOVE (or ABANDON_MOVE).
A move of an elastic job to another kind of GPU in its partition is a move
whose target names that kind (its RETARGET asks for ``gres:gpu:KIND:N``).
A restart of a job that does not checkpoint (a script that uses no dlsub
library) onto its GPU partition, from scratch: RESTART (the agent requeues it
held itself: there is nothing to save), then RETARGET and RELEASE as a move.
A continuation before a time limit: SIGNAL_CONTINUE, then FINISH_MOVE.
A job sent back for its GPUs (its attempt on CPUs died of torch's no-GPU error, and its launcher requeued it
held): SEND_FOR_GPU records the move as signalled (there is nothing to signal), then RETARGET and RELEASE as a
move, and it waits for its GPUs there.
A backfill: BACKFILL (a pending job pointed at an idle dev partition).
An elastic job: GROW (release a held worker task), SHRINK (tell a running
one to leave), END_WORKERS (cancel the workers of an ended job).
NOTE changes nothing in Slurm: a decision worth telling the user, once.
PLACE: an elastic job that waits, asked for as the kind of GPU the typed policy places it on (or any kind
again, where that kind can no longer be freed for it).
RELEASE_FAILED_LAUNCH: a job Slurm requeued held because its launch failed, released (a bounded number of times).

:class:`MoveKind` says what a move in flight is for: onto the partition the
job wants (``move``), back out of a backfill window (``return``), onto it
from scratch for a job that does not checkpoint (``restart``), or a
continuation in a new attempt before a time limit (``continue``).
"""

from __future__ import annotations

from enum import StrEnum


class ActionKind(StrEnum):
    SIGNAL_MOVE = "signal-move"  # SIGUSR2 to the batch shell: checkpoint, requeue held
    RESTART = "restart"  # scontrol requeuehold by the agent: a job that does not checkpoint, restarted elsewhere
    SIGNAL_CONTINUE = "signal-continue"  # SIGUSR1: checkpoint, requeue (same partition)
    RETARGET = "retarget"  # scontrol update Partition=... TresPerNode=... (pending job)
    RELEASE = "release"  # scontrol release (Slurm's requeue wait still applies)
    FINISH_MOVE = "finish-move"  # the move is complete (bookkeeping)
    ABANDON_MOVE = "abandon-move"
    BACKFILL = "backfill"  # a RETARGET into a backfill partition
    NOTE = "note"  # no action; a decision worth telling the user (once)
    GROW = "grow"  # release one held worker task (it joins the group's rendezvous)
    SHRINK = "shrink"  # MOVE_SIGNAL to one running worker: checkpoint, leave, requeue held
    END_WORKERS = "end-workers"  # cancel the worker array of an ended job
    SEND_FOR_GPU = "send-for-gpu"  # no Slurm call: a move of a job whose launcher requeued it held, needing a GPU
    PLACE = "place"  # scontrol update TresPerNode=gres:gpu:KIND:N of a waiting elastic job ("": any kind again)
    RELEASE_FAILED_LAUNCH = "release-failed-launch"  # scontrol release of a job Slurm held after a failed launch


class MoveKind(StrEnum):
    MOVE = "move"  # onto the partition the job wants (immediate mode)
    RETURN = "return"  # out of a backfill window, back to the partition it waited in
    CONTINUE = "continue"  # checkpointed before its time limit, continued in a new attempt
    RESTART = "restart"  # a job that does not checkpoint, requeued onto the partition it wants, from scratch
    NEEDS_GPU = "needs-gpu"  # died on CPUs for want of a GPU: sent to wait for one where it wants to run


#: The kinds that change nothing in Slurm: written ahead as decisions (and a move's record), never carried out.
BOOKKEEPING = frozenset({ActionKind.NOTE, ActionKind.SEND_FOR_GPU, ActionKind.FINISH_MOVE, ActionKind.ABANDON_MOVE})


__all__ = ["BOOKKEEPING", "ActionKind", "MoveKind"]
