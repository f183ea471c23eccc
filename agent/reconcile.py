"""The agent's tick: observe → decide (a pure policy) → act → record.

``Agent.tick(now)`` is the whole loop body; ``dlsub agent run`` calls it on
an interval and at the edges of the off-hours windows, tests call it with a
fake clock. One ``squeue --json`` and one ``sinfo --json`` per tick.

Trust: the agent runs as an unprivileged Slurm Operator. It acts only on
jobs whose comment marks them as dlsub's, reads progress only from the
job directory that Slurm's own record of the job points at (its output
file), and only when that directory is owned by the job's user and is not
a symlink, so nothing a user writes can make it act on someone else's job.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.jobdir import Progress, read_attempts, summarize_progress
from dlsub.agent.policy_file import AgentPolicy
from dlsub.policies import moves as planner
from dlsub.policies.moves import Action, JobInfo, MovePhase, MoveView, PartitionInfo, Rules, Window
from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.models import SlurmJob

log = logging.getLogger("dlsub.agent")


def rules_from(policy: AgentPolicy) -> Rules:
    return Rules(
        policy=policy.policy,
        moves_enabled=policy.moves.enabled,
        movable_users=policy.moves.users,
        restart_cost_s=policy.moves.restart_cost_s,
        min_saving_s=policy.moves.min_saving_s,
        checkpoint_grace_s=policy.checkpoint_grace_s,
        continue_jobs=policy.time_limits.continue_jobs,
        max_continuations=policy.time_limits.max_continuations,
        max_gpus_per_user=policy.limits.max_gpus_per_user,
        max_jobs_per_user=policy.limits.max_jobs_per_user,
        backfill_enabled=policy.backfill.enabled,
        backfill_roles=policy.backfill.roles,
    )


def trusted_job_dir(job: SlurmJob) -> Path | None:
    """The job's directory, from Slurm's record of its output file, if its owner is the job's user."""
    out = job.standard_output
    if not out.startswith("/") or job.dlsub_id is None:
        return None
    directory = Path(out).parent
    if directory.name != job.dlsub_id:
        return None
    try:
        info = os.lstat(directory)
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return None
    if job.user_id is not None and info.st_uid != job.user_id:
        return None
    return directory


@dataclass
class Observation:
    jobs: list[JobInfo]
    partitions: list[PartitionInfo]
    window: Window


class Agent:
    def __init__(self, client: SlurmClient, store: AgentStore, policy: AgentPolicy,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.store = store
        self.policy = policy
        self.rules = rules_from(policy)
        self.clock = clock

    # ---------------------------------------------------------------- observe
    def window_at(self, now: float) -> Window:
        best = Window(False)
        for window in self.policy.backfill.windows:
            is_open, change = window.state(now)
            if is_open and (not best.open or (change or 1e18) < (best.closes_at or 1e18)):
                best = Window(True, window.name, change)
        return best

    def observe(self, now: float) -> Observation:
        slurm_jobs = self.client.jobs()
        partitions = self.client.partitions()
        ours = [j for j in slurm_jobs if j.dlsub_id is not None]
        known = {p.name for p in partitions}
        moves = {m["dlsub_id"]: m for m in self.store.moves()}
        infos = []
        for job in ours:
            assert job.dlsub_id is not None
            move_row = moves.get(job.dlsub_id)
            if job.terminal and move_row is None:
                continue
            row = self.store.job(job.dlsub_id)
            tags = job.tags
            assert tags is not None
            ideal = tags.ideal or job.partition
            if ideal not in known:
                ideal = job.partition
            gpus_wanted = min(tags.gpus, 64)
            mode = tags.mode
            job_dir = trusted_job_dir(job)
            progress = summarize_progress(job_dir) if job_dir else None
            attempts = read_attempts(job_dir) if job_dir else []
            ends = [a for a in attempts if a.get("event") == "end" and a.get("slurm_job_id") == job.job_id]
            # As of the last report (seconds ago): the agent's clock may be a test's fake one.
            eta = progress.eta_s() if progress else None
            move = None
            if move_row:
                move = MoveView(move_row["kind"], MovePhase(move_row["phase"]), move_row["target_partition"],
                                int(move_row["target_gpus"]), float(move_row["since"]), int(move_row["signals"] or 0),
                                move_row.get("time_limit_min"))
            info = JobInfo(
                dlsub_id=job.dlsub_id, slurm_job_id=job.job_id, user=job.user, state=job.state,
                reason=job.reason, ended=job.terminal, partition=job.partition, mode=mode, ideal_partition=ideal,
                gpus_wanted=gpus_wanted, gpus_now=job.gpus_per_node, submit_time=float(job.submit_time),
                start_time=float(job.start_time), end_time=float(job.end_time) if job.state == "RUNNING" else 0.0,
                held=job.held,
                checkpointable=bool(progress and progress.last_checkpoint_step is not None),
                last_checkpoint_time=progress.last_checkpoint_time if progress else None,
                eta_s=eta, finished=bool(progress and progress.finished and job.state != "RUNNING"),
                last_attempt_action=ends[-1].get("action") if ends else None,
                continuations=int(row["continuations"] or 0) if row else 0,
                backfilled_from=row["backfilled_from"] if row else None,
                backfilled_limit_min=row.get("backfilled_limit_min") if row else None,
                time_limit_min=job.time_limit_min,
                move=move,
            )
            infos.append(info)
            self._record_seen(job, info, job_dir, progress, now, row)
        pending_gpus: dict[str, int] = {}
        for job in slurm_jobs:
            if job.state == "PENDING" and not job.held and job.gpus_per_node:
                if job.dlsub_id not in moves:
                    pending_gpus[job.partition] = pending_gpus.get(job.partition, 0) + job.gpus_per_node
        parts = []
        for p in partitions:
            up_nodes = tuple((n.name, n.idle_gpus, n.idle_cpus) for n in p.nodes if n.usable)
            parts.append(PartitionInfo(
                name=p.name, role=self.policy.role_of(p.name), speed=self.policy.speed_of(p.name),
                nodes=up_nodes, pending_gpus=pending_gpus.get(p.name, 0),
                max_time_s=p.max_time_min * 60.0 if p.max_time_min else None,
            ))
        return Observation(infos, parts, self.window_at(now))

    def _record_seen(self, job: SlurmJob, info: JobInfo, job_dir: Path | None, progress: Progress | None,
                     now: float, row: dict | None) -> None:
        fields = {
            "dlsub_id": info.dlsub_id, "user": info.user, "slurm_job_id": info.slurm_job_id,
            "job_dir": str(job_dir) if job_dir else None, "mode": info.mode,
            "ideal_partition": info.ideal_partition, "gpus_wanted": info.gpus_wanted, "last_seen": now,
            "last_state": info.state, "last_partition": info.partition,
        }
        if row is None:
            fields.update(first_seen=now, continuations=0)
        self.store.upsert_job(fields)
        if job.state == "RUNNING":
            self.store.record_attempt({
                "slurm_job_id": job.job_id, "restart": job.restart_count, "dlsub_id": info.dlsub_id,
                "partition": job.partition, "nodes": job.nodes, "first_seen": now,
                "start_time": float(job.start_time), "state": job.state,
            })
        if progress is not None and progress.step is not None:
            self.store.record_progress({
                "dlsub_id": info.dlsub_id, "time": now, "step": progress.step, "eta_s": info.eta_s,
                "steps_per_s": progress.steps_per_s, "checkpoint_step": progress.last_checkpoint_step,
                "partition": job.partition,
            })

    # ---------------------------------------------------------------- act
    def act(self, action: Action, now: float, user: str) -> None:
        store, client = self.store, self.client
        job_id, dlsub_id = action.slurm_job_id, action.dlsub_id
        if action.kind == planner.NOTE:
            row = store.job(dlsub_id)
            if row and row.get("last_note") == action.reason:
                return  # said already
            store.set_job(dlsub_id, last_note=action.reason)
            store.decide(now, dlsub_id, job_id, user, "wait", action.reason, action.details)
            return
        if action.kind == planner.SIGNAL_MOVE:
            self._signal(action, now, user, str(action.details.get("kind") or "move"), "USR2")
            return
        if action.kind == planner.SIGNAL_CONTINUE:
            self._signal(action, now, user, "continue", "USR1")
            return
        if action.kind == planner.RETARGET:
            client.retarget(job_id, action.partition or "", action.gpus or 0, action.time_limit_min)
            store.set_move(dlsub_id, phase=MovePhase.UPDATED.value)
            return
        if action.kind == planner.RELEASE:
            client.release(job_id)
            store.set_move(dlsub_id, phase=MovePhase.RELEASED.value, since=now)
            return
        if action.kind == planner.LIFT_BEGIN_TIME:
            client.update_job(job_id, StartTime="now")
            if store.move(dlsub_id) is None:
                store.decide(now, dlsub_id, job_id, user, "resume", action.reason)
            return
        if action.kind in (planner.FINISH_MOVE, planner.ABANDON_MOVE):
            move = store.move(dlsub_id)
            store.end_move(dlsub_id)
            if move and move["kind"] == "return":
                store.set_job(dlsub_id, backfilled_from=None)
            what = "done" if action.kind == planner.FINISH_MOVE else "abandoned"
            store.decide(now, dlsub_id, job_id, user, f"{move['kind'] if move else 'move'}-{what}", action.reason)
            return
        if action.kind == planner.BACKFILL:
            row = store.job(dlsub_id) or {}
            # Write-ahead, as for moves: where it came from is known before it leaves.
            store.set_job(dlsub_id, backfilled_from=row.get("last_partition"),
                          backfilled_limit_min=action.details.get("limit_min"))
            store.decide(now, dlsub_id, job_id, user, "backfill", action.reason, action.details)
            client.retarget(job_id, action.partition or "", action.gpus or 0, action.time_limit_min)
            return
        raise ValueError(f"unknown action {action.kind}")

    def _signal(self, action: Action, now: float, user: str, kind: str, signal: str) -> None:
        """Ask the job's batch shell to checkpoint (USR2: for a move, USR1: to continue), recording the move first.

        Write-ahead: the intent exists before the signal, so a crash in between re-sends it.
        """
        store, dlsub_id = self.store, action.dlsub_id
        move = store.move(dlsub_id)
        if move is None:
            move = {
                "dlsub_id": dlsub_id, "slurm_job_id": action.slurm_job_id, "kind": kind,
                "phase": MovePhase.PLANNED.value, "target_partition": action.partition or "",
                "target_gpus": action.gpus or 0, "since": now, "signals": 0, "created": now,
                "time_limit_min": action.time_limit_min,
            }
            store.start_move(move)
            if kind == "continue":
                row = store.job(dlsub_id) or {}
                store.set_job(dlsub_id, continuations=int(row.get("continuations") or 0) + 1)
            store.decide(now, dlsub_id, action.slurm_job_id, user, kind, action.reason, action.details)
        self.client.cancel(action.slurm_job_id, signal=signal, batch=True)
        store.set_move(dlsub_id, phase=MovePhase.SIGNALLED.value, since=now, signals=int(move["signals"] or 0) + 1)

    # ---------------------------------------------------------------- tick
    def tick(self, now: float | None = None) -> list[Action]:
        now = self.clock() if now is None else now
        self.store.set_meta(last_tick_started=now, doing="observing")
        try:
            seen = self.observe(now)
        except SlurmError as exc:
            # Stale data: decide nothing this tick; the loop goes on.
            self.store.set_meta(doing=f"waiting for Slurm: {exc}", last_tick=now, last_error=str(exc))
            log.warning("observe failed: %s", exc)
            return []
        actions = planner.plan(seen.jobs, seen.partitions, self.rules, now, seen.window)
        users = {job.dlsub_id: job.user for job in seen.jobs}
        done = []
        for action in actions:
            user = users.get(action.dlsub_id, "")
            try:
                self.act(action, now, user)
                done.append(action)
                if action.kind != planner.NOTE:
                    log.info("%s %s (Slurm %s): %s", action.kind, action.dlsub_id, action.slurm_job_id, action.reason)
            except SlurmError as exc:
                self.store.decide(now, action.dlsub_id, action.slurm_job_id, user, "error",
                                  f"{action.kind} failed: {exc}")
                log.warning("%s %s failed: %s", action.kind, action.dlsub_id, exc)
        in_flight = self.store.moves()
        doing = (", ".join(f"{m['kind']} {m['dlsub_id']} to {m['target_partition']} ({m['phase']})" for m in in_flight)
                 or f"watching {len(seen.jobs)} dlsub job(s)")
        if seen.window.open:
            doing += f"; off-hours window '{seen.window.name}' open"
        self.store.set_meta(last_tick=now, doing=doing, jobs=len(seen.jobs), last_error=None)
        return done
