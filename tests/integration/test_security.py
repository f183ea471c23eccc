"""Integration tests (live testbed: real Slurm with slurmdbd and job_submit.lua, rootless Podman): two users.

The victim is the testbed user; the user2 a second unprivileged user
who does what any user can: plain `sbatch` with a forged comment, files of
any kind in its own job directories, squatting in /tmp. Each test asserts
that the victim's Slurm job is untouched (partition, GRES, hold, restart
count) and that the agent keeps ticking. The agent is ticked by hand, as
its service account, on a database of its own (`manual_agent`).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plain_jobs import sbatch

from livebed import (
    AGENT_USER,
    EXAMPLES,
    HOSTS_DIR,
    TestbedUser,
    agent_tick,
    put,
    slurm_job,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")


def snapshot(job_id: int) -> dict[str, Any]:
    """What the agent must never change on someone else's behalf."""
    record = slurm_job(job_id) or {}
    return {key: record.get(key) for key in ("partition", "tres_per_node", "restart_cnt", "priority", "state_reason",
                                             "time_limit")}


def running_snapshot(job_id: int) -> dict[str, Any]:
    record = slurm_job(job_id) or {}
    assert record.get("job_state") == "RUNNING", record.get("job_state")
    return snapshot(job_id)


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The agent's private database, read as root."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


#: What every plain job here asks for, before its own options.
PLAIN = ("--mem=100", "--cpus-per-task=1", "--time=10")


def running_job(user: TestbedUser, workdir: Path, *args: str) -> dict[str, Any]:
    """A dlsub training job of the victim's, running, with a checkpoint written."""
    job = user.submit(*args, TRAIN, "--epochs", "30", "--throttle", "0.3", cwd=workdir)
    wait_for("the victim's job to checkpoint",
             lambda: (s := user.status(job["id"]))["state"] == "RUNNING" and s["last_checkpoint_step"] is not None,
             timeout=120)
    return job


def forged_progress(directory: Path) -> str:
    now = time.time()
    events = [
        {"event": "progress", "time": now - 20, "step": 10, "total_steps": 100000, "attempt": "x"},
        {"event": "progress", "time": now - 1, "step": 20, "total_steps": 100000, "attempt": "x"},
        {"event": "checkpoint", "time": now - 2, "step": 19, "attempt": "x"},
    ]
    return "".join(json.dumps(e) + "\n" for e in events)


def user2_dir(user2: TestbedUser, name: str) -> Path:
    path = user2.home / ".dlsub-forged" / name
    user2.run("mkdir", "-p", str(path), check=True)
    user2.run("chmod", "-R", "755", str(user2.home / ".dlsub-forged"), check=True)
    return path


def test_another_users_job_reusing_my_id_moves_nothing_of_mine(
    user: TestbedUser, user2: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    """A plain sbatch job of the user2's whose comment names the victim's dlsub id."""
    victim = running_job(user, workdir, "--mode", "ideal", "-p", "gpu", "--gpus", "1")
    before = running_snapshot(victim["slurm_job_id"])
    agent_tick(manual_agent)  # the victim's id is bound to the victim's uid from here on
    fake = user2_dir(user2, victim["id"])
    put(user2, fake / "progress.jsonl", forged_progress(fake))
    forged = sbatch(user2, *PLAIN, "-p", "cpu", f"--output={fake}/slurm-%j.out",
                    f"--comment=dlsub:{victim['id']};mode=immediate;ideal=gpu-dev;gpus=2", "--wrap", "sleep 120")
    try:
        wait_for("the forged job to run", lambda: (slurm_job(forged) or {}).get("job_state") == "RUNNING")
        for _ in range(3):
            actions = agent_tick(manual_agent)
            assert all(a["slurm_job_id"] != victim["slurm_job_id"] for a in actions if a["kind"] != "note"), actions
            assert all(a["slurm_job_id"] != forged for a in actions if a["kind"] != "note"), actions
        assert running_snapshot(victim["slurm_job_id"]) == before
        assert (slurm_job(forged) or {}).get("partition") == "cpu"
        user2_uid = user2.uid
        ignored = rows(manual_agent, "select kind, reason from decisions where slurm_job_id = ? and uid = ?",
                       forged, user2_uid)
        assert any(kind == "ignored" for kind, _ in ignored), ignored
        # The user2's forged decision is not the victim's to read, and the victim's not the user2's.
        assert victim["id"] not in user2.dlsub("why", victim["id"], check=False).stdout.replace(
            f"job {victim['id']}", "")
    finally:
        subprocess.run(["scancel", str(forged), str(victim["slurm_job_id"])], check=False)


def test_my_directory_named_by_another_users_job_is_never_read(
    user: TestbedUser, user2: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    """The user2's job points its output (and so its job directory) into the victim's job directory."""
    victim = running_job(user, workdir, "--mode", "ideal", "-p", "cpu")
    job_dir = Path(victim["job_dir"])
    before = running_snapshot(victim["slurm_job_id"])
    forged = sbatch(user2, *PLAIN, "-p", "cpu", f"--output={job_dir}/slurm-%j.out",
                    "--comment=dlsub:0badc0de;mode=immediate;ideal=gpu;gpus=1", "--wrap", "sleep 120")
    try:
        wait_for("the forged job to be seen", lambda: slurm_job(forged) is not None)
        agent_tick(manual_agent)
        agent_tick(manual_agent)
        assert running_snapshot(victim["slurm_job_id"]) == before
        # Nothing the agent stored for the forged job came from the victim's files.
        progress = rows(manual_agent, "select count(*) from progress where slurm_job_id = ?", forged)
        assert progress == [(0,)], progress
    finally:
        subprocess.run(["scancel", str(forged), str(victim["slurm_job_id"])], check=False)


@pytest.fixture
def hostile_jobs(user2: TestbedUser) -> Iterator[list[int]]:
    """Jobs of the other user, dlsub's by their comment (job_submit.lua records them as such), whose
    progress and attempt files are a FIFO, a symlink to /dev/zero, a 64 MiB line, and malformed values."""
    ids, dirs = [], []
    for n in range(4):
        dlsub_id = f"0bad{os.getpid() % 0x1000:03x}{n}"
        job_dir = user2_dir(user2, dlsub_id)
        ids.append(sbatch(user2, *PLAIN, "-p", "cpu", f"--output={job_dir}/slurm-%j.out",
                          f"--comment=dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1", "--wrap", "sleep 300"))
        dirs.append(job_dir)
    fifo, zero, huge, bad = dirs
    for name in ("progress.jsonl", "attempts.jsonl"):
        user2.run("mkfifo", str(fifo / name), check=True)
        user2.run("ln", "-s", "/dev/zero", str(zero / name), check=True)
        user2.run("sh", "-c", f"head -c 67108864 /dev/zero | tr '\\0' a > '{huge / name}'", check=True)
    malformed = [{"event": "progress", "time": "x", "step": 1}, {"event": "progress", "time": 1e999, "step": "y"},
                 {"event": "checkpoint", "time": float("nan"), "step": -5}, ["not", "an", "object"],
                 {"event": "progress", "time": time.time(), "step": 10**30, "total_steps": -1}]
    put(user2, bad / "progress.jsonl", "\n".join(json.dumps(m) for m in malformed) + "\n")
    yield ids
    subprocess.run(["scancel", *map(str, ids)], check=False)
    shutil.rmtree(user2.home / ".dlsub-forged", ignore_errors=True)


def test_hostile_files_cost_only_their_own_job_an_observation(
    user: TestbedUser, user2: TestbedUser, workdir: Path, hostile_jobs: list[int], manual_agent: Path
) -> None:
    victim = running_job(user, workdir, "--mode", "ideal", "-p", "cpu")
    wait_for("the hostile jobs to run",
             lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in hostile_jobs), timeout=90)
    started = time.monotonic()
    agent_tick(manual_agent)
    agent_tick(manual_agent)
    elapsed = time.monotonic() - started
    assert elapsed < 30, f"two ticks took {elapsed:.0f} s"
    # The victim was observed: the agent recorded its progress.
    seen = rows(manual_agent, "select count(*) from progress where slurm_job_id = ?", victim["slurm_job_id"])
    assert seen[0][0] >= 1, seen
    # Each hostile job was skipped with a reason its owner can read.
    for job_id in hostile_jobs[:3]:
        reasons = rows(manual_agent, "select reason from decisions where slurm_job_id = ?", job_id)
        assert reasons, f"no recorded reason for hostile job {job_id}"
    subprocess.run(["scancel", str(victim["slurm_job_id"])], check=False)


def test_output_and_checkpoints_are_private_and_the_agent_reads_only_its_files(
    user: TestbedUser, user2: TestbedUser, workdir: Path
) -> None:
    victim = running_job(user, workdir, "--mode", "ideal", "-p", "cpu")
    job_dir = Path(victim["job_dir"])
    output = job_dir / f"slurm-{victim['slurm_job_id']}.out"
    try:
        for path in (output, job_dir / "progress.jsonl", job_dir / "attempts.jsonl", job_dir / "checkpoints"):
            assert user2.run("cat", str(path)).returncode != 0, f"{user2.name} can read {path}"
        assert user2.run("ls", str(job_dir / "checkpoints")).returncode != 0
        agent = ["runuser", "-u", AGENT_USER, "--"]
        for path in (job_dir / "progress.jsonl", job_dir / "attempts.jsonl"):
            assert subprocess.run([*agent, "head", "-c", "1", str(path)], capture_output=True).returncode == 0, path
        assert subprocess.run([*agent, "head", "-c", "1", str(output)], capture_output=True).returncode != 0
        assert subprocess.run([*agent, "ls", str(job_dir / "checkpoints")], capture_output=True).returncode != 0
    finally:
        subprocess.run(["scancel", str(victim["slurm_job_id"])], check=False)


def test_a_script_that_exits_85_forever_is_requeued_at_most_max_continuations_times(
    user: TestbedUser, workdir: Path, service_agent: None
) -> None:
    """The batch script itself bounds resume-requeues (the testbed policy allows 2: 3 attempts in all)."""
    script = put(user, workdir / "loop 85; x.py",
                 "from dlsub import checkpointing\n\ncheckpointing.init().exit_for_resume()\n")
    job = user.submit("-p", "cpu", "--cpus", "1", "--mem", "200M", str(script), cwd=workdir)
    final = wait_for("the loop to end", lambda: (s := user.status(job["id"]))["state"] not in (
        "PENDING", "RUNNING", "REQUEUED") and s, timeout=240, interval=2)
    record = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(job["slurm_job_id"]), "--format=State,Restarts"],
                            capture_output=True, text=True).stdout
    assert final["attempts"] == 3 and final["state"] == "FAILED", (final, record)
    out = (Path(job["job_dir"]) / f"slurm-{job['slurm_job_id']}.out").read_text()
    assert "continuations" in out, out


def test_a_squatted_runtime_directory_is_refused_not_used(
    user: TestbedUser, user2: TestbedUser, workdir: Path
) -> None:
    """Without /run/user/UID, dlsub and the batch script fall back to /tmp/dlsub-xdg-UID; another user made it,
    on the login host (dlsub's own check) and on the CPU nodes (the batch script's), each in its own /tmp."""
    runtime = Path(f"/run/user/{user.uid}")
    aside = runtime.with_name(f"{user.uid}.aside-{os.getpid()}")
    squat = Path(f"/tmp/dlsub-xdg-{user.uid}")
    on_nodes = [HOSTS_DIR / node / "tmp" / squat.name for node in ("cpu1", "cpu2")]
    script = put(user, workdir / "hello.py", "print('hello')\n")
    # The cpu partition is full, so the victim's job waits while the other user squats.
    blockers = [sbatch(user2, *PLAIN, "-p", "cpu", "--cpus-per-task=4", "--wrap", "sleep 600") for _ in range(2)]
    job: dict[str, Any] = {}
    try:
        wait_for("the cpu blockers", lambda: all((slurm_job(b) or {}).get("job_state") == "RUNNING" for b in blockers))
        job = user.submit("-p", "cpu", "--cpus", "1", "--mem", "200M", str(script), cwd=workdir)
        for path in (squat, *on_nodes):
            shutil.rmtree(path, ignore_errors=True)
            user2.run("mkdir", "-m", "777", str(path), check=True)
        runtime.rename(aside)
        # dlsub itself refuses to use it (its image check runs Podman), and submits nothing.
        refused = user.dlsub("-p", "cpu", str(script), cwd=workdir, check=False)
        assert refused.returncode == 2 and str(squat) in refused.stderr, refused
        # The waiting job starts: its batch script refuses too, before Podman runs.
        subprocess.run(["scancel", *map(str, blockers)], check=True)
        final = wait_for("the job to end", lambda: (s := user.status(job["id"]))["state"] in (
            "FAILED", "COMPLETED", "CANCELLED") and s, timeout=120, interval=2)
        assert final["state"] == "FAILED"
        out = (Path(job["job_dir"]) / f"slurm-{job['slurm_job_id']}.out").read_text()
        assert str(squat) in out and "hello" not in out, out
        for path in (squat, *on_nodes):
            assert not any(p.owner() == user.name for p in path.rglob("*")), f"the victim wrote into {path}"
    finally:
        if aside.exists():
            aside.rename(runtime)
        subprocess.run(["scancel", *map(str, blockers)], check=False)
        for path in (squat, *on_nodes):
            shutil.rmtree(path, ignore_errors=True)


def test_an_admin_hold_on_a_moving_job_is_never_released_by_the_agent(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], manual_agent: Path
) -> None:
    job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "30", "--throttle", "0.2",
                      cwd=workdir)
    slurm_id = job["slurm_job_id"]
    try:
        wait_for("a checkpoint on cpu",
                 lambda: (s := user.status(job["id"]))["state"] == "RUNNING" and s["last_checkpoint_step"], timeout=120)
        subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
        wait_for("the move to start", lambda: any(a["kind"] == "signal-move" for a in agent_tick(manual_agent)),
                 timeout=60, interval=2)
        wait_for("the job to checkpoint and wait held",
                 lambda: (slurm_job(slurm_id) or {}).get("state_reason") == "JobHeldUser", timeout=90)
        subprocess.run(["scontrol", "hold", str(slurm_id)], check=True)  # root: an administrator's hold
        wait_for("the admin hold", lambda: (slurm_job(slurm_id) or {}).get("state_reason") == "JobHeldAdmin")
        held = snapshot(slurm_id)
        for _ in range(3):
            actions = agent_tick(manual_agent)
            assert not [a for a in actions if a["kind"] in ("release", "retarget")], actions
        assert snapshot(slurm_id) == held, "the agent touched an administrator's hold"
        subprocess.run(["scontrol", "release", str(slurm_id)], check=True)
    finally:
        subprocess.run(["scancel", str(slurm_id)], check=False)


def test_the_gpu_limit_counts_every_job_of_the_user_and_moves_in_the_same_tick(
    user: TestbedUser, user2: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    """Limit 2 GPUs: the user holds 1 in a plain sbatch job; of two jobs waiting to move, only one may."""
    policy = Path(str(manual_agent) + ".policy.toml")
    text = Path("/etc/dlsub/policy.toml").read_text().replace("max_gpus_per_user = 8", "max_gpus_per_user = 2")
    assert "max_gpus_per_user = 2" in text
    policy.write_text(text)
    policy.chmod(0o644)
    # The user2's jobs keep the GPUs busy so that the user's two jobs start on cpu.
    blockers = [sbatch(user2, *PLAIN, "-p", "gpu", "--gres=gpu:4", "--wrap", "sleep 600") for _ in range(2)]
    ids: list[int] = []
    try:
        wait_for("the GPUs busy", lambda: all((slurm_job(b) or {}).get("job_state") == "RUNNING" for b in blockers))
        jobs = [user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "30", "--throttle", "0.3",
                            cwd=workdir) for _ in range(2)]
        ids = [j["slurm_job_id"] for j in jobs]
        assert [j["partition"] for j in jobs] == ["cpu", "cpu"]
        for j in jobs:
            wait_for("checkpoints on cpu", lambda j=j: user.status(j["id"])["last_checkpoint_step"], timeout=150)
        subprocess.run(["scancel", str(blockers[0])], check=True)
        wait_for("a GPU node idle", lambda: slurm_job(blockers[0]) is None
                 or (slurm_job(blockers[0]) or {}).get("job_state") != "RUNNING")
        plain = sbatch(user, *PLAIN, "-p", "gpu", "--gres=gpu:1", "--wrap", "sleep 600")
        ids.append(plain)
        wait_for("the user's plain GPU job to run", lambda: (slurm_job(plain) or {}).get("job_state") == "RUNNING")
        actions = agent_tick(manual_agent, policy=policy)
        moves = [a for a in actions if a["kind"] == "signal-move"]
        assert len(moves) == 1, actions
        notes = [a for a in actions if a["kind"] == "note" and "limit" in a["reason"]]
        assert len(notes) == 1, actions
    finally:
        subprocess.run(["scancel", *map(str, [*blockers, *ids])], check=False)


def test_a_comment_edited_onto_an_older_job_never_takes_my_id(
    user: TestbedUser, user2: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    """The attack review's race: the other user edits the victim's new id into the comment of an older,
    held job of theirs. Older submit, but no submit record: the victim keeps its id and its agent."""
    older = sbatch(user2, *PLAIN, "--hold", "-p", "cpu", "--wrap", "sleep 600")
    victim: dict[str, Any] = {}
    try:
        victim = user.submit("--mode", "ideal", "-p", "cpu", TRAIN, "--epochs", "30", "--throttle", "0.3",
                             cwd=workdir)
        user2.run("scontrol", "update", f"jobid={older}",
                  f"comment=dlsub:{victim['id']};mode=immediate;ideal=gpu;gpus=1", check=True)
        agent_tick(manual_agent)
        agent_tick(manual_agent)
        owner = rows(manual_agent, "select uid, source from bindings where dlsub_id = ?", victim["id"])
        assert owner == [(user.uid, "record")], owner
        assert rows(manual_agent, "select count(*) from decisions where uid = ? and kind = 'ignored'",
                    user.uid) == [(0,)]
        ignored = rows(manual_agent, "select kind from decisions where slurm_job_id = ?", older)
        assert ("ignored",) in ignored, ignored
    finally:
        subprocess.run(["scancel", str(older), *([str(victim["slurm_job_id"])] if victim else [])], check=False)
