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

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_elastic import after_first, world_sizes
from test_move_crashes import decisions
from test_resize_crashes import in_flight, worker_tasks

from livebed import (
    AGENT_USER,
    EXAMPLES,
    POLICY_FILE,
    TestbedUser,
    agent_moves,
    agent_service,
    attempts,
    blockers,
    job_output,
    progress_events,
    set_link,
    slurm_job,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")
CPU_FOUR_TIMES_SLOWER = ("--throttle", "0.05", "--cpu-slowdown", "4")
#: The pair's one database: a folder on the machine's disk, which both login hosts see.
PAIR_DIR = Path("/var/lib/dlsub-pair")
PAIR_DB = PAIR_DIR / "agent.db"
#: Where testbed/agent.sh keeps login2's agent's pid (its /run/dlsub, as the machine sees it) and log.
LOGIN2_PIDFILE = Path("/var/lib/dlsub-testbed/hosts/login2/run-dlsub/agent.pid")
LOGIN2_LOG = Path("/var/log/dlsub/agent-login2.log")
LEASE_S = 15
TAKEOVER_LIMIT_S = 30


def lease() -> dict[str, object] | None:
    """The pair's lease as the database holds it (holder host, token, expiry)."""
    try:
        conn = sqlite3.connect(f"file:{PAIR_DB}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("select host, token, expires from lease where id = 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return {"host": row[0], "token": row[1], "expires": row[2]} if row else None


def holds_a_record_lock(pid: int) -> bool:
    """Whether ``pid`` holds a POSIX record lock (/proc/locks): SQLite's, inside a transaction."""
    return any(fields[1] == "POSIX" and fields[4] == str(pid)
               for fields in (line.split() for line in Path("/proc/locks").read_text().splitlines())
               if len(fields) > 4)


def freeze_outside_a_transaction(pid: int) -> None:
    """SIGSTOP ``pid`` between two of its transactions on the database. A frozen process keeps the locks it holds,
    and on this machine's filesystem nothing breaks them (a host lost for good would lose them with its NFS
    lease): frozen inside a transaction, it would stall the other agent as no lost host does."""
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        if not holds_a_record_lock(pid):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"the agent (pid {pid}) held a lock on its database at each of 100 tries")


@pytest.fixture
def agent_pair() -> Iterator[None]:
    """login1's service agent stopped; the pair started on a fresh shared database under ``[failover]``: login2's
    agent first (it takes the lease), then login1's. Afterwards both stopped, login2's link up and its agent
    running (SIGCONT) whatever the test did, the policy restored and login1's service agent started again."""
    original = POLICY_FILE.read_text()
    assert "[failover]" not in original, f"{POLICY_FILE} already has a [failover] table: is another run using it?"
    agent_service("stop")
    subprocess.run(["install", "-d", "-m", "700", "-o", AGENT_USER, "-g", AGENT_USER, str(PAIR_DIR)], check=True)
    for suffix in ("", "-journal", "-wal", "-shm"):
        Path(f"{PAIR_DB}{suffix}").unlink(missing_ok=True)
    LOGIN2_LOG.unlink(missing_ok=True)
    POLICY_FILE.write_text(f"{original}\n[failover]\nshared_state = true\nlease_s = {LEASE_S}\n")
    try:
        agent_service("start", "login2", PAIR_DB)
        wait_for("login2's agent to take the lease", lambda: (lease() or {}).get("host") == "login2", timeout=30)
        agent_service("start", "login1", PAIR_DB)
        yield
    finally:
        set_link("login2", up=True)
        if LOGIN2_PIDFILE.exists():
            try:
                os.kill(int(LOGIN2_PIDFILE.read_text()), signal.SIGCONT)
            except (ProcessLookupError, ValueError):
                pass
        agent_service("stop", "login2")
        agent_service("stop", "login1")
        POLICY_FILE.write_text(original)
        agent_service("start")


def lose_login2() -> tuple[int, dict[str, object]]:
    """login2 lost with its agent active: the agent frozen where it is, the link cut; login1's agent takes the
    lease over within TAKEOVER_LIMIT_S with the next token. Returns the frozen agent's pid and the new lease."""
    first = lease()
    assert first and first["host"] == "login2", first
    old = int(LOGIN2_PIDFILE.read_text())
    freeze_outside_a_transaction(old)
    set_link("login2", up=False)
    lost = time.monotonic()
    taken = wait_for("login1's agent to take the lease over",
                     lambda: (r := lease()) and r["host"] == "login1" and r, timeout=TAKEOVER_LIMIT_S + 15,
                     interval=0.5)
    took = time.monotonic() - lost
    print(f"login1's agent took over {took:.1f} s after login2 was lost (lease {LEASE_S} s)")
    assert took <= TAKEOVER_LIMIT_S, f"took over after {took:.1f} s"
    assert taken["token"] == first["token"] + 1, (first, taken)  # type: ignore[operator]
    return old, taken


def login2_back_and_refused(user: TestbedUser, old: int, taken: dict[str, object]) -> None:
    """login2 back, its agent woken: what it writes next is refused by the token, it stands by, and the lease
    stays with login1's agent, which `dlsub agent status` names."""
    set_link("login2", up=True)
    os.kill(old, signal.SIGCONT)
    refused = wait_for("login2's woken agent to be refused and stand by",
                       lambda: [line for line in LOGIN2_LOG.read_text().splitlines() if "standing by" in line],
                       timeout=60)
    assert any("deposed" in line or "lease" in line for line in refused), refused
    still = lease()
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
    first = lease()
    assert first and first["host"] == "login2", first
    status = user.dlsub("agent", "status").stdout
    assert "answered by: login1, standby" in status and "lease: held by login2" in status, status
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    wait_for("login2's agent to start the move", lambda: (job["id"], "signalled") in agent_moves(PAIR_DB), timeout=60,
             interval=0.1)
    old, taken = lose_login2()
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
        # As test_elastic's grow-and-shrink: 13 epochs leave room for the grow, the shrink and a grow back.
        job = user.submit("--nodes", "1:2", "--gpus-per-node", "4", TRAIN, "--epochs", "13", "--throttle", "0.1",
                          cwd=workdir)
        wait_for("training at world size 4", lambda: world_sizes(job["job_dir"])[-1:] == [4]
                 and progress_events(job["job_dir"], "checkpoint"), timeout=180)
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
        old, taken = lose_login2()
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
