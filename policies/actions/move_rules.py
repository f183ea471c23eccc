"""What the agent should do next with each dlsub job (pure: views in, actions out).

The agent observes Slurm and the jobs' progress, builds these value objects,
and carries out the actions this module returns. Nothing here talks to
Slurm or reads files, so every rule is tested with a fake clock.

Rules, checked for each job every tick:

* **Move** (immediate mode): a job running on a CPU or dev partition while
  its ideal GPU partition has room moves there (or, when another partition
  the policy file calls a GPU partition frees first, there: one Slurm would
  take it on, of the GPU kind it asked for, whose MaxTime holds its limit;
  the one that saves the most, the ideal one on a tie), if it saves when asked
  (``Reported.checkpointable``: it has checkpointed, its loop polls
  ``run.should_stop()``, or a framework adapter said so at its start), the
  policy allows moving its owner's jobs, the owner stays within the GPU
  limit, and the time it is expected to save (from its ETA and the
  partitions' relative speeds) beats the restart cost by the margin. When
  several jobs could take the same GPUs, the scheduling policy named in
  policy.toml picks which.
* **Restart from scratch** (immediate mode, a script that uses no dlsub
  library, ``uses_no_library``): such a job never checkpoints, so it cannot
  be moved with its progress. With ``[moves] plain_scripts = "restart"``,
  when its ideal GPU partition has room it is requeued there from scratch
  if the run time it would lose on its slow partition is at most
  ``restart_plain_max_s`` (it redoes that work in lost × speed here / speed
  there on the GPU); otherwise a note says why it stays. With ``"wait"``
  submit never starts such jobs on CPUs; one there anyway is left alone.
* **Sent for a GPU** (immediate mode): a job whose attempt on CPUs died of
  torch's no-GPU error is requeued held by its launcher (``needs-gpu``, once
  per job); it is retargeted to its ideal partition and released there, to
  wait for its GPUs as an ideal-mode job would.
* **Continue** past a time limit: a running job whose allocation ends
  within the checkpoint grace while it still has work to do is asked to
  checkpoint and continue in a new attempt (at most N times).
* **Backfill**: inside an off-hours window, a job waiting for its
  partition goes to an idle node of a backfill role (dev, cpu), its time
  limit cut to that partition's MaxTime; before the window closes it is
  checkpointed and sent back with its own limit. A GPU job only goes where
  there are idle GPUs: Slurm 22.05 cannot take a GPU request off a pending
  job (the job stays "never runnable" on CPU nodes), so GPU jobs reach CPU
  nodes only by being submitted there in immediate mode.
* **Requeue wait**: a job that requeued itself (or was requeued for a move)
  waits for Slurm's BeginTime, cred_expire + 1 s after the requeue (121 s by
  default). The agent leaves that wait alone: a job started again sooner on
  the node it just left is killed there ("Job credential revoked"), seen on
  the testbed. Sites shorten it with ``AuthInfo=cred_expire=N``.
* **Limits**: a move or backfill is started only while its user stays within
  the GPU and job limits, counted over everything the user holds in Slurm
  (``Usage``: every job of that uid, dlsub's or not, and moves in flight),
  plus what this same tick has already decided.
* **Budgets**: a move or backfill is started only when the node-hours it
  adds on its target (the job's remaining time there × nodes, at that
  partition's ``cost_per_node_hour``) fit in what each of its budgets (its
  user's, its account's: ``JobInfo.budgets``) has left this period, less
  what this tick has already given to other jobs of the same budget
  (:func:`dlsub.policies.actions.budget_gate.move_fits_budget`). Otherwise the job
  stays where it is and a note says how much it would use and what is left.

A move in flight is a small state machine (``MovePhase``) that each tick
advances from what Slurm shows, so a restarted agent picks it up where
Slurm is. It advances by Slurm's restart count and partition, never by
comparing Slurm's clock with the agent's, and it releases a hold only when
its own protocol placed it: held by the user's side (``JobHeldUser``, as
``scontrol requeuehold`` leaves it), requeued since the signal, and the
attempt's last record says it ended for a move. An admin's hold is never
released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from dlsub.contract import ACTION_MOVE, ACTION_NEEDS_GPU, HELD_AFTER_FAILED_LAUNCH, HELD_BY_ADMIN, HELD_BY_USER, is_held
from dlsub.policies.actions.budget_gate import move_fits_budget
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.kinds import MoveKind
from dlsub.policies.actions.move_views import (
    Action,
    JobInfo,
    MovePhase,
    Rules,
    Usage,
    WindowState,
)
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import ClusterView, JobView, Node
from dlsub.policies.registry import get_policy


class _Ids(TypedDict):
    dlsub_id: str
    slurm_job_id: int


def _hours(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _advance_move(job: JobInfo, now: float, rules: Rules) -> list[Action]:
    """The next step of a move in flight, from what Slurm shows now."""
    move = job.move
    assert move is not None
    common: _Ids = {"dlsub_id": job.dlsub_id, "slurm_job_id": job.slurm_job_id}
    if job.ended or job.reported.finished:
        # PREEMPTED is final too: Slurm will not run this job again, so nothing is left to move.
        return [Action(K.ABANDON_MOVE, reason=f"the job ended ({job.state}) before the {move.kind} finished", **common)]
    requeued = job.restart_count > move.restart_count
    if is_held(job.state, job.reason) and job.reason == HELD_BY_ADMIN:
        return [Action(K.NOTE, reason="held by an administrator: the agent leaves it held and waits "
                       f"(its {move.kind} to {move.target_partition} continues once an administrator releases it)",
                       **common)]
    if move.kind == MoveKind.CONTINUE:
        if job.state == "RUNNING" and requeued:
            return [Action(K.FINISH_MOVE, reason="continued in a new attempt", **common)]
        if job.state == "PENDING" and requeued:
            return [Action(K.FINISH_MOVE, reason="checkpointed before its time limit: continuing in a new attempt "
                           "once Slurm's requeue wait is over", **common)]
        if job.state == "RUNNING" and now - move.since > 2 * rules.checkpoint_grace_s:
            return [Action(K.SIGNAL_CONTINUE, reason="no checkpoint yet after the first request; asking again",
                           **common)]
        return []
    # move / return
    if job.state == "RUNNING":
        if requeued:
            if job.partition == move.target_partition:
                kind = f" ({move.target_gpu_type})" if move.target_gpu_type else ""
                return [Action(K.FINISH_MOVE, reason=f"running on {job.partition}{kind}", **common)]
            return [Action(K.ABANDON_MOVE, reason=f"it started again on {job.partition}, not {move.target_partition}",
                           **common)]
        if move.phase == MovePhase.PLANNED or (
            move.phase == MovePhase.SIGNALLED and now - move.since > 2 * rules.checkpoint_grace_s
        ):
            if move.kind == MoveKind.RESTART:
                why = "requeueing it held" if move.phase == MovePhase.PLANNED else \
                    "still running after the requeue; requeueing it again"
                return [Action(K.RESTART, reason=why, partition=move.target_partition, gpus=move.target_gpus,
                               move_kind=move.kind, **common)]
            why = "sending the checkpoint request" if move.phase == MovePhase.PLANNED else \
                "no checkpoint yet after the first request; asking again"
            return [Action(K.SIGNAL_MOVE, reason=why, partition=move.target_partition, gpus=move.target_gpus,
                           move_kind=move.kind, time_limit_min=move.time_limit_min,
                           gpu_type=move.target_gpu_type, **common)]
        return []
    if job.state != "PENDING" or not requeued:
        return []
    # A restart is requeued by the agent itself (its attempt ends on Slurm's signal, with no record of a move);
    # a job sent back for a GPU was requeued by its launcher, which said so.
    expected = ACTION_NEEDS_GPU if move.kind == MoveKind.NEEDS_GPU else ACTION_MOVE
    if move.kind != MoveKind.RESTART and job.history.last_attempt_action != expected:
        # Requeued, but not by the move's checkpoint (node failure, the user, Slurm): not the agent's to steer.
        return [Action(K.ABANDON_MOVE, reason="it was requeued without checkpointing for the move; left as it is",
                       **common)]
    actions = []
    # A move to another GPU kind: its GPUs asked for as that kind, once (squeue's view of a job's GRES kind is
    # not read; a crash before the phase is recorded asks again, which changes nothing).
    retype = bool(move.target_gpu_type) and move.phase in (MovePhase.PLANNED, MovePhase.SIGNALLED)
    if job.partition != move.target_partition or job.gpus_now != move.target_gpus or retype or (
            move.time_limit_min is not None and job.asked.time_limit_min != move.time_limit_min):
        there = f"{move.target_partition} ({move.target_gpu_type})" if move.target_gpu_type else move.target_partition
        actions.append(Action(K.RETARGET, reason=f"checkpointed; now for {there}",
                              partition=move.target_partition, gpus=move.target_gpus,
                              time_limit_min=move.time_limit_min, gpu_type=move.target_gpu_type, **common))
    if job.reason == HELD_BY_USER:
        actions.append(Action(K.RELEASE, reason=f"released to start on {move.target_partition}", **common))
    elif job.reason == "BeginTime" and not actions:
        return []  # Slurm's requeue wait: the move is done when the job runs there
    elif not actions:
        return [Action(K.FINISH_MOVE, reason=f"waiting to start on {move.target_partition}", **common)]
    return actions


def _sent_for_gpus(jobs: Sequence[JobInfo], rules: Rules) -> list[Action]:
    """Jobs whose attempt on CPUs died for want of a GPU (immediate mode; the launcher requeued them held, saying
    ``needs-gpu``): each is sent to wait for its GPUs on its ideal partition, as ideal mode would have placed it.
    Its launcher does this once per job, so a script that fails there too is not sent round again."""
    actions = []
    for job in jobs:
        if (job.move is None and job.state == "PENDING" and job.reason == HELD_BY_USER
                and job.history.last_attempt_action == ACTION_NEEDS_GPU and job.asked.ideal_partition
                and job.partition != job.asked.ideal_partition and job.asked.gpus_wanted > 0):
            gpus = min(job.asked.gpus_wanted, rules.max_gpus_per_job)  # as a move asks for them
            actions.append(Action(
                K.SEND_FOR_GPU, job.dlsub_id, job.slurm_job_id,
                f"its attempt on {job.partition} died for want of a GPU (torch found no CUDA device); sent to wait "
                f"for {gpus} GPU(s) on {job.asked.ideal_partition}",
                partition=job.asked.ideal_partition, gpus=gpus, move_kind=MoveKind.NEEDS_GPU,
                gpu_type=job.asked.gpu_type or ""))
    return actions


def uses_no_library(job: JobInfo, now: float, rules: Rules) -> bool:
    """Whether ``job`` is a script that uses no dlsub library: submit read it as one (its ``script=plain`` tag),
    and its attempt has run ``plain_grace_s`` without the start event ``checkpointing.init()`` writes (nor ever
    checkpointed). Both must agree: submit's reading alone can be wrong (a script whose own module imports the
    library), and the run alone is what any job submitted by hand looks like."""
    return (job.asked.plain_script and job.state == "RUNNING" and not job.reported.library_started
            and not job.reported.checkpointable
            and now - job.start_time >= rules.plain_grace_s)


#: What a job that uses no library is told, wherever dlsub says it.
NO_LIBRARY = "it uses no dlsub library, so it never checkpoints"


def _restart_or_note(job: JobInfo, here: PartitionView | None, target: PartitionView, rules: Rules,
                     now: float) -> Action | None:
    """None: this job that uses no library may be restarted on ``target`` from scratch; else a note why not."""
    common: _Ids = {"dlsub_id": job.dlsub_id, "slurm_job_id": job.slurm_job_id}
    if rules.plain_scripts != "restart":
        return Action(K.NOTE, reason=f"not moved to {target.name}: {NO_LIBRARY}, and the site does not restart "
                      "such jobs (policy.toml [moves] plain_scripts = \"wait\"); it runs here to its end", **common)
    lost = max(0.0, now - job.start_time)
    redo = lost * (here.speed if here else 1.0) / target.speed
    if lost > rules.restart_plain_max_s:
        return Action(K.NOTE, reason=(
            f"not restarted on {target.name}: {NO_LIBRARY}; a restart would lose its {_hours(lost)} of work here, "
            f"more than the {_hours(rules.restart_plain_max_s)} the site allows (policy.toml [moves] "
            "restart_plain_max_s); it runs here to its end"), details={"lost_s": round(lost), "redo_s": round(redo),
                                                                        "bound_s": round(rules.restart_plain_max_s)},
            **common)
    return None


# A move's candidate: the job, the seconds the move would save (None: a restart from scratch of a job that
# uses no library), and the partition it would move to.
Candidate = tuple[JobInfo, float | None, PartitionView]


def _has_room(part: PartitionView, job: JobInfo, rules: Rules) -> bool:
    """Whether ``part`` could start ``job`` on its GPUs now, after the jobs already waiting there."""
    gpus = job.asked.gpus_wanted
    if part.idle_gpus - part.waiting_gpus < gpus:
        return False
    return any(n.fits(gpus, rules.job_cpus) and (not job.asked.gpu_type or n.gpu_type == job.asked.gpu_type)
               for n in part.nodes)


def _may_go(part: PartitionView, job: JobInfo) -> bool:
    """Whether ``job`` may be moved to ``part``, a GPU partition other than the one submit chose for it: the
    policy file calls it a GPU partition, Slurm would take the job there, and its limit fits the job's own
    (a move never cuts a job's time limit; one unknown fits no bounded partition)."""
    limit = job.asked.time_limit_min
    return (part.role == "gpu" and part.name not in job.barred and part.name != job.partition
            and (part.max_time_s is None or (limit is not None and limit * 60 <= part.max_time_s)))


def _targets(job: JobInfo, partitions: dict[str, PartitionView], rules: Rules) -> list[PartitionView]:
    """Where ``job`` could move now: its ideal partition first, then any other GPU partition it may use, each
    with room for it now (its GPUs idle on one node, of the kind it asked for if it named one)."""
    ideal = partitions.get(job.asked.ideal_partition)
    others = sorted((p for p in partitions.values() if p is not ideal and _may_go(p, job)), key=lambda p: p.name)
    return [p for p in ([ideal] if ideal is not None else []) + others if _has_room(p, job, rules)]


def _move_candidates(jobs: Sequence[JobInfo], partitions: dict[str, PartitionView], rules: Rules,
                     now: float) -> tuple[list[Candidate], list[Action]]:
    """Jobs that could move onto GPUs now (their ideal partition, or another GPU partition they may use when
    that one frees first), each with where it would go and the seconds it would save, and notes on those that
    should not move."""
    candidates: list[Candidate] = []
    notes = []
    for job in jobs:
        if job.move is not None or job.state != "RUNNING" or job.asked.mode != "immediate" or job.gang:
            continue
        here = partitions.get(job.partition)
        if job.partition == job.asked.ideal_partition or job.asked.gpus_wanted <= 0:
            continue
        if job.history.backfilled_from:
            continue  # placed by backfill: returns when the window closes
        if here is not None and here.role == "gpu" and job.gpus_now > 0:
            continue  # on GPUs already: moved to a GPU partition that freed before its ideal one
        targets = _targets(job, partitions, rules)
        if not targets:
            continue  # nothing to decide yet: no room anywhere it may go
        common: _Ids = {"dlsub_id": job.dlsub_id, "slurm_job_id": job.slurm_job_id}
        first = targets[0]
        if not rules.may_move(job.user):
            notes.append(Action(K.NOTE, reason=f"not moved to {first.name}: the site policy does not move "
                                f"{job.user}'s jobs", **common))
            continue
        if uses_no_library(job, now, rules):
            note = _restart_or_note(job, here, first, rules, now)
            if note is None:
                candidates.append((job, None, first))
            else:
                notes.append(note)
            continue
        if not job.reported.checkpointable:
            notes.append(Action(K.NOTE, reason=f"not moved to {first.name}: the job has not written a checkpoint "
                                "yet, nor asked run.should_stop() (only jobs that save when asked are moved)",
                                **common))
            continue
        eta, basis = remaining_s(job)
        if eta is None:
            notes.append(Action(K.NOTE, reason=f"not moved to {first.name} yet: no progress reported, so no "
                                "estimate of the time a move would save", **common))
            continue
        speed_here = here.speed if here else 1.0
        # The target that saves the most; the ideal one on a tie (max keeps the first).
        saved, best = max(((eta - eta * speed_here / t.speed - rules.restart_cost_s, t) for t in targets),
                          key=lambda st: st[0])
        if saved < rules.min_saving_s:
            notes.append(Action(K.NOTE, reason=(
                f"not moved to {best.name}: it would save about {_hours(max(saved, 0))} after a restart "
                f"costing {_hours(rules.restart_cost_s)}, less than the {_hours(rules.min_saving_s)} a move must "
                f"save (ETA {_hours(eta)} here{'; ' + basis if basis else ''})"), **common))
            continue
        candidates.append((job, saved, best))
    return candidates, notes


def remaining_s(job: JobInfo) -> tuple[float | None, str]:
    """The job's remaining time here, and how it was estimated when it declared no total.

    A job that reports progress but no total is assumed to need about as long
    again as it has run: never left on CPUs forever for want of an estimate.
    """
    if job.reported.eta_s is not None:
        return job.reported.eta_s, ""
    if job.reported.ran_s is not None and job.reported.ran_s > 0:
        ran = job.reported.ran_s
        return ran, f"no total declared: assuming about as long again as the {_hours(ran)} it has run"
    return None, ""


def usage_of(jobs: Sequence[JobInfo]) -> dict[int, Usage]:
    """Usage counted from these jobs alone (when the caller has no fuller view of Slurm)."""
    usage: dict[int, Usage] = {}
    for j in jobs:
        if j.state in ("RUNNING", "PENDING"):
            held = max(j.gpus_now, j.move.target_gpus if j.move else 0)
            old = usage.get(j.uid, Usage())
            usage[j.uid] = Usage(old.gpus + held, old.jobs + 1)
    return usage


def _over_limit(job: JobInfo, extra_gpus: int, usage: dict[int, Usage], rules: Rules) -> str | None:
    """Why giving ``job`` ``extra_gpus`` more would take its user past a limit (None: it would not)."""
    mine = usage.get(job.uid, Usage())
    if mine.jobs > rules.max_jobs_per_user:
        return f"{job.user} holds {mine.jobs} jobs in Slurm, more than the limit of {rules.max_jobs_per_user} per user"
    if mine.gpus + extra_gpus > rules.max_gpus_per_user:
        return (f"{job.user} would exceed the limit of {rules.max_gpus_per_user} GPUs per user "
                f"({mine.gpus} held in Slurm and in moves, {extra_gpus} more wanted)")
    return None


def _charge(usage: dict[int, Usage], uid: int, gpus: int) -> None:
    old = usage.get(uid, Usage())
    usage[uid] = Usage(old.gpus + gpus, old.jobs)


# What this tick has already given each budget (by scope): node-hours and cost.
Granted = dict[str, tuple[float, float]]


def _over_budget(job: JobInfo, seconds: float | None, part: PartitionView, rules: Rules,
                 granted: Granted) -> str | None:
    """Why ``seconds`` more of ``job`` on ``part`` would not fit one of its budgets (None: it fits).

    ``seconds`` None: its time there is unknown, so it fits only while something is left.
    """
    nodes = 1  # moves and backfills are of single-node jobs (gangs are resized, never moved)
    price = part.cost_per_node_hour
    for budget in job.budgets:
        used_h, used_c = granted.get(budget.scope, (0.0, 0.0))
        h_left = None if budget.node_hours is None else max(0.0, budget.node_hours - used_h)
        c_left = None if budget.cost is None else max(0.0, budget.cost - used_c)
        if move_fits_budget(seconds, nodes, price, h_left, c_left):
            continue
        left = [f"{v:.2f} {unit}" for v, unit in ((h_left, "node-hours"), (c_left, "(cost)")) if v is not None]
        has = f"{budget.scope} has {' and '.join(left)} left of this {rules.budget_period}'s budget"
        if seconds is None:
            return f"{has}, and its time there is unknown"
        hours = max(0.0, seconds) / 3600.0 * nodes
        return (f"it would use about {hours:.2f} node-hours costing {hours * price:.2f} there "
                f"({_hours(seconds)} at {price:.2f} per node-hour); {has}")
    return None


def _grant(job: JobInfo, seconds: float | None, part: PartitionView, granted: Granted) -> None:
    hours = max(0.0, seconds or 0.0) / 3600.0
    for budget in job.budgets:
        used_h, used_c = granted.get(budget.scope, (0.0, 0.0))
        granted[budget.scope] = (used_h + hours, used_c + hours * part.cost_per_node_hour)


def _choose_movers(candidates: list[Candidate], usage: dict[int, Usage],
                   partitions: dict[str, PartitionView], rules: Rules, now: float,
                   granted: Granted | None = None) -> list[Action]:
    """Which candidates take the idle GPUs of the partition each would move to, by the configured scheduling
    policy."""
    actions = []
    granted = {} if granted is None else granted
    by_target: dict[str, list[tuple[JobInfo, float | None]]] = {}
    for job, saved, target in candidates:
        by_target.setdefault(target.name, []).append((job, saved))
    for name, group in by_target.items():
        there = partitions[name]
        # The partition's idle GPUs, minus what jobs already waiting there want.
        spare = there.waiting_gpus
        nodes = []
        for node in there.nodes:
            take = min(spare, node.gpus)
            spare -= take
            if node.gpus - take > 0:
                nodes.append(Node(node.name, node.gpus - take, partition=name, gpu_type=node.gpu_type or ""))
        if not nodes:
            continue
        views = [JobView(name=j.dlsub_id, arrival_s=j.submit_time,
                         gpus=min(j.asked.gpus_wanted, rules.max_gpus_per_job),
                         remaining=remaining_s(j)[0], model=_LinearModel()) for j, _ in group]
        decision = get_policy(rules.policy).decide(views, ClusterView(tuple(nodes)), now, {})
        # Oldest first, so the earlier decisions of this tick count against the later ones.
        for job, saved in sorted(group, key=lambda js: (js[0].submit_time, js[0].slurm_job_id)):
            alloc = decision.get(job.dlsub_id)
            gpus = min(job.asked.gpus_wanted, rules.max_gpus_per_job)
            if alloc is None or alloc.gpus < gpus:
                continue
            if job.asked.gpu_type and not any(n.gpu_type == job.asked.gpu_type and n.gpus >= gpus for n in nodes):
                continue  # it asked for a kind none of whose nodes has its GPUs idle
            over = _over_limit(job, max(0, gpus - job.gpus_now), usage, rules)
            if over:
                actions.append(Action(K.NOTE, job.dlsub_id, job.slurm_job_id, f"not moved to {name}: {over}"))
                continue
            eta, basis = remaining_s(job)
            # Its remaining work at the target's speed, plus the restart, is what the move adds there.
            here = partitions.get(job.partition)
            there_s = None if eta is None else (
                eta * (here.speed if here else 1.0) / there.speed + rules.restart_cost_s)
            broke = _over_budget(job, there_s, there, rules, granted)
            if broke:
                actions.append(Action(K.NOTE, job.dlsub_id, job.slurm_job_id, f"not moved to {name}: {broke}",
                                      details={"budget": "exceeded", "seconds_there": round(there_s or 0.0)}))
                continue
            _grant(job, there_s, there, granted)
            _charge(usage, job.uid, max(0, gpus - job.gpus_now))
            if saved is None:
                actions.append(_restart(job, here, there, gpus, now))
                continue
            # Never below 0: the tick's clock is read before the job's newest events, which may be newer.
            age = max(0.0, now - job.reported.last_checkpoint_time) if job.reported.last_checkpoint_time else None
            actions.append(Action(
                K.SIGNAL_MOVE, job.dlsub_id, job.slurm_job_id,
                f"moving to {name}: {there.idle_gpus} GPU(s) idle"
                + (f", checkpoint {_hours(age)} old" if age is not None else "")
                + f", est. {_hours(saved)} saved" + (f" ({basis})" if basis else "")
                + (f"; {job.asked.ideal_partition}, where it was to go, has no room for it now"
                   if name != job.asked.ideal_partition else ""),
                partition=name, gpus=gpus, gpu_type=job.asked.gpu_type or "",
                details={"saved_s": round(saved), "idle_gpus": there.idle_gpus, "eta_s": round(eta or 0.0),
                         "checkpoint_age_s": round(age) if age is not None else None,
                         "eta_basis": basis or None},
            ))
    return actions


def _restart(job: JobInfo, here: PartitionView | None, target: PartitionView, gpus: int, now: float) -> Action:
    """Requeue a job that uses no library onto ``target``, from scratch, saying what it loses."""
    lost = max(0.0, now - job.start_time)
    redo = lost * (here.speed if here else 1.0) / target.speed
    where = f"on {here.name} " if here else ""
    return Action(
        K.RESTART, job.dlsub_id, job.slurm_job_id,
        f"restarting on {target.name} from scratch: {NO_LIBRARY}; {_hours(lost)} of work {where}lost, redone "
        f"there in about {_hours(redo)}; {target.idle_gpus} GPU(s) idle",
        partition=target.name, gpus=gpus, move_kind=MoveKind.RESTART, gpu_type=job.asked.gpu_type or "",
        details={"lost_s": round(lost), "redo_s": round(redo), "idle_gpus": target.idle_gpus},
    )


class _LinearModel:
    """What the agent knows of a job's scaling: nothing measured, so linear in GPUs. With the job's
    ETA as its remaining work, policies that weigh GPUs by remaining time can rank jobs."""

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        return 1.0 / max(sum(placement), 1)

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement))

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 1, float(sum(placement))


def _continuations(jobs: Sequence[JobInfo], partitions: dict[str, PartitionView], rules: Rules,
                   now: float) -> list[Action]:
    actions = []
    for job in jobs:
        if job.move is not None or job.state != "RUNNING" or not job.end_time:
            continue
        left = job.end_time - now
        if left > rules.checkpoint_grace_s:
            continue
        common: _Ids = {"dlsub_id": job.dlsub_id, "slurm_job_id": job.slurm_job_id}
        if job.reported.finished or (job.reported.eta_s is not None and job.reported.eta_s <= max(left, 0)):
            continue  # it will finish in time
        if not rules.continue_jobs:
            actions.append(Action(K.NOTE, reason=f"its time limit on {job.partition} ends in {_hours(max(left, 0))}; "
                                  "the site policy does not continue jobs past it", **common))
        elif uses_no_library(job, now, rules):
            actions.append(Action(K.NOTE, reason=f"its time limit is near; {NO_LIBRARY}: not continued (it ends "
                                  "at its limit)", **common))
        elif not job.reported.checkpointable:
            actions.append(Action(K.NOTE, reason="its time limit is near but it has not checkpointed: not continued",
                                  **common))
        elif max(job.history.continuations, job.history.requeues) >= rules.max_continuations:
            done = max(job.history.continuations, job.history.requeues)
            actions.append(Action(K.NOTE, reason=f"time limit near; already continued {done} times, "
                                  f"the most the site allows", **common))
        else:
            eta = f", about {_hours(job.reported.eta_s)} of work left" if job.reported.eta_s is not None else ""
            actions.append(Action(K.SIGNAL_CONTINUE, reason=(
                f"its time limit on {job.partition} ends in {_hours(max(left, 0))}{eta}: checkpointing to "
                f"continue in a new attempt ({job.history.continuations + 1} of at most {rules.max_continuations})"),
                partition=job.partition, **common))
    return actions


def _backfill(jobs: Sequence[JobInfo], partitions: dict[str, PartitionView], rules: Rules, window: WindowState,
              now: float, usage: dict[int, Usage], granted: Granted | None = None) -> list[Action]:
    actions: list[Action] = []
    granted = {} if granted is None else granted
    if not rules.backfill_enabled:
        return actions
    if window.open:
        closes_in = (window.closes_at - now) if window.closes_at else None
        if closes_in is not None and closes_in <= 2 * rules.checkpoint_grace_s + rules.restart_cost_s:
            pass  # too late to start anything in this window
        else:
            taken: dict[str, int] = {}
            for job in sorted(jobs, key=lambda j: j.submit_time):
                if (job.move is not None or job.state != "PENDING" or job.held or job.history.backfilled_from
                        or job.gang):
                    continue
                if job.reason not in ("Resources", "Priority", "ReqNodeNotAvail", (
                        "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions")):
                    continue
                gpus = min(job.asked.gpus_wanted, rules.max_gpus_per_job)
                if _over_limit(job, max(0, gpus - job.gpus_now), usage, rules):
                    continue
                broke: list[str] = []
                for part in partitions.values():
                    if part.role not in rules.backfill_roles or part.name == job.partition:
                        continue
                    free_nodes = [n.name for n in part.nodes if n.fits(gpus, rules.job_cpus)
                                  and (not job.asked.gpu_type or n.gpu_type == job.asked.gpu_type)]
                    if len(free_nodes) <= taken.get(part.name, 0):
                        continue
                    # Never above the limit it was submitted with; cut to the partition's MaxTime.
                    limit = job.asked.time_limit_min
                    if part.max_time_s is not None and (limit is None or limit * 60 > part.max_time_s):
                        limit = int(part.max_time_s // 60)
                    there_s = _backfill_seconds(job, limit, closes_in)
                    why = _over_budget(job, there_s, part, rules, granted)
                    if why:
                        broke.append(f"not backfilled onto {part.name}: {why}")
                        continue
                    _grant(job, there_s, part, granted)
                    taken[part.name] = taken.get(part.name, 0) + 1
                    _charge(usage, job.uid, max(0, gpus - job.gpus_now))
                    actions.append(Action(K.BACKFILL, job.dlsub_id, job.slurm_job_id,
                                          f"off-hours window '{window.name}' is open and {part.name} is idle: "
                                          f"starting there instead of waiting for {job.partition}",
                                          partition=part.name, gpus=gpus, time_limit_min=limit,
                                          gpu_type=job.asked.gpu_type or "",
                                          details={"from": job.partition, "limit_min": job.asked.time_limit_min}))
                    break
                else:
                    if broke:
                        actions.append(Action(K.NOTE, job.dlsub_id, job.slurm_job_id, "; ".join(broke),
                                              details={"budget": "exceeded"}))
    for job in jobs:
        if not job.history.backfilled_from or job.move is not None or job.state != "RUNNING":
            continue
        closes_in = (window.closes_at - now) if (window.open and window.closes_at) else 0.0
        if closes_in <= 2 * rules.checkpoint_grace_s:
            why = (f"the off-hours window '{window.name}' closes in {_hours(max(closes_in, 0))}"
                   if window.open else "the off-hours window has closed")
            actions.append(Action(K.SIGNAL_MOVE, job.dlsub_id, job.slurm_job_id,
                                  f"{why}: checkpointing and moving back to {job.history.backfilled_from}",
                                  partition=job.history.backfilled_from, gpus=job.asked.gpus_wanted,
                                  move_kind=MoveKind.RETURN, time_limit_min=job.history.backfilled_limit_min,
                                  gpu_type=job.asked.gpu_type or ""))
    return actions


def _backfill_seconds(job: JobInfo, limit_min: int | None, closes_in: float | None) -> float | None:
    """The most a backfill may run on its partition: its remaining work, its limit there, the window's end."""
    bounds = [b for b in (remaining_s(job)[0], limit_min * 60.0 if limit_min is not None else None, closes_in)
              if b is not None]
    return min(bounds) if bounds else None


_CLOSED = WindowState(False)  # no backfill window open (frozen: one default shared by every call)

#: The most times the agent releases one job that Slurm held after a failed launch. Slurm drains the node the
#: launch failed on, so the next start goes elsewhere; a job whose launches keep failing is left held, and said
#: so, for its user and the admin to look at (a broken image or path fails every node alike).
MAX_LAUNCH_RELEASES = 3


def _failed_launches(jobs: Sequence[JobInfo]) -> list[Action]:
    """A job Slurm requeued held because its batch script could not be launched (``HELD_AFTER_FAILED_LAUNCH``)
    would wait for ever, though nothing is wrong with it: seen when a node came back from a cut link still
    holding the job's previous attempt and Slurm started the requeued job there again at once ("Duplicate
    jobid"). Released, at most MAX_LAUNCH_RELEASES times (an administrator's hold has another reason and is
    never released)."""
    actions = []
    for job in jobs:
        if job.state != "PENDING" or job.reason != HELD_AFTER_FAILED_LAUNCH:
            continue
        done = job.history.launch_releases
        ids: _Ids = {"dlsub_id": job.dlsub_id, "slurm_job_id": job.slurm_job_id}
        if done >= MAX_LAUNCH_RELEASES:
            actions.append(Action(K.NOTE, reason=f"held by Slurm after its launch failed again ({done} releases "
                                  "already): left held; `scontrol show job` and `sinfo -R` say why, and an "
                                  "administrator or its user may release it", **ids))
        else:
            actions.append(Action(K.RELEASE_FAILED_LAUNCH, reason=f"released after Slurm held it for a failed "
                                  f"launch (release {done + 1} of at most {MAX_LAUNCH_RELEASES}; `sinfo -R` names "
                                  "the node it drained)", **ids))
    return actions


def plan(jobs: Sequence[JobInfo], partitions: Sequence[PartitionView], rules: Rules, now: float,
         window: WindowState = _CLOSED, usage: Mapping[int, Usage] | None = None) -> list[Action]:
    """Everything the agent should do this tick, moves in flight first.

    ``usage`` is what each uid holds in Slurm (all its jobs, moves in
    flight); without it, it is counted from ``jobs``. Moves and backfills
    decided here are added to it as they are decided.
    """
    by_name = {p.name: p for p in partitions}
    usage = dict(usage_of(jobs) if usage is None else usage)
    actions = _failed_launches(jobs)
    released = {a.slurm_job_id for a in actions}
    jobs = [j for j in jobs if j.slurm_job_id not in released]
    for job in jobs:
        if job.move is not None:
            actions += _advance_move(job, now, rules)
    actions += _sent_for_gpus(jobs, rules)
    actions += _continuations(jobs, by_name, rules, now)
    granted: Granted = {}  # budgets given this tick, shared by backfills and moves
    actions += _backfill(jobs, by_name, rules, window, now, usage, granted)
    busy = {a.slurm_job_id for a in actions if a.kind != K.NOTE}
    candidates, notes = _move_candidates([j for j in jobs if j.slurm_job_id not in busy], by_name, rules, now)
    actions += notes
    actions += _choose_movers(candidates, usage, by_name, rules, now, granted)
    return actions


__all__ = ["MAX_LAUNCH_RELEASES", "NO_LIBRARY", "plan", "remaining_s", "usage_of", "uses_no_library"]
