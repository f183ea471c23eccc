"""Integration (live Slurm testbed + rootless Podman): cancel leaves no
container; a --gpus 2 job lands on a GPU node and its container sees two
devices in CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from livebed import EXAMPLES, HOSTS_DIR, TestbedUser, listpids, processes_of_job, put, slurm_job, wait_for

PROBE = """
import json, os, sys
from dlsub import checkpointing
run = checkpointing.init()
if int(os.environ.get("RANK", "0")) == 0:
    out = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "in_container": os.path.exists("/run/.containerenv"),
        "world_size": int(os.environ.get("WORLD_SIZE", "0")),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "argv": sys.argv[1:],
    }
    with open(os.path.join(os.environ["DLSUB_JOB_DIR"], "probe.json"), "w") as f:
        json.dump(out, f)
run.finish()
"""


def test_cancel_removes_slurm_job_and_container(user: TestbedUser, workdir: Path) -> None:
    job = user.submit(str(EXAMPLES / "train_digits.py"), "--epochs", "50", "--throttle", "0.2", cwd=workdir)
    label = f"dlsub.slurm_job_id={job['slurm_job_id']}"
    wait_for("the job's container", lambda: user.containers(label), timeout=120)
    assert processes_of_job(job["slurm_job_id"]), "the job's processes are in its cgroups"
    user.dlsub("cancel", job["id"])
    wait_for(
        "Slurm to end the job",
        lambda: (s := user.status(job["id"])) and s["state"] == "CANCELLED",
        timeout=90,
    )
    wait_for("no container left", lambda: not user.containers(label), timeout=90)
    # Slurm keeps a cancelled job COMPLETING until its node reports the step's end (seconds on 24.11).
    wait_for("the Slurm job gone from the queue", lambda: subprocess.run(
        ["squeue", "-h", "-j", str(job["slurm_job_id"]), "-t", "PD,R,CG"], capture_output=True, text=True,
    ).stdout.strip() == "", timeout=60)
    assert user.containers(label) == []
    assert processes_of_job(job["slurm_job_id"]) == [], "no process of the job is left on its node"


def test_two_gpus_land_on_a_gpu_node_and_are_visible_in_the_container(user: TestbedUser, workdir: Path) -> None:
    probe = put(user, workdir / "probe.py", PROBE)
    job = user.submit("--gpus", "2", str(probe), cwd=workdir)
    assert job["partition"] in ("gpu", "gpu-dev")
    done = wait_for(
        "the probe to finish",
        lambda: (s := user.status(job["id"])) and s["state"] in ("COMPLETED", "FAILED") and s,
        timeout=180,
    )
    assert done["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    assert done["nodes"].startswith("gpu")
    seen = json.loads((Path(job["job_dir"]) / "probe.json").read_text())
    assert seen["in_container"] is True
    assert len(seen["cuda_visible_devices"].split(",")) == 2
    assert seen["world_size"] == 2, "torchrun starts one process per GPU"
    assert seen["slurm_job_id"] == str(job["slurm_job_id"])


def test_nasty_path_and_arguments_run_intact(user: TestbedUser, workdir: Path) -> None:
    weird = workdir / "my dir; it's \"odd\""
    probe = put(user, weird / "pro be;'x'.py", PROBE)
    args = ["a b", "it's", 'say "hi"', "x; touch /tmp/dlsub-it-pwned", "$(id)", "`id`", "*"]
    job = user.submit(str(probe), *args, cwd=weird)
    done = wait_for(
        "the probe to finish",
        lambda: (s := user.status(job["id"])) and s["state"] in ("COMPLETED", "FAILED") and s,
        timeout=180,
    )
    assert done["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    seen = json.loads((Path(job["job_dir"]) / "probe.json").read_text())
    assert seen["argv"] == args
    # Nowhere: not on the login host, not on the node that ran it (each host has its own /tmp).
    assert not [p for p in (Path("/tmp"), *HOSTS_DIR.glob("*/tmp")) if (p / "dlsub-it-pwned").exists()]


def test_bad_input_live_submits_nothing(user: TestbedUser, workdir: Path) -> None:
    script = put(user, workdir / "t.py", "print(1)\n")
    before = subprocess.run(["squeue", "-h", "-u", user.name, "-o", "%i"],
                            capture_output=True, text=True).stdout.split()
    cases = [
        (["--image", "localhost/no-such-image:1"], "not in your Podman storage"),
        (["--gpus", "9"], "the most one node offers is 4"),
        (["--time", "soon"], "is not a time limit"),
        (["--partition", "nope"], "unknown partition 'nope'"),
    ]
    for options, message in cases:
        result = user.dlsub(*options, str(script), cwd=workdir, check=False)
        assert result.returncode == 2 and message in result.stderr, (options, result.stderr)
    script.chmod(0)
    result = user.dlsub(str(script), cwd=workdir, check=False)
    assert result.returncode == 2 and "not readable" in result.stderr
    after = subprocess.run(["squeue", "-h", "-u", user.name, "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert sorted(after) == sorted(before), "nothing was submitted"


def test_taskepilog_removes_container_when_batch_shell_is_killed(user: TestbedUser, workdir: Path) -> None:
    """SIGKILL leaves the batch script's traps no chance (as after KillWait);
    Podman's conmon lives outside the job's process tree, so without the
    TaskEpilog the container would run on."""
    job = user.submit(str(EXAMPLES / "train_digits.py"), "--epochs", "50", "--throttle", "0.2", cwd=workdir)
    slurm_id = str(job["slurm_job_id"])
    label = f"dlsub.slurm_job_id={slurm_id}"
    wait_for("the job's container", lambda: user.containers(label), timeout=120)
    pids = listpids(int(slurm_id), (slurm_job(int(slurm_id)) or {}).get("nodes", ""))
    batch_pids = [line.split()[0] for line in pids.splitlines()[1:] if line.split()[2:3] == ["batch"]]
    assert batch_pids, pids
    subprocess.run(["kill", "-9", *batch_pids], check=False)
    wait_for("the TaskEpilog to remove the container", lambda: not user.containers(label), timeout=90)
    wait_for("no process of the job left on its node", lambda: processes_of_job(int(slurm_id)) == [], timeout=60)
