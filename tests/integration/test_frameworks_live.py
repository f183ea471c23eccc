"""Integration (live Slurm testbed, rootless Podman, the training image's real Lightning, transformers and torch):
jobs written with a framework, moved, continued and resized by dlsub, each time resuming at the step it stopped.

* A Lightning job and a Hugging Face Trainer job (the examples as installed, beside a driver that slows their
  steps), submitted together in immediate mode while the GPUs are busy, start on the CPU partition; when the
  GPUs free, the agent moves both to the gpu partition, and then continues both past their time limit (a fake
  clock: "the allocation ends in 5 s"). Each has three attempts (cpu, gpu, gpu) and its progress reports
  are the steps 1..N once each, its loss carrying on from where it stopped, not starting over.
* The same two, elastic in GPUs (``--gpus 1:2``), grow 1 -> 2 when a GPU frees and shrink back to 1 for
  another user's job, each re-formed group resuming at the step the last one stopped.
* A job of plain PyTorch with FSDP2 and sharded (DCP) checkpoints, elastic in GPUs (``--gpus 2:4 --gpus-step
  2``), grows 2 -> 4 when GPUs free and shrinks back to 2 for another user's job; every re-formed group
  restores the sharded checkpoint its predecessor wrote at another world size, at the step it stopped.
* The same sharded job, one rank SIGKILLed while the third checkpoint is written: torchrun restarts the group,
  which restores the second, the newest complete one (unit tests besides: test_sharded_checkpoints, a save
  SIGKILLed midway; test_hf_trainer_adapter, a checkpoint folder never sealed).

The two framework jobs share each test (they run side by side) to keep CI's time.
Nothing is downloaded at run time: tiny models built from config, generated data, HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from livebed import (
    EXAMPLES,
    TestbedUser,
    agent_tick,
    attempts,
    hold_all,
    job_output,
    progress_events,
    put,
    slurm_job,
    wait_for,
    why_as_agent,
)

# Drivers: each imports an example copied beside it (a job's container mounts only the script's folder, the
# workdir and the job directory) and slows its steps to argv[1] seconds, so that the agent sees enough work
# left to move it: the testbed's policy moves a job when its ETA x (1 - 0.25) - 15 s restart >= 5 s. The
# Lightning and Trainer drivers slow only their first two attempts (Slurm's restart count 0 and 1): in the
# third, after the move and the continuation, nothing is left to decide, and it trains on at full speed.
LIGHTNING_DRIVER = """
import os
import sys
import time

import lightning as L

import lightning_train

THROTTLE = float(sys.argv[1]) if int(os.environ.get("SLURM_RESTART_COUNT") or 0) < 2 else 0.0


class Throttle(L.Callback):
    def on_train_batch_end(self, *args):
        time.sleep(THROTTLE)


lightning_train.main(sys.argv[2:], callbacks=[Throttle()])
"""

HF_DRIVER = """
import os
import sys
import time

# Built from a config: nothing to fetch, and nothing may be (the nodes have no network); the user's home is
# not mounted in the container, so the Hugging Face cache goes to the job directory.
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  HF_HOME=os.path.join(os.environ.get("DLSUB_JOB_DIR", "."), "hf-home"))
from transformers import TrainerCallback

import hf_trainer_train

THROTTLE = float(sys.argv[1]) if int(os.environ.get("SLURM_RESTART_COUNT") or 0) < 2 else 0.0


class Throttle(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(THROTTLE)


hf_trainer_train.main(sys.argv[2:], callbacks=[Throttle()])
"""

SHARDED_DRIVER = """
import sys
import time

import sharded_train

sharded_train.main(sys.argv[2:], on_step=lambda step: time.sleep(float(sys.argv[1])))
"""


# The sharded example, its rank 1 SIGKILLed once (a marker in the job directory) while its shards of the third
# checkpoint are written: what a node's out-of-memory kill or a crash does mid-save.
KILLED_MID_SAVE_DRIVER = """
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp

import sharded_train

marker = Path(os.environ["DLSUB_JOB_DIR"]) / "killed-mid-save"
write_data = dcp.FileSystemWriter.write_data
saves = []


def write_then_die(self, plan, planner):
    written = write_data(self, plan, planner)
    saves.append(1)
    if len(saves) == 3 and os.environ.get("RANK") == "1" and not marker.exists():
        written.wait()  # its shards are on disk; the checkpoint never completes
        marker.write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    return written


dcp.FileSystemWriter.write_data = write_then_die
sharded_train.main(sys.argv[2:], on_step=lambda step: time.sleep(float(sys.argv[1])))
"""


def driven(user: TestbedUser, workdir: Path, example: str, driver: str) -> Path:
    """The example, copied from the installed examples, and its driver, in the test's workdir."""
    put(user, workdir / example, (EXAMPLES / example).read_text())
    return put(user, workdir / f"drive_{example}", driver)


def checkpointed(user: TestbedUser, job: str) -> int | None:
    status = user.status(job)
    return status["last_checkpoint_step"] if status["state"] == "RUNNING" else None


def assert_resumed_where_it_stopped(name: str, job_dir: str, steps: int, restarts: int) -> None:
    """Its progress reports are the steps 1..``steps`` once each, in order (every resume began at the step after
    the one it stopped at: none lost, none trained twice); there were ``restarts`` restores, each at the last step
    reported before it; and each resumed run's first loss is the trained model's, not a fresh one's."""
    recorded = progress_events(job_dir)
    progress = [e for e in recorded if e["event"] == "progress" and "step" in e]
    assert [e["step"] for e in progress] == list(range(1, steps + 1)), \
        f"{name}: steps {[e['step'] for e in progress]}\n{job_output(job_dir)[-3000:]}"
    restores = [e for e in recorded if e["event"] == "restore"]
    assert len(restores) == restarts, f"{name}: restores {restores}"
    first_loss = progress[0]["loss"]
    for restore in restores:
        before = [e for e in progress if e["time"] <= restore["time"]]
        after = [e for e in progress if e["time"] > restore["time"] and "loss" in e]
        assert restore["step"] == before[-1]["step"], f"{name}: restored {restore['step']}, stopped at {before[-1]}"
        if restore["step"] == steps:
            continue  # grown or moved as its last step ended (a CI run): the resumed run had nothing left to train
        # A model started over would be back near its first loss (the examples' losses fall 3-100x in their
        # first 50 steps, and every stop here comes after step 50).
        assert after, f"{name}: nothing trained after the restore at step {restore['step']}"
        assert after[0]["loss"] < 0.5 * first_loss, f"{name}: loss {after[0]['loss']} after the restore at " \
            f"step {restore['step']}; the first was {first_loss}"


# (example, driver, seconds a step sleeps, max steps). Each checkpoints first at step 50; the agent may move
# them once both have, and a move must leave 27 s of work (ETA x 0.75 - 15 s >= 5 s). Measured outside Slurm
# on a loaded 2-core machine, through dlsub's launcher and torchrun: Lightning 0.17-0.19 s a step, the Trainer
# 0.16-0.29 s; so at least ~37 s of work are left at step 75 (Lightning, which starts a few seconds sooner).
# The Trainer job is submitted first: its imports take longer. Since each process takes one thread here
# (5569b0c) the Trainer's steps take 0.125 s, and by the agent's first look it stood near step 80: at 280
# steps, 25 s of work were left and it was rightly not moved (CI at ef73d03, and here). At 420, some 40 s are
# left at step 100, and the 27 s a move needs until about step 200.
FRAMEWORK_JOBS = {
    "hugging face": ("hf_trainer_train.py", HF_DRIVER, "0.1", 420),
    "lightning": ("lightning_train.py", LIGHTNING_DRIVER, "0.15", 320),
}


def test_lightning_and_hugging_face_jobs_move_to_a_gpu_and_continue_past_a_time_limit_at_the_step_they_stopped(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], manual_agent: Path
) -> None:
    jobs = {}
    for name, (example, driver, throttle, steps) in FRAMEWORK_JOBS.items():
        script = driven(user, workdir, example, driver)
        jobs[name] = user.submit("--mode", "immediate", "--gpus", "1", "--time", "5", str(script), throttle,
                                 "--max-steps", str(steps), cwd=workdir)
        assert jobs[name]["partition"] == "cpu" and jobs[name]["ideal_partition"] == "gpu", (name, jobs[name])
    for name, job in jobs.items():
        wait_for(f"the {name} job's first checkpoint on cpu", lambda job=job: checkpointed(user, job["id"]),
                 timeout=180)
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    decided: list[dict[str, Any]] = []

    def running_on_gpu(restarts: int) -> bool:
        """Both started on gpu after ``restarts`` requeues (one may have completed there since)."""
        decided.extend(agent_tick(manual_agent))  # real time: finishes a move once Slurm may start the job
        records = [slurm_job(job["slurm_job_id"]) or {} for job in jobs.values()]
        return all(r.get("partition") == "gpu" and r.get("job_state") in ("RUNNING", "COMPLETED")
                   and r.get("restart_cnt", 0) >= restarts for r in records)

    try:
        wait_for("the agent to move both jobs to gpu", lambda: running_on_gpu(1), timeout=180, interval=2)
    except AssertionError as exc:  # say what the agent decided (a note says why a job was not moved)
        raise AssertionError(f"{exc}\nthe agent decided: {decided}") from None
    moves = {a["job"]: a for a in decided if a["kind"] == "signal-move"}
    assert set(moves) == {job["id"] for job in jobs.values()}, decided
    assert all(re.search(r"moving to gpu: \d+ GPU\(s\) idle", a["reason"]) for a in moves.values()), moves
    for name, job in jobs.items():
        wait_for(f"the {name} job to train on gpu past its checkpoint", lambda job=job: (
            (s := user.status(job["id"]))["partition"] == "gpu"
            and (s["step"] or 0) > (s["last_checkpoint_step"] or 0)), timeout=90)
    # Fake clock: 5 s before each allocation ends (the first tick continues both when their ends are within the
    # checkpoint grace of each other): more work left than time, so each checkpoints to go on in a new attempt.
    continued: dict[str, dict[str, Any]] = {}
    for end in sorted(slurm_job(job["slurm_job_id"])["end_time"] for job in jobs.values()):  # type: ignore[index]
        if len(continued) < len(jobs):
            continued |= {a["job"]: a for a in agent_tick(manual_agent, now=end - 5) if a["kind"] == "signal-continue"}
    assert set(continued) == {job["id"] for job in jobs.values()}, continued
    assert all("time limit on gpu ends in" in a["reason"] for a in continued.values()), continued
    wait_for("both jobs to continue in a new attempt", lambda: running_on_gpu(2), timeout=180, interval=2)
    for name, job in jobs.items():
        final = user.wait_until_ended(job["id"], f"the {name} job to complete", timeout=180)
        assert final["state"] == "COMPLETED", f"{name}: {final}\n{job_output(job['job_dir'])[-3000:]}"
        runs = attempts(job["job_dir"])
        assert [a["partition"] for a in runs if a["event"] == "start"] == ["cpu", "gpu", "gpu"], (name, runs)
        assert [a.get("action") for a in runs if a["event"] == "end"][:2] == ["move", "requeue"], (name, runs)
        assert_resumed_where_it_stopped(name, job["job_dir"], FRAMEWORK_JOBS[name][3], restarts=2)
        why = why_as_agent(job["id"], manual_agent)
        assert "moving to gpu" in why and "time limit on gpu ends in" in why, (name, why)
    # The frameworks' own checkpoints, sealed by dlsub: Lightning's under the job's checkpoint folder, the
    # Trainer's checkpoint-N folders in its output_dir.
    assert list((Path(jobs["lightning"]["job_dir"]) / "checkpoints" / "lightning").glob("step-*.ckpt.dlsub.json"))
    assert [p for p in (Path(jobs["hugging face"]["job_dir"]) / "hf").glob("checkpoint-*") if p.is_dir()]


def world_sizes(job_dir: str) -> list[int]:
    return [e["world_size"] for e in progress_events(job_dir, "start")]


def grew_then_shrank(job_dir: str, low: int, high: int) -> bool:
    """It has run at ``high`` and, after that, at ``low`` again."""
    sizes = world_sizes(job_dir)
    return high in sizes and low in sizes[sizes.index(high) + 1:]


def test_lightning_and_hugging_face_jobs_grow_and_shrink_resuming_at_the_step_they_stopped(
    user: TestbedUser, user2: TestbedUser, workdir: Path, service_agent: None
) -> None:
    """Each framework job elastic in GPUs (``--gpus 1:2``) starts at one process, grows to two when a GPU frees
    (torchrun re-forms the group: the framework's Trainer starts again in new processes and the adapter
    restores the checkpoint it saved on torchrun's stop) and shrinks back to one for another user's job."""
    # gpu2 busy throughout, two of gpu1's GPUs held: each job starts on one of gpu1's other two. Those two are
    # held too until both jobs wait, then freed at once: a job that started while the other was still being
    # submitted grew onto the GPU meant for it (a CI run; nobody waited for it yet).
    held = hold_all(user, ("gpu2", 4), ("gpu1", 2), ("gpu1", 2))
    other = None
    try:
        jobs = {}
        # 260 steps: in the live runs both grew by step ~65, shrank by ~80 and grew back by ~140.
        for name, (example, driver, throttle, _) in FRAMEWORK_JOBS.items():
            script = driven(user, workdir, example, driver)
            jobs[name] = user.submit("--gpus", "1:2", "--gpus-step", "1", "--cpus", "1", "--mem", "1500M",
                                     str(script), throttle, "--max-steps", "260", cwd=workdir)
            assert jobs[name]["worker_gpus"] == 1 and jobs[name]["gpus_per_node"] == 1, (name, jobs[name])
        subprocess.run(["scancel", str(held.pop())], check=True)
        for name, job in jobs.items():
            wait_for(f"the {name} job training at one process", lambda job=job: world_sizes(job["job_dir"]) == [1]
                     and len(progress_events(job["job_dir"], "progress")) >= 5, timeout=180)
        subprocess.run(["scancel", str(held[1])], check=True)
        for name, job in jobs.items():
            wait_for(f"the agent to grow the {name} job to two", lambda job=job: 2 in world_sizes(job["job_dir"]),
                     timeout=150)
        # Another user's 2-GPU job waits for gpu1: both workers leave, each job goes on at one process. It holds
        # them 20 s: the Hugging Face group takes 10 s or more to form again (its imports), and with a 5 s job the
        # worker was back before it formed at one process (it formed at two; a CI-like run on a loaded machine).
        out = user2.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:2", "-J", "needs-two", "--mem=200",
                        "--cpus-per-task=1", "--time=5", "--wrap", "sleep 20", check=True)
        other = int(out.stdout.strip().split(";")[0])
        for name, job in jobs.items():
            wait_for(f"the {name} job training on at one process", lambda job=job: grew_then_shrank(
                job["job_dir"], 1, 2), timeout=150)
        for name, job in jobs.items():
            final = user.wait_until_ended(job["id"], f"the {name} job to complete", timeout=240)
            assert final["state"] == "COMPLETED", f"{name}: {final}\n{job_output(job['job_dir'])[-3000:]}"
            sizes = world_sizes(job["job_dir"])
            assert sizes[:3] == [1, 2, 1], (name, sizes)  # it may grow again once the other job is done
            assert_resumed_where_it_stopped(name, job["job_dir"], 260, restarts=len(sizes) - 1)
            why = user.dlsub("why", job["id"]).stdout
            assert "growing to 2 GPUs" in why and "shrinking to 1 GPU" in why, (name, why)
    finally:
        for leftover in (*held, other):
            if leftover:
                subprocess.run(["scancel", str(leftover)], check=False)


def test_an_fsdp_job_with_sharded_checkpoints_grows_2_to_4_and_shrinks_back_resuming_at_the_step_it_stopped(
    user: TestbedUser, user2: TestbedUser, workdir: Path, service_agent: None
) -> None:
    # gpu2 busy throughout, two of gpu1's GPUs held: the job starts on gpu1's other two (world size 2).
    held = hold_all(user, ("gpu2", 4), ("gpu1", 2))
    other = None
    try:
        script = driven(user, workdir, "sharded_train.py", SHARDED_DRIVER)
        # 220 steps of 0.13-0.19 s: in the live runs it grew by step ~80, shrank by ~95 and grew back by ~155
        # (the other user's job done), so the shrink has ~125 steps to spare.
        job = user.submit("--gpus", "2:4", "--gpus-step", "2", "--cpus", "2", "--mem", "2G", str(script), "0.1",
                          "--steps", "220", "--every", "20", cwd=workdir)
        assert job["worker_gpus"] == 2 and job["gpus_per_node"] == 2, job
        wait_for("training at world size 2, checkpointed", lambda: world_sizes(job["job_dir"])[-1:] == [2]
                 and progress_events(job["job_dir"], "checkpoint"), timeout=180)
        subprocess.run(["scancel", str(held[1])], check=True)
        wait_for("the agent to grow the job to 4", lambda: 4 in world_sizes(job["job_dir"]), timeout=120)
        grew_at = next(e["time"] for e in progress_events(job["job_dir"], "start") if e["world_size"] == 4)
        wait_for("the 4-process group to train", lambda: [
            e for e in progress_events(job["job_dir"], "progress") if e["time"] > grew_at], timeout=90)
        # Another user's 2-GPU job waits for gpu1: the worker leaves, the job goes on at 2.
        # It holds the GPUs 20 s: the group left takes 10 s or more to form again at the smaller size,
        # and with a 5 s job the worker was back before it had (it formed at the larger size; a CI run).
        out = user2.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:2", "-J", "needs-two", "--mem=200",
                        "--cpus-per-task=1", "--time=5", "--wrap", "sleep 20", check=True)
        other = int(out.stdout.strip().split(";")[0])
        wait_for("training on at world size 2", lambda: 2 in world_sizes(job["job_dir"])[
            world_sizes(job["job_dir"]).index(4) + 1:], timeout=120)
        final = user.wait_until_ended(job["id"], "the sharded job to complete", timeout=240)
        assert final["state"] == "COMPLETED", job_output(job["job_dir"])[-3000:]
        sizes = world_sizes(job["job_dir"])
        assert sizes[:3] == [2, 4, 2], sizes  # it may grow again once the other job is done
        assert_resumed_where_it_stopped("sharded", job["job_dir"], 220, restarts=len(sizes) - 1)
        # Every restore read DCP shards (a folder per checkpoint, dcp-<seq>; the older ones are rotated away by
        # now), written by a group of another size; the ones kept are folders.
        for restore in progress_events(job["job_dir"], "restore"):
            assert Path(restore["path"]).name == f"dcp-{restore['seq']:08d}", restore
        kept = list((Path(job["job_dir"]) / "checkpoints").glob("dcp-*"))
        assert kept and all(p.is_dir() for p in kept), kept
        assert "shrinking to 2 GPUs" in user.dlsub("why", job["id"]).stdout
    finally:
        for leftover in (*held, other):
            if leftover:
                subprocess.run(["scancel", str(leftover)], check=False)


def test_a_sharded_job_killed_mid_save_restores_the_previous_checkpoint(
    user: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    """An elastic job's rank is SIGKILLed while the third DCP checkpoint is written: torchrun restarts the group
    (an elastic job's --max-restarts), which restores the second, the newest complete one, and trains on to
    the end; the killed save's leftovers are cleared by the next save. (No agent runs: the job stays at 2.)"""
    script = driven(user, workdir, "sharded_train.py", KILLED_MID_SAVE_DRIVER)
    job = user.submit("--gpus", "2:4", "--gpus-step", "2", "--cpus", "2", "--mem", "2G", str(script), "0.05",
                      "--steps", "120", "--every", "20", cwd=workdir)
    final = user.wait_until_ended(job["id"], "the job killed mid-save to complete", timeout=240)
    job_dir = Path(job["job_dir"])
    assert final["state"] == "COMPLETED", job_output(job["job_dir"])[-3000:]
    assert (job_dir / "killed-mid-save").exists(), "the kill happened"
    recorded = progress_events(job["job_dir"])
    (restore,) = [e for e in recorded if e["event"] == "restore"]
    complete = [e for e in recorded if e["event"] == "checkpoint" and e["time"] < restore["time"]]
    assert [e["step"] for e in complete] == [20, 40], complete  # the third never completed
    assert restore["step"] == 40 and Path(restore["path"]).name == "dcp-00000002", restore
    after = [e for e in recorded if e["event"] == "progress" and e["time"] > restore["time"]]
    assert after[0]["step"] == 41 and after[-1]["step"] == 120, (after[:1], after[-1:])
    first_loss = next(e["loss"] for e in recorded if e["event"] == "progress")
    assert after[0]["loss"] < 0.5 * first_loss, (after[0], first_loss)  # the trained model, not a fresh one
    assert not list((job_dir / "checkpoints").glob("*.partial")), sorted((job_dir / "checkpoints").iterdir())
