"""Unit tests (stateful fake Slurm behind the client's `_run` seam, fake clock, job directories in tmp_path): a
script that uses no dlsub library (issue 34 item 4). The agent tells it from submit's tag (``script=plain``) and
its progress file (no start event after ``[moves] plain_grace_s``), both, restarts it from scratch on its GPU
partition through the move's path (requeue held, retarget, release) when the work it loses is within
``restart_plain_max_s``, says why in its decisions (``dlsub why``), and leaves another user's job alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_world import ME, NOW, OTHER, World, policy
from move_jobs import job_info

from dlsub.policies.actions import move_rules as m
from dlsub.policies.actions.kinds import ActionKind as K
from dlsub.policies.actions.move_views import JobInfo, Rules
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import IdleNode

RULES = Rules(restart_cost_s=60, min_saving_s=60, checkpoint_grace_s=90, plain_grace_s=120,
              restart_plain_max_s=600)


def parts() -> list[PartitionView]:
    return [PartitionView("gpu", (IdleNode("gpu1", 4, 4),), role="gpu", speed=1.0),
            PartitionView("cpu", (IdleNode("cpu1", 0, 4),), role="cpu", speed=0.1)]


def plain(ran: float, **kw: object) -> JobInfo:
    """Alice's plain job on cpu for ``ran`` seconds: no start event, no checkpoint, no progress."""
    fields: dict[str, object] = {"library_started": False, "plain_script": True, "checkpointable": False,
                                 "last_checkpoint_time": None, "eta_s": None, "start_time": NOW - ran}
    return job_info(NOW, **{**fields, **kw})


def test_a_plain_job_within_the_bound_is_restarted_on_the_gpu_and_says_what_it_loses() -> None:
    actions = m.plan([plain(180)], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.RESTART]
    a = actions[0]
    assert a.partition == "gpu" and a.gpus == 1 and a.move_kind == "restart"
    assert a.reason == ("restarting on gpu from scratch: it uses no dlsub library, so it never checkpoints; "
                        "3 min of work on cpu lost, redone there in about 18 s; 4 GPU(s) idle")
    assert a.details["lost_s"] == 180 and a.details["redo_s"] == 18


def test_a_plain_job_over_the_bound_stays_and_the_note_says_why() -> None:
    actions = m.plan([plain(1200)], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE]
    assert actions[0].reason.startswith("not restarted on gpu: it uses no dlsub library")
    assert "lose its 20 min of work here, more than the 10 min the site allows" in actions[0].reason
    assert "restart_plain_max_s" in actions[0].reason


def test_a_job_without_submits_plain_tag_is_never_restarted() -> None:
    """A job submitted by hand, by a dlsub before the tag, or dressed up as dlsub's (its comment written by
    its user) runs without the library's start event too: it is never thrown back to its start."""
    actions = m.plan([plain(180, plain_script=False)], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "has not written a checkpoint yet" in actions[0].reason


def test_within_the_grace_a_job_without_a_start_event_is_not_yet_taken_for_plain() -> None:
    actions = m.plan([plain(60)], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "has not written a checkpoint yet" in actions[0].reason


def test_a_library_job_that_has_not_checkpointed_is_never_restarted() -> None:
    """Behaviour for library-using jobs unchanged: a start event, no checkpoint yet, is not moved at all."""
    job = job_info(NOW, checkpointable=False, last_checkpoint_time=None, start_time=NOW - 180)
    actions = m.plan([job], parts(), RULES, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "has not written a checkpoint yet" in actions[0].reason


def test_the_wait_policy_restarts_nothing_and_says_so() -> None:
    rules = Rules(plain_scripts="wait", plain_grace_s=120)
    actions = m.plan([plain(180)], parts(), rules, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and 'plain_scripts = "wait"' in actions[0].reason


def test_a_plain_restart_counts_against_the_users_gpu_limit() -> None:
    rules = Rules(plain_grace_s=120, max_gpus_per_user=0)
    actions = m.plan([plain(180)], parts(), rules, NOW)
    assert [a.kind for a in actions] == [K.NOTE] and "limit of 0 GPUs" in actions[0].reason


# ---------------------------------------------------------------- the agent's tick, with the fake Slurm


def plain_world(tmp_path: Path, **moves: object) -> World:
    return World(tmp_path, policy(moves={"restart_cost_s": 15, "min_saving_s": 5, "plain_grace_s": 60, **moves}))


def tagged(dlsub_id: str) -> str:
    """The comment dlsub submit writes for a script it read as using no library."""
    return f"dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1;script=plain"


def test_the_agent_restarts_a_plain_job_through_the_moves_path(tmp_path: Path) -> None:
    w = plain_world(tmp_path)
    # No progress file: the script uses no library.
    job_id, job_dir = w.submit("0123abcd", comment=tagged("0123abcd"), start=NOW - 300)
    agent = w.agent()
    assert [a.kind for a in agent.tick(NOW)] == ["restart"]
    job = w.fake.jobs[job_id]
    assert job.signals == [], "no checkpoint signal: there is nothing to save"
    assert job.state == "PENDING" and job.reason == "JobHeldUser" and job.restart_cnt == 1
    assert w.store is not None
    move = w.store.move(ME, job_id)
    assert move is not None
    assert move["kind"] == "restart" and move["phase"] == "signalled" and move["target_partition"] == "gpu"
    # Slurm ended the attempt with its signal: no record of a move's checkpoint, and none is needed.
    assert [a.kind for a in agent.tick(NOW + 5)] == ["retarget", "release"]
    assert job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1" and job.reason == "None"
    w.fake.start(job_id, "gpu1", int(NOW + 10))
    assert [a.kind for a in agent.tick(NOW + 15)] == ["finish-move"]
    decisions = w.store.decisions("0123abcd")
    assert [d.kind for d in decisions] == ["restart", "restart-done"]
    assert decisions[0].reason.startswith("restarting on gpu from scratch: it uses no dlsub library")
    assert "5 min of work on cpu lost" in decisions[0].reason
    assert agent.tick(NOW + 30) == [], "on gpu it stays"


def test_the_agent_leaves_a_plain_job_over_the_bound_and_why_says_so(tmp_path: Path) -> None:
    w = plain_world(tmp_path, restart_plain_max_s=120)
    job_id, _ = w.submit("0123abcd", comment=tagged("0123abcd"), start=NOW - 300)
    agent = w.agent()
    assert [a.kind for a in agent.tick(NOW)] == ["note"]
    assert w.fake.jobs[job_id].state == "RUNNING" and w.fake.jobs[job_id].restart_cnt == 0
    assert w.store is not None
    note = w.store.decisions("0123abcd")[-1]
    assert "a restart would lose its 5 min of work here, more than the 2 min the site allows" in note.reason


def test_a_job_that_wrote_its_start_event_is_not_restarted(tmp_path: Path) -> None:
    """The library's start event (checkpointing.init()) and no checkpoint yet: waits, as before."""
    w = plain_world(tmp_path)
    job_id, job_dir = w.submit("0123abcd", comment=tagged("0123abcd"), start=NOW - 300)
    (job_dir / "progress.jsonl").write_text(json.dumps({"event": "start", "time": NOW - 290,
                                                        "attempt": f"{job_id}-0"}) + "\n")
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["note"] and "has not written a checkpoint yet" in actions[0].reason
    assert w.fake.jobs[job_id].state == "RUNNING"


def test_another_users_start_event_cannot_save_or_doom_a_plain_job(tmp_path: Path) -> None:
    """Each job's files are read from its own directory only (dlsub/jobdir.py): start events bob writes in
    his job directory, naming alice's job, do not make hers look like a library job, and his job, whose
    directory the agent cannot read as his (it is not owned by his uid), keeps the benefit of the doubt:
    it is not taken for a plain script, and nothing of it is touched."""
    w = plain_world(tmp_path)
    mine, _ = w.submit("0123abcd", comment=tagged("0123abcd"), start=NOW - 300)
    theirs, their_dir = w.submit("4567cdef", uid=OTHER, user="bob", comment=tagged("4567cdef"), start=NOW - 300)
    with open(their_dir / "progress.jsonl", "w") as f:
        for dlsub_id in ("0123abcd", "4567cdef"):
            f.write(json.dumps({"event": "start", "time": NOW - 290, "attempt": f"{mine}-0",
                                "dlsub_id": dlsub_id}) + "\n")
    before = w.snapshot(theirs)
    actions = w.agent().tick(NOW)
    assert [(a.kind, a.slurm_job_id) for a in actions if a.kind != "note"] == [("restart", mine)]
    assert w.snapshot(theirs) == before and w.mutating_calls(theirs) == []
    assert w.store is not None
    assert any(d.kind == "skipped" and "not by the job's user" in d.reason for d in w.store.decisions("4567cdef"))


def test_the_agent_leaves_an_untagged_job_without_a_start_event_alone(tmp_path: Path) -> None:
    """A raw sbatch job dressed up as dlsub's in immediate mode (no script tag), running a plain sleep: the
    agent waits for a checkpoint as for any job, and never requeues it."""
    w = plain_world(tmp_path)
    job_id, _ = w.submit("0123abcd", start=NOW - 300)
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["note"] and "has not written a checkpoint yet" in actions[0].reason
    assert w.fake.jobs[job_id].state == "RUNNING" and w.fake.jobs[job_id].restart_cnt == 0
    assert w.mutating_calls(job_id) == []


def test_the_tag_is_frozen_by_the_submit_record_not_read_from_the_comment_again(tmp_path: Path) -> None:
    """The agent trusts the request job_submit.lua froze: a user who adds ``script=plain`` to a running job's
    comment afterwards (``scontrol update Comment=``) does not make it restartable, and the tag round-trips
    through the stored request."""
    w = plain_world(tmp_path)
    job_id, _ = w.submit("0123abcd", start=NOW - 300)
    w.fake.jobs[job_id].options["comment"] = tagged("0123abcd")
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["note"] and w.fake.jobs[job_id].restart_cnt == 0


RESTART_CRASH_POINTS = {
    # where the agent dies: (command, before or after Slurm carried it out)
    "planned": (("scontrol", "requeuehold"), "before"),
    "requeued": (("scontrol", "requeuehold"), "after"),
    "requeue-held": (("scontrol", "update"), "before"),
    "updated": (("scontrol", "update"), "after"),
    "released": (("scontrol", "release"), "after"),
}


@pytest.mark.parametrize("point", list(RESTART_CRASH_POINTS))
def test_a_crash_at_each_step_of_a_restart_restarts_it_once(tmp_path: Path, point: str) -> None:
    """The restart is written ahead as a move is (the moves table): an agent killed at any step and started
    again on the same database finishes it with exactly one requeue."""
    w = plain_world(tmp_path)
    job_id, job_dir = w.submit("0123abcd", comment=tagged("0123abcd"), start=NOW - 300)
    prefix, when = RESTART_CRASH_POINTS[point]
    w.crash_once_at(prefix, when, point)
    crashes = w.move_to_gpu_through_crashes(job_id, job_dir, NOW)  # no checkpoint signal: nothing to play
    job = w.fake.jobs[job_id]
    assert crashes == 1
    assert job.state == "RUNNING" and job.options["partition"] == "gpu" and job.options["gres"] == "gpu:1"
    assert job.restart_cnt == 1, "exactly one requeue: no duplicate attempt"
    assert w.store is not None and w.store.moves() == []
    kinds = [d.kind for d in w.store.decisions("0123abcd")]
    assert kinds.count("restart") == 1 and kinds[-1] == "restart-done"


def test_the_progress_summary_keeps_whether_the_training_started() -> None:
    """Unit (pure): the one signal the agent reads. A start event sets it; a summary stored before the field
    existed reads it from whether it had any event (a library job's first event is its start)."""
    from dlsub.job_progress import ProgressSummary

    summary = ProgressSummary()
    summary.feed({"event": "progress", "time": 1.0, "step": 1})
    assert not summary.started, "progress alone is not the library's start"
    summary.feed({"event": "start", "time": 2.0})
    assert summary.started and ProgressSummary.from_dict(summary.to_dict()).started
    assert not ProgressSummary.from_dict({"checkpoints": 0}).started
    assert ProgressSummary.from_dict({"first_time": 5.0}).started
