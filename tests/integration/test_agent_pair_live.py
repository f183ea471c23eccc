"""Integration (live testbed: Slurm, rootless Podman, two agent services): the agent on two login hosts (issue 53,
item 3). Each runs `dlsub agent run` under ``[failover] shared_state = true`` on one state database both hosts
see (the machine's disk, as a shared filesystem would be); one holds the lease and acts, the other stands by.

The active one's host is lost in the middle of a move, and in the middle of a resize (a shrink whose worker
has been told to leave and is still checkpointing: the one phase of a resize that outlives a tick): its agent
frozen (SIGSTOP: a process that will wake later believing it still acts, the harder case than kill -9, which
the unit tests cover with the same records) and its link cut. The standby takes over within 30 s with the next
token, finishes the move or the shrink from the records, and the job completes intact: one move, or one shrink
(the worker told to leave once). Then the lost host comes back and its agent wakes: its late write is refused
by the token and it stands by, saying so.

The first active agent is login2's, the lost host login2: the tests themselves run on login1 and ask Slurm
from there, so login1 is the host that must keep its link. (The two hosts' agents are the same code; which
one starts first is the only difference.)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_elastic import after_first, elastic_over_gpu_nodes, world_sizes
from test_move_crashes import decisions
from test_resize_crashes import in_flight, worker_tasks

from livebed import (
    EXAMPLES,
    LOGIN2_LOG,
    PAIR_DB,
    TestbedUser,
    agent_moves,
    agent_pair,
    attempts,
    blockers,
    job_output,
    login2_back,
    lose_login2,
    pair_lease,
    progress_events,
    slurm_job,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")
CPU_FOUR_TIMES_SLOWER = ("--throttle", "0.05", "--cpu-slowdown", "4")
LEASE_S = 15
TAKEOVER_LIMIT_S = 30


@pytest.fixture(name="agent_pair")
def agent_pair_fixture() -> Iterator[None]:
    """The pair on a fresh database, login2's agent active (livebed.agent_pair)."""
    with agent_pair(LEASE_S):
        yield


def lose_the_active_login2() -> tuple[int, dict[str, Any]]:
    """login2 lost with its agent active (livebed.lose_login2); login1's agent takes the lease over within
    TAKEOVER_LIMIT_S with the next token. Returns the frozen agent's pid and the new lease."""
    first = pair_lease()
    assert first and first["host"] == "login2", first
    old = lose_login2()
    lost = time.monotonic()
    taken = wait_for("login1's agent to take the lease over",
                     lambda: (r := pair_lease()) and r["host"] == "login1" and r, timeout=TAKEOVER_LIMIT_S + 15,
                     interval=0.5)
    took = time.monotonic() - lost
    print(f"login1's agent took over {took:.1f} s after login2 was lost (lease {LEASE_S} s)")
    assert took <= TAKEOVER_LIMIT_S, f"took over after {took:.1f} s"
    assert taken["token"] == first["token"] + 1, (first, taken)
    return old, taken


def login2_back_and_refused(user: TestbedUser, old: int, taken: dict[str, Any]) -> None:
    """login2 back, its agent woken: what it writes next is refused by the token, it stands by, and the lease
    stays with login1's agent, which `dlsub agent status` names."""
    login2_back(old)
    refused = wait_for("login2's woken agent to be refused and stand by",
                       lambda: [line for line in LOGIN2_LOG.read_text().splitlines() if "standing by" in line],
                       timeout=60)
    assert any("deposed" in line or "lease" in line for line in refused), refused
    still = pair_lease()
    assert still and still["host"] == "login1" and still["token"] == taken["token"], still
    status = user.dlsub("agent", "status").stdout
    assert "answered by: login1, active" in status and "lease: held by login1" in status, status


def test_the_active_agents_host_lost_mid_move_the_standby_takes_over_and_the_late_write_is_refused(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], agent_pair: None
) -> None:
    job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "10", *CPU_FOUR_TIMES_SLOWER,
                      cwd=workdir)
    assert job["partition"] == "cpu"
    wait_for("a checkpoint on cpu", lambda: (s := user.status(job["id"]))["state"] == "RUNNING"
             and s["last_checkpoint_step"], timeout=120)
    first = pair_lease()
    assert first and first["host"] == "login2", first
    status = user.dlsub("agent", "status").stdout
    assert "answered by: login1, standby" in status and "lease: held by login2" in status, status
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    wait_for("login2's agent to start the move", lambda: (job["id"], "signalled") in agent_moves(PAIR_DB), timeout=60,
             interval=0.1)
    old, taken = lose_the_active_login2()
    final = wait_for("completion", lambda: (s := user.status(job["id"]))["state"] == "COMPLETED" and s, timeout=240)
    assert final["partition"] == "gpu" and final["attempts"] == 2, final
    starts = [a for a in attempts(job["job_dir"]) if a["event"] == "start"]
    assert [(a["slurm_job_id"], a["partition"]) for a in starts] == [
        (job["slurm_job_id"], "cpu"), (job["slurm_job_id"], "gpu")], starts
    assert (slurm_job(job["slurm_job_id"]) or {}).get("restart_cnt", 1) == 1, "one requeue: the move, once"
    login2_back_and_refused(user, old, taken)


def test_the_active_agents_host_lost_mid_shrink_the_standby_finishes_it_once(
    user: TestbedUser, user2: TestbedUser, workdir: Path, agent_pair: None
) -> None:
    (blocker,) = blockers(user, count=1, gpus=4)
    other = None
    try:
        job = elastic_over_gpu_nodes(user, workdir)
        subprocess.run(["scancel", str(blocker)], check=True)
        wait_for("login2's agent to grow the job to world size 8", lambda: 8 in world_sizes(job["job_dir"]),
                 timeout=180)
        # Another user's job needs the node: login2's agent tells the worker to leave, and while the worker
        # checkpoints (the shrink's record says "leaving") login2 is lost.
        out = user2.run("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", "-J", "needs-a-node", "--mem=200",
                        "--cpus-per-task=1", "--time=5", "--wrap", "sleep 20", check=True)
        other = int(out.stdout.strip().split(";")[0])
        wait_for("login2's agent to tell the worker to leave",
                 lambda: [p for _, k, p in in_flight(PAIR_DB) if (k, p) == ("shrink", "leaving")], timeout=120,
                 interval=0.1)
        old, taken = lose_the_active_login2()
        wait_for("the other user's job to start", lambda: (slurm_job(other) or {}).get("job_state") in
                 ("RUNNING", "COMPLETED", None), timeout=180)
        wait_for("training back at world size 4", lambda: 4 in after_first(world_sizes(job["job_dir"]), 8),
                 timeout=120)
        tasks = worker_tasks(job["worker_array_id"])
        assert [t.get("restart_cnt") for t in tasks] == [1], ("told to leave once, requeued once", tasks)
        final = wait_for("the elastic job to complete",
                         lambda: (s := user.status(job["id"]))["state"] in ("COMPLETED", "FAILED") and s, timeout=300)
        assert final["state"] == "COMPLETED", job_output(job["job_dir"])[-3000:]
        kinds = [k for k, _ in decisions(PAIR_DB, job["slurm_job_id"])]
        assert kinds.count("shrink") == 1, ("the shrink decided once, by login2's agent", kinds)
        assert in_flight(PAIR_DB) == [], "nothing left in flight"
        steps = [e["step"] for e in progress_events(job["job_dir"], "restore")]
        assert steps == sorted(steps) and all(s > 0 for s in steps), "every re-formed group resumed, never from 0"
        login2_back_and_refused(user, old, taken)
    finally:
        for leftover in (blocker, other):
            if leftover:
                subprocess.run(["scancel", str(leftover)], check=False)
