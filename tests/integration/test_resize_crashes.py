"""Integration (live testbed: real Slurm, rootless Podman, PyTorch): kill -9 of the agent at each step of a resize.

As in test_move_crashes.py, the agent is ticked by hand as its service
account; with ``DLSUB_FAILPOINT=<point>`` the tick SIGKILLs itself the
moment it passes that point of a grow or a shrink (dlsub.agent.failpoints);
later ticks run without it, as a restarted agent would.

* Grow (an elastic job at its minimum, a node freed): from its point the
  job grows to world size 8 once: one grow decision, the worker task never
  requeued, nothing left in flight in the agent's store.
* Shrink (the job grown, another user's job waits for the node): from its
  point the worker leaves once (Slurm's restart count of the task is 1: it
  was not told to leave a second time while it checkpointed), the other job
  starts, training goes on at world size 4. A restarted agent finds the
  worker in its store as leaving. Killed before the signal went
  (``shrink-planned``, in the unit tests; the branch below stays for running
  it live), the agent counts the worker as leaving from when it planned it,
  and tells it once the wait (the policy's checkpoint grace, ``leave_wait_s``) is over.

Which points run live is GROW_POINTS and SHRINK_POINTS below: one of each kind.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_elastic import TRAIN, after_first, world_sizes
from test_move_crashes import decisions, tick

from dlsub.agent.decide import leave_wait_s
from dlsub.site_config.policy_file import load_policy
from livebed import POLICY_FILE, TestbedUser, blockers, slurm_job, slurm_jobs, wait_for

# Live, one point of each kind: the one where Slurm has changed and the agent's record has not yet (a worker
# released, a worker signalled). Every point of both kinds runs against the stateful fake Slurm in
# tests/unit/test_agent_resize_crashes.py; each live point costs a minute or more of CI.
GROW_POINTS = ("grow-released",)
SHRINK_POINTS = ("shrink-signal-sent",)


def in_flight(db: Path) -> list[tuple[str, str, str]]:
    """The agent's resizes in flight: (worker, kind, phase)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("select worker, kind, phase from resizes order by since").fetchall()
    finally:
        conn.close()


def worker_tasks(array: int) -> list[dict[str, Any]]:
    return [j for j in slurm_jobs() if j.get("array_job_id") == array]


def elastic_at_minimum(user: TestbedUser, workdir: Path) -> tuple[dict[str, Any], int]:
    """An elastic job (1:2 nodes of 4 GPUs) training at world size 4 with a checkpoint, while a blocker
    holds the other node; returns the job and the blocker."""
    (blocker,) = blockers(user, count=1, gpus=4)
    job = user.submit("--nodes", "1:2", "--gpus-per-node", "4", TRAIN, "--epochs", "60", "--throttle", "0.1",
                      cwd=workdir)
    wait_for("training at world size 4", lambda: world_sizes(job["job_dir"])[-1:] == [4], timeout=180)
    return job, blocker


def free_the_node(blocker: int) -> None:
    subprocess.run(["scancel", str(blocker)], check=True)
    wait_for("the blocker to end", lambda: (slurm_job(blocker) or {}).get("job_state") != "RUNNING", timeout=60)


def cleanup(*ids: int | None) -> None:
    for leftover in ids:
        if leftover:
            subprocess.run(["scancel", str(leftover)], check=False)


@pytest.mark.parametrize("point", GROW_POINTS)
def test_agent_killed_at_each_step_of_a_grow_grows_the_job_once(
    point: str, user: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    job, blocker = elastic_at_minimum(user, workdir)
    try:
        free_the_node(blocker)
        wait_for(f"the agent to die at {point}", lambda: tick(manual_agent, point) in (137, -9), timeout=150,
                 interval=2)
        if point == "grow-planned":
            assert [(k, p) for _, k, p in in_flight(manual_agent)] == [("grow", "planned")], \
                "the grow was written ahead of the release"

        def grown() -> bool:
            tick(manual_agent)
            return 8 in world_sizes(job["job_dir"])

        wait_for("the job to grow after the restart", grown, timeout=180, interval=2)
        tick(manual_agent)
        kinds = [k for k, _ in decisions(manual_agent, job["slurm_job_id"])]
        assert kinds.count("grow") == 1, kinds
        assert in_flight(manual_agent) == [], "nothing left in flight"
        running = [t for t in worker_tasks(job["worker_array_id"]) if t.get("job_state") == "RUNNING"]
        assert len(running) == 1 and running[0].get("restart_cnt") == 0, running
    finally:
        cleanup(blocker, job["slurm_job_id"], job["worker_array_id"])


@pytest.mark.parametrize("point", SHRINK_POINTS)
def test_agent_killed_at_each_step_of_a_shrink_sends_the_worker_away_once(
    point: str, user: TestbedUser, user2: TestbedUser, workdir: Path, manual_agent: Path
) -> None:
    job, blocker = elastic_at_minimum(user, workdir)
    other = None
    try:
        free_the_node(blocker)
        wait_for("the job to grow", lambda: tick(manual_agent) == 0 and 8 in world_sizes(job["job_dir"]),
                 timeout=180, interval=2)
        out = user2.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", "-J", "needs-a-node", "--mem=200",
                        "--cpus-per-task=1", "--time=5", "--wrap", "sleep 5", check=True)
        other = int(out.stdout.strip().split(";")[0])
        wait_for(f"the agent to die at {point}", lambda: tick(manual_agent, point) in (137, -9), timeout=150,
                 interval=2)
        tick(manual_agent)  # restarted
        assert [(k, p) for _, k, p in in_flight(manual_agent)] == [("shrink", "leaving")], \
            "the restarted agent knows the worker is leaving"

        def shrunk() -> bool:
            tick(manual_agent)
            return 4 in after_first(world_sizes(job["job_dir"]), 8)

        wait = leave_wait_s(load_policy(POLICY_FILE))
        wait_for("training back at world size 4", shrunk, timeout=wait + 180, interval=2)
        wait_for("the other user's job to start", lambda: tick(manual_agent) == 0 and (slurm_job(other) or {}).get(
            "job_state") in ("RUNNING", "COMPLETED", None), timeout=180, interval=2)
        tasks = worker_tasks(job["worker_array_id"])
        assert [t.get("restart_cnt") for t in tasks] == [1], ("told to leave once, requeued once", tasks)
        kinds = [k for k, _ in decisions(manual_agent, job["slurm_job_id"])]
        # Killed before its signal, the shrink is decided again after the wait: never more than that.
        assert kinds.count("shrink") == (2 if point == "shrink-planned" else 1), kinds
    finally:
        cleanup(blocker, other, job["slurm_job_id"], job["worker_array_id"])
