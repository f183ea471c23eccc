"""Integration tests (live testbed: real Slurm with slurmdbd, rootless Podman, PyTorch): the agent.

The agent runs as the service account `dlsub`, a Slurm Operator. Some tests
use the testbed's agent service as it runs; those where time matters stop
it and drive single ticks with a fake clock (`dlsub agent tick --now`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from dlsub.checkpointing.storage import checkpoint_files, checkpoint_meta
from dlsub.site_config.policy_file import load_policy
from livebed import (
    EXAMPLES,
    GPU_TYPES,
    TestbedUser,
    agent_moves,
    agent_service,
    agent_tick,
    attempts,
    job_output,
    kill_slurmd,
    node_back,
    processes_of_job,
    progress_events,
    set_link,
    slurm_job,
    slurm_jobs,
    slurmd_pidfile,
    wait_for,
    why_as_agent,
)

TRAIN = str(EXAMPLES / "train_digits.py")
SERVICE_DB = Path("/var/lib/dlsub/agent.db")


#: Steps of 0.2 s on a CPU node and 0.05 s on a (fake) GPU: the testbed's policy declares the cpu partition a
#: quarter of a GPU's speed, and so the example runs. The agent decides a move on the cpu steps it measures (as
#: before, at 0.2 s a step on both); the GPU attempt, which the tests only wait out, takes a quarter of the time
#: (about 45 s less a test, which runs in CI three times: the full suite and both compat versions).
CPU_FOUR_TIMES_SLOWER = ("--throttle", "0.05", "--cpu-slowdown", "4")


def checkpointed(user: TestbedUser, job: str) -> int | None:
    status = user.status(job)
    return status["last_checkpoint_step"] if status["state"] == "RUNNING" else None


def test_immediate_mode_starts_on_cpu_and_moves_to_gpu_when_it_frees(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None
) -> None:
    """The issue's "done when", as a new user would try it, with the agent service running."""
    job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "10", *CPU_FOUR_TIMES_SLOWER,
                      cwd=workdir)
    assert job["partition"] == "cpu" and job["ideal_partition"] == "gpu" and job["mode"] == "immediate"
    step_at_move = wait_for("a checkpoint on cpu", lambda: checkpointed(user, job["id"]), timeout=120)
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)

    def on_gpu() -> dict | None:
        # Slurm says RUNNING on gpu before the batch script has written its start record; the status's GPU type is
        # that record's, so wait for it too (not only for Slurm's state and the earlier attempt's step).
        started_on_gpu = any(a["event"] == "start" and a["partition"] == "gpu" for a in attempts(job["job_dir"]))
        status = user.status(job["id"])
        running = status["partition"] == "gpu" and status["state"] == "RUNNING" and status["step"]
        return status if running and started_on_gpu else None

    moved = wait_for("the job to run on gpu", on_gpu, timeout=120)
    assert moved["slurm_job_id"] == job["slurm_job_id"], "a move is the same Slurm job, requeued"
    # The kind of GPU, as the node's GRES names it (etc/testbed/slurm.conf), in the status and the container.
    assert moved["gpu_type"] == GPU_TYPES[moved["nodes"]], moved
    wait_for("progress past the checkpoint on gpu",
             lambda: (user.status(job["id"])["step"] or 0) > step_at_move, timeout=60)
    # Done when the agent sees it running on gpu, or released there and waiting to start (if it ticks first).
    why = wait_for("the agent to record the move as done",
                   lambda: w if re.search(r"running on gpu|waiting to start on gpu",
                                          w := user.dlsub("why", job["id"]).stdout) else None, timeout=30)
    assert re.search(r"moving to gpu: \d+ GPU\(s\) idle, checkpoint \d+ s old, est\. .* saved", why), why
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=180)
    assert final["attempts"] == 2
    runs = attempts(job["job_dir"])
    starts = [a for a in runs if a["event"] == "start"]
    assert [a["partition"] for a in starts] == ["cpu", "gpu"] and starts[1]["gpus"] != ""
    assert [a["gpu_type"] for a in starts] == ["", GPU_TYPES[starts[1]["node"]]], starts
    assert [a.get("action") for a in runs if a["event"] == "end"][0] == "move"
    text = job_output(job["job_dir"])
    resumed = re.search(r"resumed from step (\d+)", text)
    assert resumed and int(resumed.group(1)) >= step_at_move, text
    assert re.search(r"done: \d+ steps", text), text
    assert f"on {GPU_TYPES[starts[1]['node']]} GPUs (throttle x1)" in text, text
    # Its cost at the testbed's prices (etc/testbed/policy.toml): the cpu attempt by node-hours at the
    # partition's price, the GPU attempt by GPU-hours at its kind's.
    policy = load_policy(Path("/etc/dlsub/policy.toml"))
    ends = [a for a in runs if a["event"] == "end"]
    hours = [(end["time"] - start["time"]) / 3600 for start, end in zip(starts, ends, strict=True)]
    expected = (hours[0] * policy.partitions["cpu"].cost_per_node_hour
                + hours[1] * len(starts[1]["gpus"].split(",")) * policy.gpu_types[moved["gpu_type"]].cost_per_gpu_hour)
    assert final["cost"] == pytest.approx(expected, abs=2e-4), (final["cost"], expected, runs)


#: A script that uses no dlsub library: steps printed, never a checkpoint (issue 34 item 4).
PLAIN_SCRIPT = """import os
import time
# The first attempt runs long enough to be told apart (plain_grace_s) and restarted; the one on gpu, from
# scratch, need not run as long for the test to see it start over and finish.
for step in range(30 if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" else 5):
    print(f"plain step {step}", flush=True)
    time.sleep(1)
print("plain done", flush=True)
"""


def test_a_plain_script_on_cpu_is_restarted_on_gpu_from_scratch_when_it_frees(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None
) -> None:
    """A script that uses no library, in immediate mode, starts on cpu; once GPUs free and the testbed's
    plain_grace_s (20 s) passes without its start event, the agent restarts it on gpu from scratch (its run
    time on cpu is far under restart_plain_max_s), and it completes there. About a minute."""
    script = workdir / "plain_train.py"
    script.write_text(PLAIN_SCRIPT)
    os.chown(script, user.uid, user.gid)
    submitted = user.dlsub("--json", "--mode", "immediate", "--gpus", "1", str(script), cwd=workdir)
    assert "dlsub: note: plain_train.py uses no dlsub library" in submitted.stderr, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["partition"] == "cpu" and job["ideal_partition"] == "gpu"
    wait_for("the plain job to run on cpu", lambda: user.status(job["id"])["state"] == "RUNNING", timeout=60)
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    final = user.wait_until_ended(job["id"], "the plain job to end", timeout=150)
    assert final["state"] == "COMPLETED" and final["partition"] == "gpu" and final["attempts"] == 2, final
    assert final["uses_library"] is False
    why = user.dlsub("why", job["id"]).stdout
    assert re.search(r"restarting on gpu from scratch: it uses no dlsub library, so it never checkpoints; "
                     r"\d+ (s|min) of work on cpu lost", why), why
    starts = [a for a in attempts(job["job_dir"]) if a["event"] == "start"]
    assert [a["partition"] for a in starts] == ["cpu", "gpu"]
    text = job_output(job["job_dir"])
    assert text.count("plain step 0") == 2 and "plain done" in text, text  # from scratch: step 0 twice


def test_time_limit_continuation_on_gpu_dev(user: TestbedUser, workdir: Path, manual_agent: Path) -> None:
    """Fake clock: the agent is told the allocation ends in 30 s, so it continues the job now."""
    job = user.submit("--mode", "ideal", "-p", "gpu-dev", "--gpus", "1", "--time", "5", TRAIN,
                      "--epochs", "8", "--throttle", "0.2", cwd=workdir)
    step = wait_for("a checkpoint on gpu-dev", lambda: checkpointed(user, job["id"]), timeout=120)
    end_time = slurm_job(job["slurm_job_id"])["end_time"]  # type: ignore[index]
    actions = agent_tick(manual_agent, now=end_time - 30)
    assert [a["kind"] for a in actions] == ["signal-continue"], actions
    assert "time limit on gpu-dev ends in 30 s" in actions[0]["reason"]

    def continued() -> bool:
        agent_tick(manual_agent)  # real time from here: finishes the move once Slurm's requeue wait is over
        record = slurm_job(job["slurm_job_id"]) or {}
        return record.get("job_state") == "RUNNING" and record.get("restart_cnt", 0) >= 1

    wait_for("the job to continue in a new attempt", continued, timeout=120, interval=2)
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=180)
    assert final["attempts"] == 2 and final["partition"] == "gpu-dev"
    text = job_output(job["job_dir"])
    resumed = re.search(r"resumed from step (\d+)", text)
    assert resumed and int(resumed.group(1)) >= step, text
    why = why_as_agent(job["id"], manual_agent)
    assert "continue" in why and "time limit on gpu-dev ends in 30 s" in why


def window_policy(db: Path, start: float, minutes: int) -> Path:
    """The testbed policy with its backfill window moved to [start, start + minutes) today, local time."""
    policy = Path("/etc/dlsub/policy.toml").read_text()
    a, b = datetime.fromtimestamp(start), datetime.fromtimestamp(start + minutes * 60)
    window = (f'[[backfill.window]]\nname = "it-window"\nstart = "{a.minute} {a.hour} * * *"\n'
              f'end = "{b.minute} {b.hour} * * *"\n')
    text = policy[: policy.index("[[backfill.window]]")] + window
    path = Path(str(db) + ".policy.toml")
    path.write_text(text)
    path.chmod(0o644)
    return path


@pytest.fixture
def cpus_busy(user: TestbedUser) -> Iterator[list[int]]:
    """Jobs that take every CPU of the cpu partition."""
    ids = []
    for _ in range(2):
        out = user.run("sbatch", "--parsable", "-p", "cpu", "--cpus-per-task=4", "-J", "blocker", "--mem=200",
                       "--time=30", "--wrap", "sleep 900", check=True)
        ids.append(int(out.stdout.strip()))
    wait_for("the cpu blockers", lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in ids))
    yield ids
    subprocess.run(["scancel", *map(str, ids)], check=False)


def test_off_hours_window_opens_and_closes(
    user: TestbedUser, workdir: Path, cpus_busy: list[int], manual_agent: Path
) -> None:
    """Fake clock: a window that opens in a few minutes; ticks just before, inside, and near its close.

    A CPU job waits for the busy cpu partition; inside the window it runs on the idle dev nodes
    (its time limit cut to gpu-dev's 10 min) and goes back to cpu, checkpointed, before the window closes.
    """
    job = user.submit("--mode", "ideal", "-p", "cpu", TRAIN, "--epochs", "5", "--throttle", "0.2", cwd=workdir)
    wait_for("the job to wait for CPUs",
             lambda: (slurm_job(job["slurm_job_id"]) or {}).get("state_reason") in ("Resources", "Priority"))
    opens = (int(time.time()) // 60 + 2) * 60
    policy = window_policy(manual_agent, opens, 5)
    assert agent_tick(manual_agent, now=opens - 60, policy=policy) == [], "outside the window nothing moves"
    inside = opens + 30
    actions = agent_tick(manual_agent, now=inside, policy=policy)
    assert [(a["kind"], a["partition"]) for a in actions] == [("backfill", "gpu-dev")], actions
    step = wait_for("a checkpoint on gpu-dev", lambda: checkpointed(user, job["id"]), timeout=120)
    assert user.status(job["id"])["partition"] == "gpu-dev"
    assert (slurm_job(job["slurm_job_id"]) or {}).get("time_limit") == 10
    assert agent_tick(manual_agent, now=inside + 60, policy=policy) == [], "it stays while the window is open"
    closing = opens + 4 * 60
    actions = agent_tick(manual_agent, now=closing, policy=policy)
    assert [(a["kind"], a["partition"]) for a in actions] == [("signal-move", "cpu")], actions
    assert "closes in 1 min" in actions[0]["reason"] or "closes in 60 s" in actions[0]["reason"], actions

    def back_in_cpu_queue() -> bool:
        agent_tick(manual_agent, now=max(closing + 10, time.time()), policy=policy)
        record = slurm_job(job["slurm_job_id"]) or {}
        return record.get("partition") == "cpu" and record.get("job_state") == "PENDING" \
            and record.get("state_reason") not in ("JobHeldUser", "JobHeldAdmin")

    wait_for("the job to go back to waiting for cpu", back_in_cpu_queue, timeout=120, interval=2)
    assert (slurm_job(job["slurm_job_id"]) or {}).get("time_limit") == 60, "its own time limit back"
    subprocess.run(["scancel", *map(str, cpus_busy)], check=True)
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=180)
    assert final["partition"] == "cpu" and final["attempts"] == 2
    resumed = re.search(r"resumed from step (\d+)", job_output(job["job_dir"]))
    assert resumed and int(resumed.group(1)) >= step
    why = why_as_agent(job["id"], manual_agent)
    assert "off-hours window 'it-window' is open" in why and "moving back to cpu" in why, why


def test_agent_killed_mid_move_loses_and_duplicates_nothing(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None
) -> None:
    job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "10", *CPU_FOUR_TIMES_SLOWER,
                      cwd=workdir)
    assert job["partition"] == "cpu"
    wait_for("a checkpoint on cpu", lambda: checkpointed(user, job["id"]), timeout=120)
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    wait_for("the agent to start the move", lambda: (job["id"], "signalled") in agent_moves(SERVICE_DB),
             timeout=60, interval=0.1)
    agent_service("kill9")
    assert user.run("dlsub", "agent", "status").returncode == 3, "a killed agent is reported as not running"
    # Without the agent the job checkpoints and waits, held, for someone to finish the move.
    wait_for("the job to checkpoint and wait held",
             lambda: (slurm_job(job["slurm_job_id"]) or {}).get("state_reason") == "JobHeldUser", timeout=90)
    time.sleep(3)
    assert (slurm_job(job["slurm_job_id"]) or {}).get("job_state") == "PENDING", "nothing moved it meanwhile"
    agent_service("start")
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=240)
    assert final["partition"] == "gpu" and final["attempts"] == 2
    # One dlsub job, one Slurm job, two attempts: nothing lost, nothing duplicated.
    mine = [j for j in slurm_jobs() if str(j.get("comment", "")).startswith(f"dlsub:{job['id']}")]
    assert {j["job_id"] for j in mine} <= {job["slurm_job_id"]}
    starts = [a for a in attempts(job["job_dir"]) if a["event"] == "start"]
    assert [(a["slurm_job_id"], a["partition"]) for a in starts] == [
        (job["slurm_job_id"], "cpu"), (job["slurm_job_id"], "gpu")]
    # Done when the agent sees it running on gpu, or released there and waiting to start (if it ticks first).
    why = wait_for("the agent to record the move as done",
                   lambda: w if re.search(r"running on gpu|waiting to start on gpu",
                                          w := user.dlsub("why", job["id"]).stdout) else None, timeout=30)
    assert why.count("moving to gpu") == 1, why


def _lost_node_fenced_and_resumed(user: TestbedUser, workdir: Path, lose: Callable[[str], None],
                                  bring_back: Callable[[str], None]) -> None:
    """A job on a cpu node whose node is lost (``lose``) after its first checkpoint, the job's processes there
    training on: Slurm marks the node down and requeues the job, which resumes on the other node from its
    newest checkpoint. The orphaned attempt, seeing the newer attempt's start, stops its training by itself
    while the node is still lost (fencing, issue 53): its end says superseded, and nothing it wrote after the
    newer attempt began is the job's. Once the node is back (``bring_back``), no process of the job is left on
    it (the no-leftover case)."""
    job = user.submit("-p", "cpu", TRAIN, "--epochs", "15", "--throttle", "0.2", cwd=workdir)
    step = wait_for("a checkpoint", lambda: checkpointed(user, job["id"]), timeout=120)
    node = slurm_job(job["slurm_job_id"])["nodes"]  # type: ignore[index]
    try:
        lose(node)
        wait_for(f"Slurm to see {node} down and start the job again elsewhere",
                 lambda: (r := slurm_job(job["slurm_job_id"]) or {}).get("restart_cnt", 0) >= 1
                 and r.get("job_state") == "RUNNING" and r.get("nodes") not in (None, node), timeout=180, interval=2)
        orphan_end = wait_for("the orphaned attempt to stop itself, superseded",
                              lambda: [a for a in attempts(job["job_dir"]) if a["event"] == "end"
                                       and a.get("restart") == 0 and a.get("action") == "superseded"], timeout=60)
        assert orphan_end[0]["node"] == node, orphan_end
    finally:
        bring_back(node)
    wait_for(f"no process of the orphaned attempt left on {node}",
             lambda: processes_of_job(job["slurm_job_id"], node) == [], timeout=90, interval=2)
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=240)
    starts = [a for a in attempts(job["job_dir"]) if a["event"] == "start"]
    assert len(starts) == 2 and starts[1]["node"] != node, starts
    text = job_output(job["job_dir"])
    resumed = re.search(r"resumed from step (\d+)", text)
    assert resumed and int(resumed.group(1)) >= step, text
    assert final["attempts"] == 2
    # Nothing the orphaned attempt wrote after the newer one began: no progress record, no checkpoint kept.
    orphan, newer_began = f"{starts[0]['slurm_job_id']}-0", starts[1]["time"]
    progress = progress_events(job["job_dir"])
    late = [e for e in progress if e.get("attempt") == orphan and e["time"] >= newer_began]
    late += [m for _, path in checkpoint_files(Path(job["job_dir"]) / "checkpoints")
             if (m := checkpoint_meta(path)).get("attempt") == orphan and m["time"] >= newer_began]
    assert not late, late
    wait_for("no process and no container of the job left anywhere",
             lambda: processes_of_job(job["slurm_job_id"]) == [] and not user.containers(f"dlsub.job_id={job['id']}"),
             timeout=60, interval=2)


def test_slurmd_killed_under_a_running_job_resumes_from_its_checkpoint_elsewhere_and_leaves_nothing(
    user: TestbedUser, workdir: Path, service_agent: None
) -> None:
    """Only the node's slurmd dies (SIGKILL); the job's processes there train on (see
    :func:`_lost_node_fenced_and_resumed`)."""

    def slurmd_back(node: str) -> None:
        slurmd_pidfile(node).unlink(missing_ok=True)
        node_back(node)

    _lost_node_fenced_and_resumed(user, workdir, kill_slurmd, slurmd_back)


def test_a_node_cut_off_the_network_is_fenced_and_its_job_resumes_elsewhere(
    user: TestbedUser, workdir: Path, service_agent: None
) -> None:
    """The node's link is cut (its port on the testbed's bridge down): its slurmd and the job's processes run
    on, unreachable, as behind a failed switch port, and the job directory is still in reach (a shared
    filesystem that is not the network's: this kernel has no NFS). Fenced as above; the link back, Slurm ends
    what is left of the old attempt there (see :func:`_lost_node_fenced_and_resumed`)."""

    def link_back(node: str) -> None:
        set_link(node, up=True)
        node_back(node)

    _lost_node_fenced_and_resumed(user, workdir, lambda node: set_link(node, up=False), link_back)
