"""Unit tests (pure, fake clock; no Slurm): the agent's planner, policies/actions/move_rules.py."""

from __future__ import annotations

from dataclasses import replace

from move_jobs import changed, job_info

from dlsub.contract import HELD_AFTER_FAILED_LAUNCH
from dlsub.policies.actions import move_rules as m
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.kinds import MoveKind
from dlsub.policies.actions.move_views import (
    Action,
    JobInfo,
    MovePhase,
    MoveView,
    Rules,
    Usage,
    WindowState,
)
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import IdleNode

NOW = 1_000_000.0
RULES = Rules(restart_cost_s=60, min_saving_s=60, checkpoint_grace_s=90)


def parts(gpu_idle: int = 4, cpu_idle_cpus: int = 4) -> list[PartitionView]:
    return [
        PartitionView("gpu", (IdleNode("gpu1", gpu_idle, 4),), role="gpu", speed=1.0),
        PartitionView("gpu-dev", (IdleNode("gpu1", gpu_idle, 4),), role="dev", speed=1.0, max_time_s=600),
        PartitionView("cpu", (IdleNode("cpu1", 0, cpu_idle_cpus),), role="cpu", speed=0.1),
    ]


def job(**kw: object) -> JobInfo:
    return job_info(NOW, **kw)


def kinds(actions: list[Action]) -> list[str]:
    return [a.kind for a in actions]


def test_moves_a_checkpointing_cpu_job_when_gpus_go_idle_and_says_why() -> None:
    actions = m.plan([job()], parts(), RULES, NOW)
    assert kinds(actions) == [K.SIGNAL_MOVE]
    a = actions[0]
    assert a.partition == "gpu" and a.gpus == 1
    assert "moving to gpu: 4 GPU(s) idle, checkpoint 40 s old, est. 2.7 h saved" == a.reason


def test_a_checkpoint_written_after_the_tick_read_its_clock_is_0_s_old_not_minus_0() -> None:
    """The tick reads its clock before the jobs' events: a checkpoint a moment newer (seen live: "checkpoint
    -0 s old") is 0 s old."""
    (a,) = m.plan([job(last_checkpoint_time=NOW + 0.4)], parts(), RULES, NOW)
    assert "checkpoint 0 s old" in a.reason and a.details["checkpoint_age_s"] == 0, a.reason


def test_no_move_while_gpus_are_busy_or_taken_by_waiting_jobs() -> None:
    assert m.plan([job()], parts(gpu_idle=0), RULES, NOW) == []
    busy = [replace(p, waiting_gpus=4) if p.name == "gpu" else p for p in parts()]
    assert m.plan([job()], busy, RULES, NOW) == []


def test_only_checkpointing_jobs_move_and_the_agent_says_so() -> None:
    actions = m.plan([job(checkpointable=False)], parts(), RULES, NOW)
    assert kinds(actions) == [K.NOTE] and "has not written a checkpoint" in actions[0].reason


def test_a_move_not_worth_its_restart_is_not_made() -> None:
    actions = m.plan([job(eta_s=100.0)], parts(), RULES, NOW)
    assert kinds(actions) == [K.NOTE]
    assert "not moved to gpu: it would save about" in actions[0].reason and "restart" in actions[0].reason


def test_a_job_slurm_held_after_a_failed_launch_is_released_and_nothing_else_is_done_to_it() -> None:
    held = job(state="PENDING", reason=HELD_AFTER_FAILED_LAUNCH, partition="cpu")
    (a,) = m.plan([held], parts(), RULES, NOW)
    assert a.kind == K.RELEASE_FAILED_LAUNCH and "release 1 of at most 3" in a.reason, a
    (a,) = m.plan([changed(held, launch_releases=m.MAX_LAUNCH_RELEASES)], parts(), RULES, NOW)
    assert a.kind == K.NOTE and "left held" in a.reason, a
    # An administrator's hold is never released, nor any job Slurm holds for another reason.
    for reason in ("JobHeldAdmin", "JobHeldUser", "BeginTime"):
        assert K.RELEASE_FAILED_LAUNCH not in kinds(m.plan([changed(held, reason=reason)], parts(), RULES, NOW))


def test_ideal_mode_and_users_the_policy_excludes_are_not_moved() -> None:
    assert m.plan([job(mode="ideal")], parts(), RULES, NOW) == []
    actions = m.plan([job()], parts(), replace(RULES, movable_users=("bob",)), NOW)
    assert kinds(actions) == [K.NOTE] and "does not move alice's jobs" in actions[0].reason


def test_per_user_gpu_limit() -> None:
    other = job(dlsub_id="aaaa0002", slurm_job_id=11, partition="gpu", gpus_now=4, gpus_wanted=4)
    actions = m.plan([job(), other], parts(), replace(RULES, max_gpus_per_user=4), NOW)
    assert kinds(actions) == [K.NOTE] and "limit of 4 GPUs" in actions[0].reason


def test_the_policy_decides_which_job_takes_scarce_gpus() -> None:
    older = job(dlsub_id="aaaa0001", slurm_job_id=10, submit_time=NOW - 900)
    newer = job(dlsub_id="aaaa0002", slurm_job_id=11, submit_time=NOW - 100)
    actions = m.plan([newer, older], parts(gpu_idle=1), replace(RULES, policy="fifo"), NOW)
    assert [(a.kind, a.dlsub_id) for a in actions] == [(K.SIGNAL_MOVE, "aaaa0001")]


def move(phase: MovePhase, since: float = NOW - 10, kind: str = "move", restart: int = 0) -> MoveView:
    return MoveView(kind, phase, "gpu", 1, since, restart_count=restart)


def test_a_move_in_flight_advances_from_what_slurm_shows() -> None:
    # Signalled, job still checkpointing: wait; too long: ask again.
    running = job(move=move(MovePhase.SIGNALLED))
    assert m.plan([running], parts(), RULES, NOW) == []
    slow = job(move=move(MovePhase.SIGNALLED, since=NOW - 1000))
    assert kinds(m.plan([slow], parts(), RULES, NOW)) == [K.SIGNAL_MOVE]
    # Planned but the signal never went out (crash between): send it.
    assert kinds(m.plan([job(move=move(MovePhase.PLANNED))], parts(), RULES, NOW)) == [K.SIGNAL_MOVE]
    # Requeued held on cpu after checkpointing for the move: retarget, then release.
    held = job(state="PENDING", reason="JobHeldUser", held=True, move=move(MovePhase.SIGNALLED), restart_count=1,
               last_attempt_action="move")
    assert kinds(m.plan([held], parts(), RULES, NOW)) == [K.RETARGET, K.RELEASE]
    # Retargeted (a crash before release): release only.
    retargeted = replace(held, partition="gpu", gpus_now=1, move=move(MovePhase.UPDATED))
    assert kinds(m.plan([retargeted], parts(), RULES, NOW)) == [K.RELEASE]
    # Holds the agent did not place stay: an admin's, one from before the signal, one without a move record.
    assert kinds(m.plan([replace(held, reason="JobHeldAdmin")], parts(), RULES, NOW)) == [K.NOTE]
    assert m.plan([replace(held, restart_count=0)], parts(), RULES, NOW) == []
    assert kinds(m.plan([changed(held, last_attempt_action="requeue")], parts(), RULES, NOW)) == [K.ABANDON_MOVE]
    # Running on the target after a restart: done, whatever Slurm's clock says.
    moved = job(partition="gpu", gpus_now=1, start_time=NOW - 99_999, restart_count=1,
                move=move(MovePhase.RELEASED, since=NOW - 8))
    assert kinds(m.plan([moved], parts(), RULES, NOW)) == [K.FINISH_MOVE]
    assert kinds(m.plan([replace(moved, partition="cpu")], parts(), RULES, NOW)) == [K.ABANDON_MOVE]
    # Preempted is final: the move is abandoned.
    preempted = replace(held, state="PREEMPTED", ended=True)
    assert kinds(m.plan([preempted], parts(), RULES, NOW)) == [K.ABANDON_MOVE]
    # The job ended on its own meanwhile.
    ended = job(state="COMPLETED", ended=True, move=move(MovePhase.SIGNALLED))
    assert kinds(m.plan([ended], parts(), RULES, NOW)) == [K.ABANDON_MOVE]


def test_time_limit_continuation_before_the_allocation_ends() -> None:
    dev = job(partition="gpu-dev", ideal_partition="gpu-dev", gpus_now=1, end_time=NOW + 60, eta_s=900.0)
    actions = m.plan([dev], parts(), RULES, NOW)
    assert kinds(actions) == [K.SIGNAL_CONTINUE] and "time limit on gpu-dev ends in 60 s" in actions[0].reason
    # Far from the limit, or done in time, or over the site's maximum: no.
    assert m.plan([replace(dev, end_time=NOW + 3600)], parts(), RULES, NOW) == []
    assert m.plan([changed(dev, eta_s=30.0)], parts(), RULES, NOW) == []
    capped = m.plan([changed(dev, continuations=3)], parts(), replace(RULES, max_continuations=3), NOW)
    assert kinds(capped) == [K.NOTE]
    off = m.plan([dev], parts(), replace(RULES, continue_jobs=False), NOW)
    assert kinds(off) == [K.NOTE] and "does not continue" in off[0].reason
    # After the checkpoint the job requeued itself: done; Slurm's requeue wait stands (the agent never
    # starts a requeued job early: slurmd would kill it on the node it left).
    waiting = changed(dev, state="PENDING", reason="BeginTime", move=move(MovePhase.SIGNALLED, kind="continue"),
                      restart_count=1, requeues=1, last_attempt_action="requeue")
    done = m.plan([waiting], parts(), RULES, NOW)
    assert kinds(done) == [K.FINISH_MOVE] and "requeue wait" in done[0].reason
    # The script's own requeues count against continuations too.
    capped = m.plan([changed(dev, requeues=3)], parts(), replace(RULES, max_continuations=3), NOW)
    assert kinds(capped) == [K.NOTE]


def test_backfill_inside_a_window_and_back_out_before_it_closes() -> None:
    cpu_busy = [replace(p, nodes=(IdleNode("cpu1", 0, 0),)) if p.name == "cpu" else p for p in parts()]
    waiting = job(state="PENDING", reason="Resources", partition="cpu", mode="ideal", ideal_partition="cpu",
                  gpus_wanted=0, start_time=0, end_time=0, time_limit_min=60)
    assert m.plan([waiting], cpu_busy, RULES, NOW, WindowState(False)) == []
    open_ = WindowState(True, "night", NOW + 3600)
    actions = m.plan([waiting], cpu_busy, RULES, NOW, open_)
    assert kinds(actions) == [K.BACKFILL] and actions[0].partition == "gpu-dev"
    assert actions[0].gpus == 0 and actions[0].time_limit_min == 10, "cut to gpu-dev's MaxTime"
    assert "off-hours window 'night' is open" in actions[0].reason
    # Too close to the end of the window: nothing new starts.
    assert m.plan([waiting], cpu_busy, RULES, NOW, WindowState(True, "night", NOW + 100)) == []
    placed = job(partition="gpu-dev", mode="ideal", ideal_partition="cpu", backfilled_from="cpu",
                 backfilled_limit_min=60, gpus_wanted=0, end_time=NOW + 500)
    assert m.plan([placed], cpu_busy, RULES, NOW, open_) == [], "stays while the window is open"
    closing = m.plan([placed], cpu_busy, RULES, NOW, WindowState(True, "night", NOW + 120))
    assert kinds(closing) == [K.SIGNAL_MOVE] and closing[0].partition == "cpu"
    assert closing[0].move_kind == MoveKind.RETURN and "closes in" in closing[0].reason
    assert closing[0].time_limit_min == 60, "its own time limit back"
    assert kinds(m.plan([placed], cpu_busy, RULES, NOW, WindowState(False))) == [K.SIGNAL_MOVE]


def test_gpu_jobs_are_backfilled_only_where_gpus_are_idle() -> None:
    waiting = job(state="PENDING", reason="Resources", partition="gpu", mode="ideal", gpus_now=1, start_time=0,
                  end_time=0)
    open_ = WindowState(True, "night", NOW + 3600)
    assert m.plan([waiting], parts(gpu_idle=0), RULES, NOW, open_) == [], "no GPUs idle: cpu nodes cannot take it"
    dev_idle = [replace(p, nodes=(IdleNode("gpu2", 4, 4),)) if p.name == "gpu-dev" else p for p in parts(gpu_idle=0)]
    actions = m.plan([waiting], dev_idle, RULES, NOW, open_)
    assert [(a.kind, a.partition, a.gpus) for a in actions] == [(K.BACKFILL, "gpu-dev", 1)]


def test_a_self_requeued_job_is_left_to_slurms_requeue_wait() -> None:
    requeued = job(state="PENDING", reason="BeginTime", last_attempt_action="requeue", requeues=1)
    for n in (1, 3, 4):
        assert m.plan([changed(requeued, requeues=n)], parts(), replace(RULES, max_continuations=3), NOW) == []


def test_limits_count_the_users_holdings_and_this_ticks_decisions() -> None:
    jobs = [job(dlsub_id=f"aaaa000{n}", slurm_job_id=10 + n, submit_time=NOW - 600 + n) for n in range(3)]
    usage = {0: Usage(gpus=1, jobs=4)}  # one GPU already held, e.g. by a plain sbatch job
    actions = m.plan(jobs, parts(), replace(RULES, max_gpus_per_user=2), NOW, usage=usage)
    assert [(a.kind, a.slurm_job_id) for a in actions if a.kind == K.SIGNAL_MOVE] == [(K.SIGNAL_MOVE, 10)]
    assert sum(1 for a in actions if a.kind == K.NOTE and "limit of 2 GPUs" in a.reason) == 2
    # Another user's holdings never count.
    actions = m.plan(jobs, parts(), replace(RULES, max_gpus_per_user=2), NOW, usage={7: Usage(gpus=50, jobs=1)})
    assert sum(1 for a in actions if a.kind == K.SIGNAL_MOVE) == 2
    # Over the job limit: no help from the agent.
    actions = m.plan(jobs[:1], parts(), replace(RULES, max_jobs_per_user=3), NOW, usage={0: Usage(0, 4)})
    assert kinds(actions) == [K.NOTE] and "more than the limit of 3" in actions[0].reason
    # The per-job cap.
    big = m.plan([job(gpus_wanted=4)], parts(), replace(RULES, max_gpus_per_job=2), NOW)
    assert [(a.kind, a.gpus) for a in big] == [(K.SIGNAL_MOVE, 2)]


def test_a_job_without_a_total_is_estimated_from_the_time_it_has_run() -> None:
    actions = m.plan([job(eta_s=None, ran_s=720.0)], parts(), RULES, NOW)
    assert kinds(actions) == [K.SIGNAL_MOVE]
    assert "no total declared: assuming about as long again as the 12 min it has run" in actions[0].reason
    assert kinds(m.plan([job(eta_s=None, ran_s=None)], parts(), RULES, NOW)) == [K.NOTE]


def test_a_released_move_stays_in_flight_through_slurms_requeue_wait() -> None:
    """Released on its new partition, the job waits out Slurm's requeue wait (BeginTime); the move is done
    only when it runs there (or waits there for resources), never by starting it early."""
    waiting = job(state="PENDING", reason="BeginTime", partition="gpu", gpus_now=1, restart_count=1,
                  last_attempt_action="move", move=move(MovePhase.RELEASED))
    assert m.plan([waiting], parts(), RULES, NOW) == []
    running = replace(waiting, state="RUNNING", reason="None")
    done = m.plan([running], parts(), RULES, NOW)
    assert kinds(done) == [K.FINISH_MOVE] and done[0].reason == "running on gpu"
    queued = replace(waiting, reason="Resources")
    assert kinds(m.plan([queued], parts(), RULES, NOW)) == [K.FINISH_MOVE]


def test_a_job_that_asked_for_a_kind_of_gpu_moves_onto_that_kind_only() -> None:
    """Immediate mode, started on CPUs, asked for an a100 (an estimate's typed row: its comment's gpu_type): its
    move asks for gres:gpu:a100:1, and idle GPUs of another kind do not move it."""
    typed = [PartitionView("gpu", (IdleNode("gpu1", 0, 4, gpu_type="a100"),
                                                IdleNode("gpu2", 4, 4, gpu_type="v100")), role="gpu", speed=1.0),
             PartitionView("cpu", (IdleNode("cpu1", 0, 4),), role="cpu", speed=0.1)]
    assert m.plan([job(gpu_type="a100")], typed, RULES, NOW) == []
    (untyped,) = m.plan([job()], typed, RULES, NOW)
    assert untyped.kind == K.SIGNAL_MOVE and untyped.gpu_type == "", "a job that asked for any kind takes v100"
    free = [replace(typed[0], nodes=(IdleNode("gpu1", 2, 4, gpu_type="a100"), IdleNode("gpu2", 4, 4, gpu_type="v100"))),
            typed[1]]
    (move,) = m.plan([job(gpu_type="a100")], free, RULES, NOW)
    assert (move.kind, move.partition, move.gpu_type) == (K.SIGNAL_MOVE, "gpu", "a100")


def two_models(a100_idle: int = 0, l40s_idle: int = 4, **l40s: object) -> list[PartitionView]:
    """A site with a partition per GPU model (the admin guide's "A partition per model"): gpu (a100), the
    ideal partition submit chose, and gpu-l40s, slower, beside the CPU partition the job started on."""
    return [
        PartitionView("gpu", (IdleNode("a1", a100_idle, 4, gpu_type="a100"),), role="gpu", speed=1.0),
        replace(PartitionView("gpu-l40s", (IdleNode("l1", l40s_idle, 4, gpu_type="l40s"),), role="gpu", speed=0.5),
                **l40s),  # type: ignore[arg-type]
        PartitionView("gpu-dev", (IdleNode("a1", a100_idle, 4, gpu_type="a100"),), role="dev", max_time_s=600),
        PartitionView("cpu", (IdleNode("cpu1", 0, 4),), role="cpu", speed=0.1),
    ]


def test_a_job_moves_to_the_gpu_partition_that_frees_first_and_says_its_ideal_one_is_full() -> None:
    (a,) = m.plan([job()], two_models(), RULES, NOW)
    assert (a.kind, a.partition, a.gpus, a.gpu_type) == (K.SIGNAL_MOVE, "gpu-l40s", 1, "")
    assert a.reason.endswith("; gpu, where it was to go, has no room for it now"), a.reason
    # 3 h at 0.1 here, 0.6 h at 0.5 there, less the 60 s restart.
    assert a.details["saved_s"] == round(3 * 3600 - 3 * 3600 * 0.1 / 0.5 - 60)


def test_with_both_free_the_one_that_saves_most_wins_and_a_tie_goes_to_the_ideal_one() -> None:
    (a,) = m.plan([job()], two_models(a100_idle=4), RULES, NOW)
    assert a.partition == "gpu" and "where it was to go" not in a.reason
    (tie,) = m.plan([job()], two_models(a100_idle=4, speed=1.0), RULES, NOW)
    assert tie.partition == "gpu", "equal speeds: the ideal partition"
    (faster,) = m.plan([job()], two_models(a100_idle=4, speed=2.0), RULES, NOW)
    assert faster.partition == "gpu-l40s", "a faster partition the job may use saves more"


def test_no_move_to_a_partition_slurm_would_refuse_the_policy_calls_no_gpu_one_or_of_another_kind() -> None:
    assert m.plan([job(barred=frozenset({"gpu-l40s"}))], two_models(), RULES, NOW) == []
    assert m.plan([job()], two_models(role="dev"), RULES, NOW) == [], "only the policy's GPU partitions"
    assert m.plan([job()], two_models(role=None), RULES, NOW) == []
    assert m.plan([job(gpu_type="a100")], two_models(), RULES, NOW) == [], "it asked for a100s"
    (typed,) = m.plan([job(gpu_type="l40s", ideal_partition="gpu")], two_models(), RULES, NOW)
    assert (typed.partition, typed.gpu_type) == ("gpu-l40s", "l40s")


def test_no_move_to_a_partition_whose_max_time_would_cut_the_jobs_limit() -> None:
    short = two_models(max_time_s=3600.0)
    assert m.plan([job(time_limit_min=120)], short, RULES, NOW) == []
    assert m.plan([job()], short, RULES, NOW) == [], "a limit not known fits no bounded partition"
    (a,) = m.plan([job(time_limit_min=60)], short, RULES, NOW)
    assert a.partition == "gpu-l40s"


def test_jobs_waiting_there_keep_their_gpus_and_a_job_on_gpus_already_stays() -> None:
    assert m.plan([job()], two_models(waiting_gpus=4, waiting_per_node=4), RULES, NOW) == []
    on_l40s = job(partition="gpu-l40s", gpus_now=1)
    assert m.plan([on_l40s], two_models(a100_idle=4), RULES, NOW) == [], "moved once, not again to its ideal one"


def test_a_move_to_another_gpu_partition_is_finished_there_as_any_move() -> None:
    moving = job(move=MoveView(MoveKind.MOVE, MovePhase.SIGNALLED, "gpu-l40s", 1, since=NOW - 30), restart_count=1,
                 partition="gpu-l40s", gpus_now=1)
    (done,) = m.plan([moving], two_models(l40s_idle=3), RULES, NOW)
    assert (done.kind, done.reason) == (K.FINISH_MOVE, "running on gpu-l40s")


def test_notes_name_the_partition_it_would_go_to() -> None:
    (note,) = m.plan([job(checkpointable=False)], two_models(), RULES, NOW)
    assert note.kind == K.NOTE and note.reason.startswith("not moved to gpu-l40s: the job has not written"), note
