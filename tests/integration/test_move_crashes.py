"""Integration tests (live testbed: real Slurm, rootless Podman, PyTorch): kill -9 of the agent at each step of a move.

The agent is ticked by hand as its service account. With
``DLSUB_FAILPOINT=<point>`` the tick SIGKILLs itself the moment it passes
that point of a move (dlsub.agent.failpoints); later ticks run without it,
as a restarted agent would. From every point the move must finish: one
Slurm job, attempts on cpu then gpu, the job resumed at its checkpoint,
exactly one move decision.

Which points run live is POINTS below: the two where Slurm has changed and the agent's record has not yet
(the job signalled, which checkpoints and requeues itself held while the agent is dead; the job retargeted
to the GPU partition, not yet released). A crash before and after each of a move's Slurm commands runs against
the stateful fake Slurm in tests/unit/test_agent_tick.py (test_a_crash_after_each_move_phase_finishes_the_move_once);
each live point costs a minute or more of CI, as in test_resize_crashes.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from dlsub.contract import gpus_in_tres
from livebed import AGENT_USER, EXAMPLES, TestbedUser, attempts, slurm_job, wait_for

TRAIN = str(EXAMPLES / "train_digits.py")
POINTS = ("move-signalled", "move-updated")


def tick(db: Path, failpoint: str | None = None) -> int:
    env = ["env", f"DLSUB_FAILPOINT={failpoint}"] if failpoint else []
    result = subprocess.run(["runuser", "-u", AGENT_USER, "--", *env, "dlsub", "agent", "tick", "--db", str(db),
                             "--json"], capture_output=True, text=True, timeout=120)
    if result.returncode not in (0, 137, -9):
        raise AssertionError(f"tick failed ({result.returncode}): {result.stdout}\n{result.stderr}")
    return result.returncode


def decisions(db: Path, slurm_job_id: int) -> list[tuple[str, str]]:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("select kind, reason from decisions where slurm_job_id = ? order by time, id",
                            (slurm_job_id,)).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("point", POINTS)
def test_agent_killed_at_each_step_of_a_move_finishes_it_once(
    point: str, user: TestbedUser, workdir: Path, gpus_busy: list[int], manual_agent: Path
) -> None:
    job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "30", "--throttle", "0.2",
                      cwd=workdir)
    assert job["partition"] == "cpu"
    slurm_id = job["slurm_job_id"]
    try:
        step = wait_for("a checkpoint on cpu",
                        lambda: (s := user.status(job["id"]))["state"] == "RUNNING" and s["last_checkpoint_step"],
                        timeout=120)
        subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
        wait_for("the GPUs to be idle", lambda: all(slurm_job(b) is None or slurm_job(b).get("job_state") != "RUNNING"  # type: ignore[union-attr]
                                                    for b in gpus_busy), timeout=60)
        wait_for(f"the agent to die at {point}", lambda: tick(manual_agent, point) in (137, -9), timeout=150,
                 interval=2)
        if point == "move-signalled":
            # The agent stays dead while the job checkpoints and requeues itself held.
            wait_for("the job to checkpoint and wait held",
                     lambda: (slurm_job(slurm_id) or {}).get("state_reason") == "JobHeldUser", timeout=90)

        def on_gpu() -> bool:
            tick(manual_agent)
            record = slurm_job(slurm_id) or {}
            return record.get("job_state") == "RUNNING" and record.get("partition") == "gpu"

        wait_for("the move to finish after the restart", on_gpu, timeout=150, interval=2)
        wait_for("the move recorded as done",
                 lambda: tick(manual_agent) == 0
                 and any(k == "move-done" for k, _ in decisions(manual_agent, slurm_id)),
                 timeout=60, interval=2)
        record = slurm_job(slurm_id) or {}
        assert record.get("restart_cnt") == 1 and gpus_in_tres(record.get("tres_per_node")) == 1, record
        kinds = [k for k, _ in decisions(manual_agent, slurm_id)]
        assert kinds.count("move") == 1, kinds
        starts = [(a["slurm_job_id"], a["partition"]) for a in attempts(job["job_dir"]) if a["event"] == "start"]
        assert starts == [(slurm_id, "cpu"), (slurm_id, "gpu")], starts
        text = (Path(job["job_dir"]) / f"slurm-{slurm_id}.out").read_text()
        wait_for("the resumed attempt to report",
                 lambda: re.search(r"resumed from step (\d+)",
                                   (Path(job["job_dir"]) / f"slurm-{slurm_id}.out").read_text()), timeout=60)
        text = (Path(job["job_dir"]) / f"slurm-{slurm_id}.out").read_text()
        resumed = re.search(r"resumed from step (\d+)", text)
        assert resumed and int(resumed.group(1)) >= int(step), text
    finally:
        subprocess.run(["scancel", str(slurm_id)], check=False)
