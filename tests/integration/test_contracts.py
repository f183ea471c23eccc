"""Integration (live Slurm testbed + rootless Podman, as the testbed user):
the job-side contracts of issue 8, written as a user types them.

- `dlsub cancel` of a plain script that ignores the library: its container is
  gone within 10 s (the launcher no longer holds SIGTERM for a grace nothing uses).
- A script using only init(), save(state), restore(), should_stop() and
  exit_for_resume() resumes at its checkpoint after `dlsub requeue`; its
  checkpoint events carry integer steps.
- The user guide's training snippet (docs/user-guide.md), run as written.
- `dlsub SCRIPT --dry-run --json` hands both flags to the script; #DLSUB lines.
- The job directory is private: 0700 with an ACL for the agent, progress and
  attempt files readable by the agent's account, the output file owner-only.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import time
from pathlib import Path

from livebed import AGENT_USER, REPO, TestbedUser, progress_events, put, wait_for

PLAIN = """
import time
print("plain script, no dlsub library", flush=True)
time.sleep(300)
"""

# Only the documented calls, with their defaults.
RESUMABLE = """
import time
from dlsub import checkpointing

run = checkpointing.init()
state = run.restore() or {"step": 0}
print("resumed at", state["step"], flush=True)
for step in range(state["step"], 100000):
    time.sleep(0.05)
    if run.should_stop():
        run.save({"step": step + 1})
        run.exit_for_resume()
"""

ARGV = """
import json, os, sys
with open(os.path.join(os.environ["DLSUB_JOB_DIR"], "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def _readme_snippet() -> str:
    """The user guide's training snippet, with the two names it leaves to the reader defined."""
    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text[text.index("## Writing the training script"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "docs/user-guide.md has a python snippet under 'Writing the training script'"
    prelude = ("import time\nseen = 0\ndef train_step():\n    global seen\n    seen += 32\n"
               "    time.sleep(0.05)\n    return 1.0 / (1 + seen)\n")
    return prelude + code.group(1).replace("...", '"note": "snippet"')


def _output(job: dict) -> str:
    path = Path(job["job_dir"]) / f"slurm-{job['slurm_job_id']}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _events(job: dict, kind: str) -> list[dict]:
    return progress_events(job["job_dir"], kind)


def test_cancel_of_a_script_that_ignores_the_library_is_gone_within_10_s(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "plain.py", PLAIN)
    job = user.submit(str(script), cwd=workdir)
    label = f"dlsub.job_id={job['id']}"
    wait_for("the script to run", lambda: "plain script" in _output(job), timeout=120)
    started = time.monotonic()
    user.dlsub("cancel", job["id"])
    wait_for("no container left", lambda: not user.containers(label), timeout=60, interval=0.2)
    took = time.monotonic() - started
    assert took < 10, f"container still there {took:.1f} s after dlsub cancel"
    assert "no training process handles it" in _output(job)


def test_documented_calls_resume_at_the_checkpoint_after_requeue(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "resumable.py", RESUMABLE)
    job = user.submit(str(script), cwd=workdir)
    wait_for("the first attempt", lambda: "resumed at 0" in _output(job), timeout=120)
    time.sleep(2)
    user.dlsub("requeue", job["id"])
    resumed = wait_for("the second attempt to restore",
                       lambda: re.search(r"resumed at ([1-9]\d*)", _output(job)), timeout=180)
    (checkpoint,) = _events(job, "checkpoint")
    assert isinstance(checkpoint["step"], int) and isinstance(checkpoint["seq"], int)
    (restore,) = _events(job, "restore")
    assert restore["path"] == checkpoint["path"]
    assert int(resumed.group(1)) > 0
    counter = Path(job["job_dir"]) / "attempts" / "requeues"
    assert counter.read_text().strip() == "1", "one resume-requeue counted"
    user.dlsub("cancel", job["id"])


def test_the_readme_snippet_runs_as_written(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "snippet.py", _readme_snippet())
    job = user.submit(str(script), cwd=workdir)
    wait_for("the snippet to report progress", lambda: _events(job, "progress"), timeout=120)
    user.dlsub("requeue", job["id"])
    wait_for("the snippet to resume from its checkpoint", lambda: _events(job, "restore"), timeout=180)
    (checkpoint, *_) = _events(job, "checkpoint")
    assert isinstance(checkpoint["step"], int)
    user.dlsub("cancel", job["id"])


def test_flags_after_the_script_are_the_scripts(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "argv.py", "#DLSUB --cpus 1\n" + ARGV)
    out = user.dlsub(str(script), "--dry-run", "--json", "--", "x", cwd=workdir).stdout
    job_id = re.search(r"submitted job ([0-9a-f]{8})", out)
    assert job_id, out
    job = user.status(job_id.group(1))
    wait_for("the script to finish", lambda: user.status(job["id"])["state"] == "COMPLETED", timeout=180)
    argv = json.loads((Path(job["job_dir"]) / "argv.json").read_text())
    assert argv == ["--dry-run", "--json", "--", "x"]


def test_job_directory_is_private_and_the_agent_reads_only_its_two_files(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "argv.py", ARGV)
    job = user.submit(str(script), cwd=workdir)
    wait_for("the job to finish", lambda: user.status(job["id"])["state"] == "COMPLETED", timeout=180)
    job_dir = Path(job["job_dir"])
    assert stat.S_IMODE(job_dir.stat().st_mode) & 0o007 == 0, "others get nothing"
    output = job_dir / f"slurm-{job['slurm_job_id']}.out"
    assert stat.S_IMODE(output.stat().st_mode) & 0o077 == 0, "Slurm's output file is owner-only"

    def as_agent(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", AGENT_USER, "--", *argv], capture_output=True, text=True, check=False)

    assert as_agent("cat", str(job_dir / "progress.jsonl")).returncode == 0
    assert as_agent("cat", str(job_dir / "attempts.jsonl")).returncode == 0
    assert as_agent("ls", str(job_dir)).returncode != 0, "the agent cannot list the job directory"
    assert as_agent("cat", str(output)).returncode != 0
    assert as_agent("cat", str(job_dir / "job.sbatch")).returncode != 0
    other = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(job_dir / "progress.jsonl")],
                           capture_output=True, text=True, check=False)
    assert other.returncode != 0, "another user cannot read the progress file"


# The documented calls only, checkpointing every 20 steps: no total declared, no step given to save().
PERIODIC = """
import time
from dlsub import checkpointing

run = checkpointing.init()
state = run.restore() or {"step": 0}
print("resumed at", state["step"], flush=True)
for step in range(state["step"], 100000):
    time.sleep(0.05)
    if step % 20 == 19:
        run.save({"step": step + 1})
    if run.should_stop():
        run.save({"step": step + 1})
        run.exit_for_resume()
"""


def test_documented_calls_only_are_moved_from_cpu_to_gpu_and_resume(
    user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None
) -> None:
    """No total_steps, no step= in save(): the agent still moves the job onto the GPUs it asked for."""
    script = put(user, workdir / "periodic.py", PERIODIC)
    job = user.submit("--mode", "immediate", "--gpus", "1", str(script), cwd=workdir)
    assert job["partition"] == "cpu"
    try:
        wait_for("a checkpoint on cpu", lambda: _events(job, "checkpoint"), timeout=120)
        subprocess.run(["scancel", *map(str, gpus_busy)], check=True)

        def on_gpu() -> bool:
            status = user.status(job["id"])
            return status["state"] == "RUNNING" and status["partition"] == "gpu"

        wait_for("the agent to move it to gpu", on_gpu, timeout=180, interval=2)
        resumed = wait_for("the attempt on gpu to restore",
                           lambda: re.search(r"resumed at ([1-9]\d*)", _output(job)), timeout=120)
        # Restored from a checkpoint no older than the periodic one seen on cpu (step 20) before the GPUs freed:
        # the regex alone already rules out a fresh start at 0.
        assert int(resumed.group(1)) >= 20, resumed.group(0)
        steps = [e["step"] for e in _events(job, "checkpoint")]
        assert steps and all(isinstance(s, int) for s in steps), steps
        why = user.dlsub("why", job["id"]).stdout
        assert "no total declared" in why and "moving to gpu" in why, why
    finally:
        user.dlsub("cancel", job["id"], check=False)
