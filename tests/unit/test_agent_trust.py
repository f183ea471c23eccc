"""Unit tests (stateful fake Slurm, fake clock, real files in tmp_path): attacks a second user can make on the agent.

Each asserts the victim's job is untouched (partition, gres, hold, restart
count, time limit, signals) and that the agent keeps ticking and still
serves the victim.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from agent_world import ME, NOW, OTHER, World, policy

from dlsub.agent.identify import job_dir_of
from dlsub.contract import Tags
from dlsub.jobdir import Unreadable, open_dir
from dlsub.slurm_plugins.models import SlurmJob


def slurm_job(out: str, user_id: int, comment: str = "dlsub:0123abcd;mode=immediate") -> SlurmJob:
    return SlurmJob.from_squeue({"job_id": 7, "user_name": "alice", "job_state": "RUNNING", "comment": comment,
                                 "standard_output": out, "user_id": user_id})


def test_trusts_only_the_users_own_real_job_directory(tmp_path: Path) -> None:
    """The agent's two checks before it reads a job's files: the directory Slurm's output path names must be
    called after the job's dlsub id (job_dir_of), and open_dir opens it only as a real directory of the job's user."""
    job_dir = tmp_path / "0123abcd"
    job_dir.mkdir()
    mine = slurm_job(f"{job_dir}/slurm-%j.out", ME)
    assert mine.dlsub_id == "0123abcd" and job_dir_of(mine, "0123abcd") == job_dir
    os.close(open_dir(job_dir, ME))
    with pytest.raises(Unreadable, match="owned by"):
        open_dir(job_dir, ME + 4242)
    link = tmp_path / "links" / "0123abcd"
    link.parent.mkdir()
    link.symlink_to(job_dir)
    assert job_dir_of(slurm_job(f"{link}/slurm-%j.out", ME), "0123abcd") == link
    with pytest.raises(Unreadable, match="symlink"):
        open_dir(link, ME)
    other = tmp_path / "feedbeef"
    other.mkdir()
    assert job_dir_of(slurm_job(f"{other}/slurm-%j.out", ME), "0123abcd") is None
    assert job_dir_of(slurm_job("relative/0123abcd/slurm.out", ME), "0123abcd") is None
    assert slurm_job(f"{job_dir}/slurm-%j.out", ME, comment="my own comment").dlsub_id is None


def test_comment_tags_are_parsed_strictly() -> None:
    assert Tags.parse("dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1") == Tags("0123abcd", "immediate", "gpu", 1)
    assert Tags.parse("dlsub:0123abcd;ideal=gpu $(id);gpus=1") is None
    assert Tags.parse("dlsub:0123abcd;gpus=1;gpus=2") is None
    assert Tags.parse("dlsub:../../etc;mode=ideal") is None


@pytest.mark.parametrize("same_tick", [False, True])
def test_id_reuse_through_a_plain_sbatch_comment_by_another_uid(tmp_path: Path, same_tick: bool) -> None:
    w = World(tmp_path)
    w.busy_gpus()
    victim, victim_dir = w.submit("0123abcd")
    w.progress(victim_dir, victim)
    agent = w.agent()
    if not same_tick:
        agent.tick(NOW)
    # Mallory copies the victim's id from `squeue -o %k` into a plain sbatch, with a directory of that name
    # whose progress claims a checkpoint, asking for gpu-dev with 2 GPUs.
    attacker, evil_dir = w.submit("0123abcd", uid=OTHER, user="mallory", lua=False,
                                  comment="dlsub:0123abcd;mode=immediate;ideal=gpu-dev;gpus=2",
                                  job_dir=tmp_path / "mallory" / "0123abcd")
    w.progress(evil_dir, attacker)
    os.mkfifo(evil_dir / "attempts.jsonl")
    w.free_gpus()
    victim_before, attacker_before = w.snapshot(victim), w.snapshot(attacker)
    actions = agent.tick(NOW + 30)
    assert [(a.kind, a.slurm_job_id) for a in actions] == [("signal-move", victim)], "the victim moves, as asked"
    assert w.fake.jobs[victim].signals == ["USR2"] and w.snapshot(victim)[:5] == victim_before[:5]
    assert w.snapshot(attacker) == attacker_before and w.mutating_calls(attacker) == []
    ignored = w.store.decisions(uid=OTHER)
    assert [d.kind for d in ignored] == ["ignored"] and ignored[0].slurm_job_id == attacker
    assert w.store.job(OTHER, attacker).data.to_dict() == {"ignored": True}, "its files were never read"
    assert w.store.decisions(uid=ME)[0].kind == "move"
    agent.tick(NOW + 60)
    assert [d.kind for d in w.store.decisions(uid=OTHER)] == ["ignored"], "said once"
    assert w.store.move(ME, victim)["target_partition"] == "gpu" and w.store.move(ME, victim)["target_gpus"] == 1


def test_a_directory_named_after_an_id_but_not_the_jobs_own_is_not_read(tmp_path: Path) -> None:
    w = World(tmp_path)
    victim, victim_dir = w.submit("0123abcd")
    w.progress(victim_dir, victim)
    # Mallory's own id, her output pointing into a directory owned by the victim, and one through a symlink.
    borrowed = tmp_path / "victim-home" / "feedbeef"
    borrowed.mkdir(parents=True)
    w.progress(borrowed, 1)
    a1, _ = w.submit("feedbeef", uid=OTHER, user="mallory", job_dir=borrowed)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "cafebabe").symlink_to(victim_dir)
    a2, _ = w.submit("cafebabe", uid=OTHER, user="mallory", job_dir=tmp_path / "links" / "cafebabe")
    actions = w.agent().tick(NOW)
    assert [(a.kind, a.slurm_job_id) for a in actions if a.kind != "note"] == [("signal-move", victim)]
    reasons = {d.slurm_job_id: d.reason for d in w.store.decisions(uid=OTHER) if d.kind == "skipped"}
    assert f"owned by uid {ME}, not by the job's user (uid {OTHER})" in reasons[a1]
    assert "symlink" in reasons[a2]
    assert w.mutating_calls(a1) == [] and w.mutating_calls(a2) == []


def _hostile(job_dir: Path, kind: str, name: str) -> None:
    path = job_dir / name
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(50 * 2**30)  # 50 GiB of holes, no newline
    elif kind == "malformed":
        lines = ['{"event": "checkpoint", "time": "x", "step": 1}', '{"event": "progress", "time": 1e999, "step": 5}',
                 '{"event": "progress", "time": NaN, "step": 5}', '{"event": "progress", "time": 1.8e9, "step": -3}',
                 '{"event": "progress", "time": 1.8e9, "step": "7"}', '{"event": "end", "time": 1.8e9}',
                 '{"event": "progress", "time": 1.8e9, "step": ' + "9" * 5000 + "}", "[" * 50_000,
                 '{"event": "checkpoint", "time": 1.8e9, "loss": Infinity}', "x" * (100 << 10), "\x00\xff"]
        path.write_text("\n".join(lines) + "\n")
    elif kind == "directory":
        path.mkdir()


@pytest.mark.wall_clock
@pytest.mark.parametrize("name", ["progress.jsonl", "attempts.jsonl"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "malformed", "directory"])
def test_hostile_files_cost_only_their_job_an_observation(tmp_path: Path, kind: str, name: str) -> None:
    w = World(tmp_path)
    victim, victim_dir = w.submit("0123abcd")
    w.progress(victim_dir, victim)
    bad, bad_dir = w.submit("0badbad0", uid=ME, user="mallory")
    w.progress(bad_dir, bad)
    _hostile(bad_dir, kind, name)
    agent = w.agent()
    started = time.monotonic()
    actions = agent.tick(NOW)
    agent.tick(NOW + 30)
    assert time.monotonic() - started < 5, "the tick returns quickly"
    assert ("signal-move", victim) in [(a.kind, a.slurm_job_id) for a in actions]
    skipped = [d.reason for d in w.store.decisions("0badbad0") if d.kind == "skipped"]
    if kind == "malformed":
        # Bad events are dropped one by one (the over-long lines said once); the file's good events count.
        assert len(skipped) == 1 and "read in part" in skipped[0]
        data = w.store.job(ME, bad).data
        summary = data.progress if name == "progress.jsonl" else data.attempts
        assert summary is not None and summary.bad_events >= 8
    else:
        assert len(skipped) == 1, "one decision per reason, not one per tick"
        if kind != "huge":
            assert w.store.meta()["skipped"] == 1
        assert name in skipped[0] or "not a regular file" in skipped[0] or "symlink" in skipped[0]


def test_comment_rewritten_after_submit_the_submit_record_wins(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd", time="30")
    w.progress(job_dir, job_id)
    w.client.update_job(job_id, Comment="dlsub:0123abcd;mode=immediate;ideal=gpu-dev;gpus=4")
    agent = w.agent()
    actions = agent.tick(NOW)
    assert [(a.kind, a.partition, a.gpus) for a in actions] == [("signal-move", "gpu", 1)]
    request = w.store.job(ME, job_id).data.request
    assert request is not None and request.source == "record" and request.time_limit_min == 30


def test_without_a_record_the_first_tags_seen_are_frozen(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.busy_gpus()
    job_id, job_dir = w.submit("0123abcd", lua=False)
    w.progress(job_dir, job_id)
    agent = w.agent()
    agent.tick(NOW)
    first = w.store.decisions("0123abcd")[0]
    assert first.kind == "trust" and "will not read this job's comment again" in first.reason
    w.client.update_job(job_id, Comment="dlsub:0123abcd;mode=immediate;ideal=gpu-dev;gpus=4")
    w.free_gpus()
    actions = agent.tick(NOW + 30)
    assert [(a.kind, a.partition, a.gpus) for a in actions] == [("signal-move", "gpu", 1)]
    # A user cannot write the record itself.
    with pytest.raises(Exception, match="permission denied"):
        w.client.update_job(job_id, AdminComment="dlsub-submit:v1;uid=0;partition=gpu;time=;tres=|x")


def test_the_gpu_limit_counts_non_dlsub_jobs_moves_in_flight_and_this_ticks_moves(tmp_path: Path) -> None:
    w = World(tmp_path, policy(limits={"max_gpus_per_user": 3}))
    plain, _ = w.submit("00000000", comment="my own job", partition="gpu", gres="gpu:1", start_on="gpu1")
    movers = []
    for n in range(3):
        job_id, job_dir = w.submit(f"0123abc{n}", start=NOW - 600 + n)
        w.progress(job_dir, job_id)
        movers.append(job_id)
    # Someone else's GPUs never count against alice.
    w.submit("11111111", uid=OTHER, user="bob", comment="bob's", partition="gpu", gres="gpu:2", start_on="gpu2")
    agent = w.agent()
    actions = agent.tick(NOW)
    moved = [a.slurm_job_id for a in actions if a.kind == "signal-move"]
    assert moved == movers[:2], "1 GPU held by a plain job + 2 moves = the limit of 3"
    notes = [a.reason for a in actions if a.kind == "note"]
    assert len(notes) == 1 and "limit of 3 GPUs per user" in notes[0]
    # Next tick: the moves in flight still count (their jobs are still on cpu, without GPUs in Slurm).
    actions = agent.tick(NOW + 5)
    assert [a.kind for a in actions if a.kind == "signal-move"] == []
    assert w.snapshot(plain)[:4] == ("gpu", "gpu:1", "None", 0)


def test_the_job_limit_counts_every_job_the_user_holds(tmp_path: Path) -> None:
    w = World(tmp_path, policy(limits={"max_jobs_per_user": 2}))
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    for n in range(2):
        w.submit(f"0000000{n}", comment="plain", start_on=None)
    actions = w.agent().tick(NOW)
    assert [a.kind for a in actions] == ["note"] and "more than the limit of 2" in actions[0].reason


def test_a_job_asking_more_gpus_than_the_policy_allows_gets_the_cap(tmp_path: Path) -> None:
    w = World(tmp_path, policy(limits={"max_gpus_per_job": 2}))
    job_id, job_dir = w.submit("0123abcd", comment="dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=64")
    w.progress(job_dir, job_id)
    actions = w.agent().tick(NOW)
    assert [(a.kind, a.gpus) for a in actions] == [("signal-move", 2)]


def test_events_are_checked_field_by_field(tmp_path: Path) -> None:
    from dlsub.jobdir import check_attempt_event, check_progress_event, parse_line

    assert parse_line(b'{"time": NaN}') is None and parse_line(b"[1]") is None
    assert parse_line(b'{"a": ' + b"1" * 10000 + b"}") is None
    good = {"event": "progress", "time": 1.8e9, "step": 3, "loss": 0.5, "samples": 10, "total_steps": 9}
    assert check_progress_event(good) is not None
    for bad in ({"time": "x"}, {"time": 1e999}, {"time": 5.0}, {"step": True}, {"step": 1.5}, {"loss": 1e300},
                {"samples": -1}, {"total_steps": 0}, {"event": "rm -rf"}, {"attempt": ["x"]}):
        assert check_progress_event({**good, **bad}) is None, bad
    end = {"event": "end", "time": 1.8e9, "slurm_job_id": 5, "restart": 0, "action": "move", "rc": 85}
    assert check_attempt_event(end) is not None
    for bad in ({"action": "steal"}, {"slurm_job_id": "5"}, {"restart": -1}, {"rc": 2**40},
                {"dlsub_version": "9" * 65}, {"dlsub_version": 1}):
        assert check_attempt_event({**end, **bad}) is None, bad
    start = {"event": "start", "time": 1.8e9, "slurm_job_id": 5, "dlsub_version": "0.1.0"}
    assert (check_attempt_event(start) or {}).get("dlsub_version") == "0.1.0"


def test_reading_is_incremental_bounded_and_restarts_when_the_file_is_replaced(tmp_path: Path) -> None:
    from dlsub.jobdir import MAX_LINE_BYTES, open_dir, read_new_lines

    f = tmp_path / "progress.jsonl"
    f.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3')
    fd = open_dir(tmp_path, ME)
    try:
        c = read_new_lines(fd, f.name, ME, None)
        lines, cur, restarted = c.lines, c.cursor, c.restarted
        assert lines == [b'{"a": 1}', b'{"a": 2}'] and restarted and cur is not None and cur.offset == 18
        with open(f, "ab") as out:
            out.write(b'}\n' + b"y" * (MAX_LINE_BYTES + 5) + b'\n{"a": 4}\n')
        c = read_new_lines(fd, f.name, ME, cur)
        assert c.lines == [b'{"a": 3}', b'{"a": 4}'] and not c.restarted, "the over-long line is dropped"
        assert c.dropped == MAX_LINE_BYTES + 5
        cur = c.cursor
        c = read_new_lines(fd, f.name, ME, cur)
        assert c.lines == [] and c.cursor == cur
        # Capped per call: a big append is read over several calls.
        with open(f, "ab") as out:
            out.write(b'{"b": 1}\n' * 1000)
        c = read_new_lines(fd, f.name, ME, cur, max_bytes=900)
        assert len(c.lines) == 100
        cur = c.cursor
        # Replaced (new inode) or shrunk: read again from the tail.
        f.unlink()
        f.write_bytes(b"x" * 5000 + b'\n{"c": 1}\n')
        c = read_new_lines(fd, f.name, ME, cur, max_bytes=100)
        assert c.restarted and c.lines == [b'{"c": 1}'] and c.dropped > 4900
        f.write_bytes(b'{"d": 1}\n')
        c = read_new_lines(fd, f.name, ME, c.cursor)
        assert c.restarted and c.lines == [b'{"d": 1}']
    finally:
        os.close(fd)


def test_dlsub_status_readers_use_the_hardened_reader(tmp_path: Path) -> None:
    from dlsub.job_progress import read_attempts, summarize_progress

    (tmp_path / "progress.jsonl").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "attempts.jsonl")
    assert summarize_progress(tmp_path).step is None and read_attempts(tmp_path) == []
    good = tmp_path / "good"
    good.mkdir()
    (good / "progress.jsonl").write_text(
        json.dumps({"event": "progress", "time": NOW, "step": 4, "attempt": "1-0"}) + "\n"
        + json.dumps({"event": "checkpoint", "time": NOW + 1, "step": None, "seq": 2}) + "\n")
    progress = summarize_progress(good)
    assert progress.step == 4 and progress.checkpoints == 1 and progress.last_checkpoint_step == 4


@pytest.mark.parametrize("attacker_seen_first", [False, True])
def test_a_comment_edited_after_submit_never_takes_an_id_from_the_job_that_submitted_it(
    tmp_path: Path, attacker_seen_first: bool
) -> None:
    """The attack review's race: an older job of another user, submitted without a dlsub comment, has the
    victim's new id edited into its comment (`scontrol update Comment=`) the moment it shows in squeue.
    Its submit is older, but it has no submit record: the victim's record-backed job keeps its id."""
    w = World(tmp_path)
    w.busy_gpus()
    attacker, evil_dir = w.submit("0123abcd", uid=OTHER, user="mallory", comment="",
                                  job_dir=tmp_path / "mallory" / "0123abcd")
    w.fake.jobs[attacker].options["comment"] = "dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1"
    w.progress(evil_dir, attacker)
    agent = w.agent()
    if attacker_seen_first:
        agent.tick(NOW - 30)  # the comment-only claim is bound first...
    victim, victim_dir = w.submit("0123abcd")
    w.progress(victim_dir, victim)
    w.free_gpus()
    actions = agent.tick(NOW)
    # ...and the record-backed submit takes the id: the victim moves, the other job is ignored.
    assert [(a.kind, a.slurm_job_id) for a in actions] == [("signal-move", victim)]
    assert w.store.bindings()["0123abcd"].uid == ME and w.store.bindings()["0123abcd"].source == "record"
    assert [d.kind for d in w.store.decisions(uid=OTHER)][-1] == "ignored"
    assert not [d for d in w.store.decisions(uid=ME) if d.kind == "ignored"]
