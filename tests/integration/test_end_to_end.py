"""Integration (live Slurm testbed + rootless Podman + real PyTorch):
submit -> runs in a container -> progress in `dlsub status` -> SIGUSR1 mid-run
-> checkpoint -> requeue -> resumes at the saved step -> completes."""

from __future__ import annotations

import re
from pathlib import Path

from livebed import EXAMPLES, TestbedUser, wait_for

EPOCHS = 4


def test_submit_progress_usr1_requeue_resume_complete(user: TestbedUser, workdir: Path) -> None:
    # 4 epochs (88 steps, about 0.2 s each here): the requeue comes at step 10, and the second attempt's 78 steps
    # show the resume as well as 8 epochs did, in half the time (this test runs in CI three times).
    job = user.submit(str(EXAMPLES / "train_digits.py"), "--epochs", str(EPOCHS), "--throttle", "0.1",
                      "--report-every", "2", cwd=workdir)
    assert job["partition"] == "cpu" and isinstance(job["slurm_job_id"], int)

    running = wait_for(
        "progress while RUNNING",
        lambda: (s := user.status(job["id"])) and s["state"] == "RUNNING" and (s["step"] or 0) >= 10 and s,
        timeout=180,
    )
    assert running["slurm_job_id"] == job["slurm_job_id"] and running["nodes"].startswith("cpu")
    assert running["loss"] is not None and running["attempts"] == 1

    # The container really runs the script (rootless Podman, labelled with the Slurm job).
    assert user.containers(f"dlsub.slurm_job_id={job['slurm_job_id']}")

    # SIGUSR1 to the batch shell, as Slurm sends before a time limit.
    user.dlsub("requeue", job["id"])
    second = wait_for(
        "the second attempt running",
        lambda: (s := user.status(job["id"])) and s["attempts"] == 2 and s["state"] == "RUNNING" and s,
        timeout=180,
    )
    assert second["slurm_job_id"] == job["slurm_job_id"]

    done = wait_for(
        "completion",
        lambda: (s := user.status(job["id"])) and s["state"] in ("COMPLETED", "FAILED") and s,
        timeout=300,
    )
    log = user.dlsub("logs", job["id"]).stdout
    assert done["state"] == "COMPLETED", log

    saved = re.search(r"checkpointed at step (\d+)", log)
    resumed = re.search(r"resumed from step (\d+)", log)
    assert saved and resumed, log
    assert int(resumed.group(1)) == int(saved.group(1)) > 0, "resumed at the saved step, not at step 0"
    assert "starting from scratch" in log and log.count("starting from scratch") == 1
    assert done["step"] == EPOCHS * (1437 // 64) and done["attempts"] == 2 and done["eta_s"] == 0
    assert "done:" in log


def test_logs_follow_ends_with_the_job(user: TestbedUser, workdir: Path) -> None:
    job = user.submit(str(EXAMPLES / "train_digits.py"), "--epochs", "1", cwd=workdir)
    follow = user.run("dlsub", "logs", "-f", job["id"], cwd=workdir, timeout=300)
    assert follow.returncode == 0
    assert "done:" in follow.stdout and "COMPLETED" in follow.stderr
