"""The value objects the move rules read and return (pure): a job, a partition, a user's usage, the
policy's rules, the backfill window, a move in flight, and an action (see :mod:`.move_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dlsub.policies.actions.kinds import ActionKind, MoveKind


class MovePhase(StrEnum):
    """planned → signalled → (job requeued held) → updated → released → done.

    ``planned`` is written before the signal is sent, so a crash between the
    two re-sends it. A job that ends on its own during a move makes it
    ``abandoned``.
    """

    PLANNED = "planned"
    SIGNALLED = "signalled"
    UPDATED = "updated"
    RELEASED = "released"
    DONE = "done"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class MoveView:
    kind: MoveKind
    phase: MovePhase
    target_partition: str
    target_gpus: int
    since: float  # when the phase was entered (the agent's clock)
    signals: int = 0
    time_limit_min: int | None = None
    restart_count: int = 0  # Slurm's restart count of the job when the move was signalled
    target_gpu_type: str = ""  # a move to another kind of GPU: that kind ("": the move names none)


@dataclass(frozen=True)
class BudgetLeft:
    """What one budget that bounds a job has left this period (None: that amount has no bound)."""

    scope: str  # whose budget, as a note says it: "user alice", "account vision"
    node_hours: float | None = None
    cost: float | None = None


@dataclass(frozen=True)
class Asked:
    """What a job's submit asked for (the request the agent trusts): where and how it wants to run."""

    mode: str  # immediate | ideal
    ideal_partition: str
    gpus_wanted: int
    gpu_type: str | None = None  # the kind of GPU its user asked for (None: any): a move onto GPUs asks for it
    time_limit_min: int | None = None  # the limit it was submitted with (never raised beyond it)
    # Submit tagged it as a script that uses no library (``script=plain``): only such a job is restarted from
    # scratch, so that a job submitted by hand, or dressed up as dlsub's, is never thrown back to its start.
    plain_script: bool = False


@dataclass(frozen=True)
class Reported:
    """What a job's training reported in its progress file (as far as the agent has read it)."""

    # It saves when asked: it has checkpointed, or since its latest start its loop has polled should_stop()
    # (contract.EVENT_POLLS) or a framework adapter declared it (contract.SAVES_ON_REQUEST).
    checkpointable: bool = False
    last_checkpoint_time: float | None = None
    eta_s: float | None = None
    finished: bool = False
    ran_s: float | None = None  # how long it has reported progress (for a job that declares no total)
    # Its training wrote its start event (checkpointing.init()): it uses dlsub's library. False only when the
    # agent read the job's files this tick and found none: with its attempt running past plain_grace_s, a
    # script that uses no library (it cannot checkpoint; see move_rules.uses_no_library).
    library_started: bool = True


@dataclass(frozen=True)
class History:
    """What became of a job's earlier attempts: how they ended, its continuations, a backfill it is in."""

    last_attempt_action: str | None = None  # "requeue" or "move" when the last attempt ended that way
    continuations: int = 0
    backfilled_from: str | None = None  # the partition it waited in before a backfill
    backfilled_limit_min: int | None = None  # its own time limit, restored when it goes back
    requeues: int = 0  # resume-requeues of this Slurm job (its attempt records); moves do not count
    launch_releases: int = 0  # how often the agent released it after Slurm held it for a failed launch


@dataclass(frozen=True)
class JobInfo:
    """One followed job as the move rules see it: Slurm's view of it now, with what it asked for, what it
    reported and what became of its earlier attempts, each a record of its own."""

    dlsub_id: str
    slurm_job_id: int
    user: str
    state: str  # Slurm's: PENDING, RUNNING, ...
    reason: str
    ended: bool  # Slurm's state is a final one (completed, failed, cancelled, timed out, ...)
    partition: str
    gpus_now: int
    submit_time: float
    start_time: float
    end_time: float  # when the current allocation's time limit ends (0: none known)
    asked: Asked
    reported: Reported = Reported()
    history: History = History()
    held: bool = False
    move: MoveView | None = None
    uid: int = 0  # Slurm's user_id of the job: limits are per uid
    restart_count: int = 0  # Slurm's restart count
    # A gang (several nodes) or an elastic job: resized by policies.actions.resize_rules, never moved or backfilled.
    gang: bool = False
    # The budgets that bound this job's owner (user's, account's); empty: none, anything may move.
    budgets: tuple[BudgetLeft, ...] = ()
    # The partitions Slurm would refuse this job (AllowGroups, AllowAccounts, DenyAccounts against its user's
    # groups and its account): never a move's target.
    barred: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Usage:
    """What one user holds in Slurm: every job of that uid, dlsub's or not, running or pending."""

    gpus: int = 0
    jobs: int = 0


@dataclass(frozen=True)
class Rules:
    """The parts of policy.toml the planner needs, as plain values."""

    policy: str = "fifo"
    moves_enabled: bool = True
    movable_users: tuple[str, ...] = ("*",)
    restart_cost_s: float = 60.0
    min_saving_s: float = 60.0
    checkpoint_grace_s: float = 90.0
    continue_jobs: bool = True
    max_continuations: int = 20
    max_gpus_per_user: int = 64
    max_jobs_per_user: int = 100
    max_gpus_per_job: int = 8
    backfill_enabled: bool = True
    backfill_roles: tuple[str, ...] = ("dev", "cpu")
    job_cpus: int = 2
    budget_period: str = "month"  # day | week | month: what the budgets' notes call the period
    plain_scripts: str = "restart"  # restart | wait: what becomes of a job that uses no library (policy.toml)
    restart_plain_max_s: float = 600.0  # the most run time such a restart may throw away
    plain_grace_s: float = 120.0  # how long an attempt may run without its start event

    def may_move(self, user: str) -> bool:
        return self.moves_enabled and ("*" in self.movable_users or user in self.movable_users)


@dataclass(frozen=True)
class WindowState:
    """The state of the backfill windows at ``now``: open or not, and when that changes."""

    open: bool
    name: str = ""
    closes_at: float | None = None


@dataclass(frozen=True)
class Action:
    """One thing to do to one job, and why, in words a user reads in `dlsub why`."""

    kind: ActionKind
    dlsub_id: str
    slurm_job_id: int
    reason: str
    partition: str | None = None
    gpus: int | None = None
    details: dict[str, float | str | int | None] = field(default_factory=dict)
    time_limit_min: int | None = None  # set the job's time limit too (backfill, and back)
    move_kind: MoveKind = MoveKind.MOVE  # what a SIGNAL_MOVE starts or sends again: a move, or a return
    gpu_type: str = ""  # a move's (RETARGET's) kind of GPU: its GPUs asked for as gres:gpu:KIND:N ("": untyped)
