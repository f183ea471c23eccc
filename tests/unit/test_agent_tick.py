"""Unit tests (stateful fake Slurm, fake clock, job directories in tmp_path): the agent's tick end to end.

A move through all its phases, a crash (a new Agent on the same database)
after each phase, holds the agent did not place, PREEMPTED, the exit-85
loop, the deadline, one job's failure, and what the tick writes.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from agent_world import ME, NOW, OTHER, World, policy

from dlsub.agent import observe as observe_module
from dlsub.agent.agent_store import AgentStore
from dlsub.agent.store_rows import Writes
from dlsub.policies.actions.move_rules import MAX_LAUNCH_RELEASES
from dlsub.slurm_plugins.fake import FakeNode, FakePartition, FakeSlurm


def test_a_move_runs_through_by_restart_count_and_partition(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    assert [a.kind for a in agent.tick(NOW)] == ["signal-move"]
    assert w.fake.jobs[job_id].signals == ["USR2"]
    move = w.store.move(ME, job_id)
    assert move["phase"] == "signalled" and move["restart_count"] == 0 and move["uid"] == ME
    assert move["target_partition"] == "gpu" and move["target_gpus"] == 1
    w.batch_script_moves(job_dir, job_id)
    assert [a.kind for a in agent.tick(NOW + 5)] == ["retarget", "release"]
    job = w.fake.jobs[job_id]
    assert job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1" and job.reason == "None"
    # Slurm's clock may be far off the agent's: the move finishes by restart count and partition.
    w.fake.start(job_id, "gpu1", int(NOW - 2000))  # before the signal, by the agent's clock
    assert [a.kind for a in agent.tick(NOW + 10)] == ["finish-move"]
    assert w.store.moves() == [] and len(w.fake.jobs) == 1 and job.restart_cnt == 1
    kinds = [d.kind for d in w.store.decisions("0123abcd")]
    assert kinds == ["move", "move-done"]
    assert all(d.uid == ME for d in w.store.decisions("0123abcd"))
    assert agent.tick(NOW + 20) == [], "nothing more to do"


CRASH_POINTS = {
    # phase reached when the agent dies: (command, before or after Slurm carried it out)
    "planned": (("scancel",), "before"),
    "signalled": (("scancel",), "after"),
    "requeue-held": (("scontrol", "update"), "before"),
    "updated": (("scontrol", "update"), "after"),
    "released": (("scontrol", "release"), "after"),
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_a_crash_after_each_move_phase_finishes_the_move_once(tmp_path: Path, point: str) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    prefix, when = CRASH_POINTS[point]
    w.crash_once_at(prefix, when, point)
    crashes = w.move_to_gpu_through_crashes(job_id, job_dir, NOW)
    job = w.fake.jobs[job_id]
    assert crashes == 1
    assert len(w.fake.jobs) == 1, "one Slurm job throughout"
    assert job.state == "RUNNING" and job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1"
    assert job.restart_cnt == 1, "exactly one requeue: no duplicate attempt"
    assert w.store.moves() == []
    kinds = [d.kind for d in w.store.decisions("0123abcd")]
    assert kinds.count("move") == 1 and kinds[-1] == "move-done"
    rows = w.store.conn.execute("select restart from attempts where slurm_job_id = ?", (job_id,)).fetchall()
    assert sorted(r[0] for r in rows) == [0, 1]


@pytest.mark.parametrize("saves", [None, "on_request", "whenever"])
def test_a_job_that_saves_on_request_is_moved_before_its_first_checkpoint(tmp_path: Path, saves: str | None) -> None:
    """A framework adapter's start declares that it saves whenever asked (contract.SAVES_ON_REQUEST): the
    agent moves it with no checkpoint yet. Without the declaration (a plain library script), or with a value
    the contract does not know (the whole start event is then refused), it waits for a first checkpoint."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id, checkpoint=False, saves=saves)
    actions = w.agent().tick(NOW)
    if saves == "on_request":
        assert [a.kind for a in actions] == ["signal-move"], actions
    else:
        assert [a.kind for a in actions] == ["note"] and "has not written a checkpoint yet" in actions[0].reason


def test_an_admin_hold_on_a_moving_job_is_never_released(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    w.batch_script_moves(job_dir, job_id)
    w.fake.admin_hold(job_id)
    before = w.snapshot(job_id)
    for i in range(3):
        assert [a.kind for a in agent.tick(NOW + 5 + i)] in (["note"], [])
    assert w.snapshot(job_id) == before and w.fake.jobs[job_id].reason == "JobHeldAdmin"
    assert not [c for c in w.fake.calls if c[:2] in (["scontrol", "release"], ["scontrol", "update"])]
    waits = [d for d in w.store.decisions("0123abcd") if d.kind == "wait"]
    assert len(waits) == 1 and "held by an administrator" in waits[0].reason


def test_a_job_slurm_held_after_a_failed_launch_is_released_at_most_three_times(tmp_path: Path) -> None:
    """Stateful fake Slurm. A job Slurm requeued held because its launch failed (seen in the soak: a node back
    from a cut link still held the job's old attempt, and Slurm started it there again: "Duplicate jobid") is
    released, each release counted in the store first; after MAX_LAUNCH_RELEASES it is left held, and said so."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    for i in range(MAX_LAUNCH_RELEASES + 2):
        w.fake.launch_fails(job_id)
        kinds = [a.kind for a in agent.tick(NOW + 5 * (i + 1))]
        assert kinds == (["release-failed-launch"] if i < MAX_LAUNCH_RELEASES else ["note"]), (i, kinds)
    releases = [c for c in w.fake.calls if c[:2] == ["scontrol", "release"]]
    assert len(releases) == MAX_LAUNCH_RELEASES and w.fake.jobs[job_id].description == "launch failed requeued held"
    said = [(d.kind, d.reason) for d in w.store.decisions("0123abcd") if d.kind in ("release-failed-launch", "wait")]
    assert [k for k, _ in said] == ["release-failed-launch"] * MAX_LAUNCH_RELEASES + ["wait"], said
    assert "release 1 of at most 3" in said[0][1] and "left held" in said[-1][1], said


def test_a_users_own_hold_without_a_move_checkpoint_is_not_released(tmp_path: Path) -> None:
    """JobHeldUser alone is not proof: the last attempt must have ended for the move, after the signal."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    w.fake.requeue_held(job_id)  # requeued held, but no `end` record with action "move"
    before = w.snapshot(job_id)
    assert [a.kind for a in agent.tick(NOW + 5)] == ["abandon-move"]
    assert w.snapshot(job_id) == before and w.store.moves() == []


def test_preempted_is_final_and_abandons_a_move_in_flight(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    w.end_attempt(job_dir, job_id, "move")
    w.fake.jobs[job_id].restart_cnt += 1
    w.fake.set_job_state(job_id, "PREEMPTED")
    assert [a.kind for a in agent.tick(NOW + 5)] == ["abandon-move"]
    assert w.store.moves() == []
    assert w.store.job(ME, job_id).state == "PREEMPTED"
    # slurmctld listing it PENDING again is a requeue of the ended job (only slurmctld shows one): the agent
    # records it, and, no move being in flight, neither releases the user's hold nor touches the job.
    w.fake.set_job_state(job_id, "PENDING")
    w.fake.jobs[job_id].reason = "JobHeldUser"
    before = w.snapshot(job_id)
    assert agent.tick(NOW + 10) == [] and agent.tick(NOW + 15) == []
    assert w.snapshot(job_id) == before
    assert w.store.job(ME, job_id).state == "PENDING"
    assert not [d for d in w.store.decisions("0123abcd") if "leaves it alone" in d.reason]


def test_an_exit_85_loop_is_left_to_slurms_requeue_wait(tmp_path: Path) -> None:
    """The batch script bounds its own requeues; the agent never hurries a requeued job past Slurm's
    BeginTime (started sooner on the node it left, slurmd kills it: "Job credential revoked")."""
    w = World(tmp_path, policy(time_limits={"max_continuations": 3}))
    job_id, job_dir = w.submit("0123abcd", comment="dlsub:0123abcd;mode=ideal;ideal=gpu;gpus=1", partition="gpu",
                               gres="gpu:1", start_on="gpu1")
    agent = w.agent()
    for i in range(5):
        w.batch_script_requeues(job_dir, job_id)
        assert [a.kind for a in agent.tick(NOW + 10 * i) if a.kind != "note"] == []
        assert w.fake.jobs[job_id].reason == "BeginTime"
        w.fake.start(job_id, "gpu1", int(NOW + 10 * i + 1))
    assert not [c for c in w.mutating_calls(job_id) if any(a.startswith("StartTime") for a in c)]


def test_the_tick_deadline_leaves_remaining_jobs_for_the_next_tick(tmp_path: Path) -> None:
    w = World(tmp_path, policy(tick_deadline_s=1.0))
    for n in range(3):
        job_id, job_dir = w.submit(f"0123abc{n}")
        w.progress(job_dir, job_id)
    w.busy_gpus()
    ticks = iter(float(i) * 0.6 for i in range(1000))
    agent = w.agent(deadline_clock=lambda: next(ticks))
    agent.tick(NOW)
    meta = w.store.meta()
    assert meta["late"] is True and meta["skipped"] >= 1 and "late" in meta["doing"]
    assert meta["jobs"] == 3, "skipped jobs keep their last summary"
    calm = w.agent()
    calm.tick(NOW + 1)
    assert calm.store.meta()["late"] is False and calm.store.meta()["skipped"] == 0


def test_many_jobs_of_one_user_cannot_use_up_every_deadline(tmp_path: Path) -> None:
    """The attack review's starvation: one user's 30 older jobs come first in squeue's order and each
    read is slow. Reads go one user at a time, least recently read first, so the other user's job is
    read in the first tick, and every job within a few ticks."""
    w = World(tmp_path, policy(tick_deadline_s=5.0))
    for n in range(30):
        job_id, job_dir = w.submit(f"0bad{n:04x}", uid=OTHER, user="mallory",
                                   job_dir=tmp_path / "mallory" / f"0bad{n:04x}")
        w.progress(job_dir, job_id)
    victim, victim_dir = w.submit("0123abcd")
    w.progress(victim_dir, victim)
    w.busy_gpus()
    ticks = iter(float(i) for i in range(100000))  # every look at the clock costs a second
    agent = w.agent(deadline_clock=lambda: next(ticks))
    agent.tick(NOW)
    assert w.store.meta()["late"] is True
    assert w.store.job(ME, victim).data.progress, "the victim's files were read in the first tick"
    for i in range(1, 20):
        agent.tick(NOW + i)
    # (Their directories are not theirs here, so their reads fail: what counts is that each was tried.)
    tried = {key for key in agent.memory.last_read if key[0] == OTHER}
    assert len(tried) == 30, f"only {len(tried)} of the other user's 30 jobs were read within 20 ticks"


@pytest.mark.wall_clock
def test_a_file_of_a_million_tiny_lines_is_read_a_bounded_slice_per_tick(tmp_path: Path) -> None:
    from dlsub.jobdir import MAX_READ_LINES, open_dir, read_new_lines

    (tmp_path / "progress.jsonl").write_bytes(b"1\n" * 500_000 + b"\n" * 100_000)
    fd = open_dir(tmp_path, ME)
    try:
        started = time.monotonic()
        chunk = read_new_lines(fd, "progress.jsonl", ME, None)
        assert len(chunk.lines) == MAX_READ_LINES and time.monotonic() - started < 0.5
        assert chunk.cursor is not None and chunk.cursor.offset > 0
        again = read_new_lines(fd, "progress.jsonl", ME, chunk.cursor)
        assert again.cursor is not None and again.cursor.offset > chunk.cursor.offset and not again.restarted
        blank = read_new_lines(fd, "progress.jsonl", ME, type(chunk.cursor)(chunk.cursor.dev, chunk.cursor.ino,
                                                                             1_000_000))
        assert blank.lines == [] and blank.cursor is not None and blank.cursor.offset == 1_000_000 + MAX_READ_LINES
    finally:
        os.close(fd)


def test_one_jobs_failure_costs_only_that_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(tmp_path)
    bad_id, bad_dir = w.submit("0badbad0")
    good_id, good_dir = w.submit("0123abcd")
    for j, d in ((bad_id, bad_dir), (good_id, good_dir)):
        w.progress(d, j)
    original = observe_module.read_files

    def flaky(row: Any, job: Any, dlsub_id: str, now: float, writes: Writes) -> bool:
        if job.job_id == bad_id:
            raise RuntimeError("disk on fire")
        return original(row, job, dlsub_id, now, writes)

    monkeypatch.setattr(observe_module, "read_files", flaky)
    actions = w.agent().tick(NOW)
    assert [(a.kind, a.slurm_job_id) for a in actions] == [("signal-move", good_id)]
    assert any("disk on fire" in d.reason for d in w.store.decisions("0badbad0"))
    assert w.store.meta()["skipped"] == 1


def test_the_tick_writes_only_changed_rows_in_one_transaction(tmp_path: Path) -> None:
    w = World(tmp_path)
    for n in range(3):
        job_id, job_dir = w.submit(f"0123abc{n}")
        w.progress(job_dir, job_id)
    w.busy_gpus()
    agent = w.agent()
    seen: list[Writes] = []
    real = agent.store.write
    agent.store.write = lambda writes: (seen.append(writes), real(writes))[1]  # type: ignore[method-assign]
    agent.tick(NOW)
    first = [s for s in seen if s.jobs]
    assert len(first) == 1 and len(first[0].jobs) == 3
    seen.clear()
    agent.tick(NOW + 30)
    assert not [s for s in seen if s.jobs or s.progress or s.decisions], "nothing changed: no job rows written"
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": "progress", "time": NOW + 25, "step": 40, "total_steps": 1000,
                            "attempt": f"{job_id}-0"}) + "\n")
    seen.clear()
    agent.tick(NOW + 60)
    changed = [k for s in seen for k in s.jobs]
    assert changed == [(ME, job_id)]


def test_a_job_that_saves_without_a_step_and_declares_no_total_is_still_moved(tmp_path: Path) -> None:
    """``run.save(state)`` (no step) with ``checkpointing.init()`` (no total): the agent estimates and says how."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id, total=None, checkpoint_step=None, ran=720)
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["signal-move"]
    why = w.store.decisions("0123abcd")[0].reason
    assert "no total declared: assuming about as long again as the 12 min it has run" in why


def test_a_job_that_never_reports_progress_is_estimated_from_its_checkpoints(tmp_path: Path) -> None:
    """Only ``init()``, ``save(state)``, ``restore()``, ``should_stop()``: no report() at all. Its own events
    (start, checkpoints) say how long it has run; the agent moves it on that estimate."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    attempt = f"{job_id}-0"
    events = [{"event": "start", "time": NOW - 600, "attempt": attempt, "rank": 0, "world_size": 1},
              {"event": "checkpoint", "time": NOW - 300, "step": 20, "seq": 1, "attempt": attempt},
              {"event": "checkpoint", "time": NOW - 5, "step": 40, "seq": 2, "attempt": attempt}]
    (job_dir / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["signal-move"]
    assert "as long again as the 10 min it has run" in w.store.decisions("0123abcd")[0].reason


def test_the_database_is_private_and_old_rows_are_pruned_hourly(tmp_path: Path) -> None:
    w = World(tmp_path, policy(retention={"progress_days": 1.0, "decisions_days": 2.0}))
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    w.busy_gpus()
    agent = w.agent()
    agent.tick(NOW)
    assert stat.S_IMODE(w.db.stat().st_mode) == 0o600
    store = agent.store
    old = Writes()
    old.record_decision(NOW - 3 * 86400, ME, "0123abcd", job_id, "alice", "wait", "ancient")
    old.progress.append({"uid": ME, "slurm_job_id": job_id, "dlsub_id": "0123abcd", "time": NOW - 2 * 86400,
                         "step": 1})
    store.write(old)
    agent.tick(NOW + 60)  # within the hour of the last pruning: kept
    assert any(d.reason == "ancient" for d in store.decisions())
    agent.tick(NOW + 3700)
    assert not any(d.reason == "ancient" for d in store.decisions())
    assert all(p["time"] >= NOW for p in store.progress(ME, job_id))
    plans = store.conn.execute("explain query plan delete from decisions where time < 1").fetchall()
    assert "decisions_time" in " ".join(str(tuple(p)) for p in plans)


def test_slurm_down_marks_the_tick_stale_and_changes_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.submit("0123abcd")
    w.fake.reachable = False
    agent = w.agent()
    assert agent.tick(NOW) == []
    assert "waiting for Slurm" in w.store.meta()["doing"] and w.store.moves() == []


def test_readonly_store_sees_moves_meta_and_decisions(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    w.agent().tick(NOW)
    ro = AgentStore(w.db, readonly=True)
    assert [m["dlsub_id"] for m in ro.moves()] == ["0123abcd"]
    assert set(ro.moves()[0]) >= {"uid", "dlsub_id", "slurm_job_id", "kind", "phase", "target_partition",
                                  "target_gpus"}
    assert ro.meta()["jobs"] == 1 and ro.decisions(uid=ME)[0].kind == "move"
    assert ro.decisions(uid=ME + 1) == [] and ro.decisions(slurm_job_id=job_id)[0].uid == ME


def test_what_the_agent_is_doing_names_no_ones_job(tmp_path: Path) -> None:
    """`dlsub agent status` shows `doing` to every user: counts only (each sees their own moves elsewhere)."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    assert [a.kind for a in agent.tick(NOW)] == ["signal-move"]
    doing = w.store.meta()["doing"]
    assert "0123abcd" not in doing and str(job_id) not in doing and "1 move" in doing, doing


def test_a_job_id_slurm_gives_again_is_a_new_job(tmp_path: Path) -> None:
    """Slurm's state reset (a site's new Slurm, ids wrapped round at MaxJobId): the same uid's next job
    gets an id the agent has a finished row for; it is followed as the new job it is, not refused as a
    finished job that came back."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    w.fake.set_job_state(job_id, "COMPLETED")
    agent.tick(NOW + 5)
    assert w.store.jobs()[(ME, job_id)].state == "COMPLETED"
    del w.fake.jobs[job_id]
    w.fake._next_id = job_id - 1  # a fresh slurmctld state counts from the same first id
    again, again_dir = w.submit("89abcdef")
    assert again == job_id
    w.progress(again_dir, again)
    assert [a.kind for a in agent.tick(NOW + 10)] == ["signal-move"], "moved as any new immediate job is"
    row = w.store.jobs()[(ME, again)]
    assert row.dlsub_id == "89abcdef" and row.state == "RUNNING"
    assert not [d for d in w.store.decisions("89abcdef") if "final states never change" in d.reason]


def test_an_ended_job_slurm_has_purged_is_forgotten_and_the_tick_stays_short(tmp_path: Path) -> None:
    """A finished job's row goes once Slurm purges the job (MinJobAge): kept, every tick loaded every row the
    agent ever had. A finished job Slurm still lists keeps its row; its decisions stay for `dlsub why`."""
    w = World(tmp_path)
    done_id, done_dir = w.submit("0123abcd")
    running_id, running_dir = w.submit("89abcdef")
    for job_id, job_dir in ((done_id, done_dir), (running_id, running_dir)):
        w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    w.fake.set_job_state(done_id, "COMPLETED")
    agent.tick(NOW + 5)
    assert set(w.store.jobs()) == {(ME, done_id), (ME, running_id)}, "still listed by Slurm: kept"
    why = [d.reason for d in w.store.decisions("0123abcd")]
    w.fake.purge(done_id)
    agent.tick(NOW + 10)
    assert set(w.store.jobs()) == {(ME, running_id)}
    assert [d.reason for d in w.store.decisions("0123abcd")] == why and why
    agent.tick(NOW + 15)
    assert set(w.store.jobs()) == {(ME, running_id)}, "not made again"


def test_rows_kept_while_the_agent_may_still_need_them() -> None:
    """Pure: a row is forgotten only when its job ended, Slurm lists it no more, no move of it is in flight and
    no worker task of its dlsub id is queued (the agent ends those through the row)."""
    from dlsub.agent.job_data import JobData
    from dlsub.agent.observe import forgotten_rows
    from dlsub.agent.records import MoveRow
    from dlsub.agent.store_rows import JobRow
    from dlsub.contract import JobState
    from dlsub.policies.actions.resize_rules import WorkerTask
    from dlsub.slurm_plugins.models import SlurmJob

    def row(job_id: int, dlsub_id: str, state: JobState | None) -> JobRow:
        return JobRow(ME, job_id, dlsub_id, "me", state, JobData())

    rows = {(ME, 1): row(1, "a1", JobState.COMPLETED), (ME, 2): row(2, "a2", JobState.FAILED),
            (ME, 3): row(3, "a3", JobState.CANCELLED), (ME, 4): row(4, "a4", JobState.COMPLETED),
            (ME, 5): row(5, "a5", JobState.RUNNING), (ME, 6): row(6, "a6", None)}
    listed = [SlurmJob(job_id=2, name="t", user="me", state="FAILED", partition="cpu", nodes="", comment="",
                       restart_count=0, reason="", time_limit_min=None, start_time=0, submit_time=0, exit_code=1,
                       extra={"user_id": ME})]
    moves = {(ME, 3): MoveRow.__new__(MoveRow)}
    workers = {(ME, "a4"): [WorkerTask.__new__(WorkerTask)]}
    assert forgotten_rows(rows, listed, moves, workers) == [(ME, 1)]


def _two_gpu_partitions(allow_groups: str) -> FakeSlurm:
    """The testbed's shape with a partition per model: gpu (gpu1) and gpu-v100 (gpu2, ``allow_groups``)."""
    return FakeSlurm(
        nodes=[FakeNode("cpu1", ["cpu"]), FakeNode("gpu1", ["gpu"], gpus=4), FakeNode("gpu2", ["gpu-v100"], gpus=4)],
        partitions=[FakePartition("cpu", ["cpu1"], default=True), FakePartition("gpu", ["gpu1"]),
                    FakePartition("gpu-v100", ["gpu2"], allow_groups=allow_groups)])


@pytest.mark.parametrize("allowed", [True, False])
def test_a_job_moves_to_another_gpu_partition_only_where_slurm_admits_its_user(tmp_path: Path,
                                                                               allowed: bool) -> None:
    """Unit (stateful fake Slurm): gpu, the job's ideal partition, is full and gpu-v100 idle. The agent moves
    it there when the partition's AllowGroups names a group of its user (as this host resolves them), and
    leaves it on cpu when it names none of them."""
    me = pwd.getpwuid(ME).pw_name
    mine = grp.getgrgid(os.getgid()).gr_name
    pol = policy(partitions={"gpu": {"role": "gpu"}, "gpu-v100": {"role": "gpu"}, "cpu": {"role": "cpu",
                                                                                           "speed": 0.1}})
    w = World(tmp_path, pol, fake=_two_gpu_partitions(f"{mine},other" if allowed else "no-such-group-here"))
    w.fake.nodes["gpu1"].gpus_used = 4
    job_id, job_dir = w.submit("0123abcd", user=me)
    w.progress(job_dir, job_id)
    actions = w.agent().tick(NOW)
    if allowed:
        assert [(a.kind, a.partition) for a in actions] == [("signal-move", "gpu-v100")], actions
        assert "gpu, where it was to go, has no room for it now" in actions[0].reason
    else:
        assert actions == [] and w.fake.jobs[job_id].signals == []
