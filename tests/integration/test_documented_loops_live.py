"""Integration tests (live testbed: real Slurm, rootless Podman, the agent service): the training loops the
README and the user guide print, read from the documents at test time, run as a new user would submit them.

Each starts on cpu in immediate mode with every GPU held, is moved onto a GPU once they free (before it has
ever checkpointed: its ``should_stop()`` calls are what says it saves when asked), resumes there past step 0
and completes. The one thing put into the printed text is the training step the documents leave to the
reader: a ``train_step()`` of 0.3 s on cpu (0.01 s after the move, so the test need not wait out 1,000 steps),
called where the README prints ``...``. About two minutes for both, side by side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from livebed import REPO, TestbedUser, attempts, jobs_made_since, progress_events, put, slurm_jobs, wait_for

#: (document, the heading the loop follows, "" for the first loop of the page)
LOOPS = {"README": ("README.md", ""), "guide": ("docs/user-guide.md", "## Writing the training script")}

TRAIN_STEP = '''import os
import time


def train_step():
    time.sleep(0.3 if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" else 0.01)
    return 0.5


'''


def printed_loop(name: str) -> str:
    """The loop as the document prints it (its first ``python`` block after the heading that sets up a run),
    with the reader's training step (a line ``...``) as ``train_step()``."""
    doc, heading = LOOPS[name]
    text = (REPO / doc).read_text()
    if heading:
        text = text.split(heading, 1)[1]
    loop = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "checkpointing.init(" in b)
    return re.sub(r"^([ \t]+)\.\.\.", r"\1train_step()", loop, flags=re.M)


def test_the_printed_loops_move_from_cpu_to_a_gpu_and_complete_there_past_step_0(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None
) -> None:
    """Both printed loops side by side (one wait for the GPUs, not two)."""
    jobs = {}
    for name in LOOPS:
        script = put(user, workdir / f"{name.lower()}_loop.py", TRAIN_STEP + printed_loop(name))
        jobs[name] = user.submit("--mode", "immediate", "--gpus", "1", str(script), cwd=workdir)
        assert jobs[name]["partition"] == "cpu" and jobs[name]["ideal_partition"] == "gpu", jobs[name]
    # The move needs no checkpoint, only the loop's first should_stop() and about 30 s of steps on cpu
    # (etc/testbed/policy.toml: cpu at a quarter of a GPU's speed, a restart costing 15 s).
    for job in jobs.values():
        wait_for("the loop to poll should_stop() on cpu", lambda j=job: progress_events(j["job_dir"], "polls"),
                 timeout=90)
        wait_for("30 s of steps on cpu", lambda j=job: (user.status(j["id"])["step"] or 0) >= 100, timeout=90)
        assert not progress_events(job["job_dir"], "checkpoint"), "no checkpoint before the move"
    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    for name, job in jobs.items():
        final = user.wait_until_ended(job["id"], f"the moved {name} loop to complete", timeout=240)
        assert final["state"] == "COMPLETED" and final["partition"] == "gpu" and final["attempts"] == 2, final
        runs = attempts(job["job_dir"])
        assert [a["partition"] for a in runs if a["event"] == "start"] == ["cpu", "gpu"], runs
        assert [a.get("action") for a in runs if a["event"] == "end"][0] == "move", runs
        saved = [e["step"] for e in progress_events(job["job_dir"], "checkpoint")]
        restored = [e["step"] for e in progress_events(job["job_dir"], "restore")]
        assert len(saved) == 1 and saved[0] >= 100 and restored == saved, (name, saved, restored)
        why = user.dlsub("why", job["id"]).stdout
        assert re.search(r"moving to gpu: \d+ GPU\(s\) idle, est\. .* saved", why), why
        assert progress_events(job["job_dir"])[-1]["event"] == "finished"


def test_a_script_in_the_login_hosts_tmp_is_refused_before_slurm_sees_it(user: TestbedUser) -> None:
    """The login host's /tmp is its own (testbed/hosts.sh): a job from there would fail on its node ("couldn't
    change working dir"). Submit refuses it, exit 2, naming the path, and no Slurm job is made."""
    folder = Path(tempfile.mkdtemp(prefix="dlsub-it-tmp-", dir="/tmp"))
    try:
        os.chown(folder, user.uid, user.gid)
        script = put(user, folder / "train.py", "print('never runs')\n")
        os.chown(script, user.uid, user.gid)
        before = {j["job_id"] for j in slurm_jobs()}
        refused = user.dlsub("--mode", "immediate", "--gpus", "1", str(script), cwd=folder, check=False)
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert f"the script ({str(script)!r}) is in /tmp" in refused.stderr, refused.stderr
        assert "node-local" in refused.stderr and "shared" in refused.stderr, refused.stderr
        assert not jobs_made_since(before), "no Slurm job was made"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
