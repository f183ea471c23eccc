"""Integration (live Slurm testbed with its cgroup plugins + rootless Podman + CDI): the container stays in
the job's cgroup, and Slurm's limits apply to it: its device cgroup allows the GPUs Slurm gave the job and
no others, a job past its ``--mem`` is stopped and told so, and a job stopped by Slurm (out of memory, at
its time limit) leaves no process on its node (``processes_of_job``: every process in one of its cgroups).
A job whose every process Slurm killed -9 at once (as it aborts one registered on the wrong node: a node back
after its jobs were requeued) leaves the user's Podman there recorded with a container whose processes are
gone; the user's next job on that node resets it and runs (slurm_plugins/launcher/podman_state.py).

The testbed runs ``proctrack/cgroup`` and ``task/cgroup`` with ``ConstrainDevices`` and
``ConstrainRAMSpace`` (etc/testbed/cgroup.conf, cgroup v1 here); its fake GPUs are devices of NVIDIA's
major with a minor each, in each GPU node's own /dev, and each GPU node has a CDI spec naming them as
``nvidia-ctk cdi generate`` does (testbed/hosts.sh): the container gets exactly the job's GPUs' device files.
Other cases (no spec, no device constraint, a step's GPUs) are unit-tested (tests/unit/test_sbatch.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from livebed import (
    EXAMPLES,
    HOSTS_DIR,
    TestbedUser,
    job_output,
    processes_of_job,
    progress_events,
    put,
    slurm_job,
    wait_for,
)

#: The fake GPUs' major (testbed/up.sh): NVIDIA's, which has no driver on this machine.
NVIDIA_MAJOR = 195

PROBE = """
import errno, glob, json, os, sys
from dlsub import checkpointing
run = checkpointing.init()

def opened(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "opened"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

out = {
    "cgroups": dict(line.strip().split(":", 2)[1:] for line in open("/proc/self/cgroup")),
    "opened": {os.path.basename(p): opened(p) for p in sys.argv[1:]},
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "slurm_job_gpus": os.environ.get("SLURM_JOB_GPUS"),
    "gpu_files": {p: opened(p) for p in sorted(glob.glob("/dev/nvidia*"))},
}
with open(os.path.join(os.environ["DLSUB_JOB_DIR"], "probe.json"), "w") as f:
    json.dump(out, f)
run.finish()
"""

HOG = """
import os
from dlsub import checkpointing
run = checkpointing.init()
run.report(step=1, loss=1.0)
chunks = []
for _ in range(64):  # up to 4 GiB, 64 MiB at a time, each page touched
    chunks.append(bytearray(64 << 20))
    chunks[-1][::4096] = b"x" * len(chunks[-1][::4096])
run.finish()
"""

#: Training that never checkpoints nor stops when told (its stop signals ignored): only Slurm's own kill at
#: the time limit (SIGTERM, KillWait, SIGKILL over the job's cgroup) ends it.
STUBBORN = """
import signal, time
from dlsub import checkpointing
run = checkpointing.init()
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
run.report(step=1, loss=1.0)
while True:
    time.sleep(1)
"""

SHORT = """
from dlsub import checkpointing
run = checkpointing.init()
run.report(step=1, loss=1.0)
run.finish()
"""


@pytest.fixture
def two_gpus_held_on_gpu1(user2: TestbedUser) -> Iterator[int]:
    """Another user's job holding GPUs 0-1 of gpu1, and one holding all of gpu2: a 2-GPU job goes to gpu1's
    GPUs 2,3 (Slurm's global ids), which its container must see as 0,1."""
    ids = []
    for node, gpus in (("gpu1", 2), ("gpu2", 4)):
        out = user2.run("sbatch", "--parsable", "-p", "gpu", "-w", node, f"--gres=gpu:{gpus}", "--mem=100",
                        "--cpus-per-task=1", "--time=10", "-J", "holder", "--wrap", "sleep 600", check=True)
        ids.append(int(out.stdout.strip().split(";")[0]))
    wait_for("the holders to run", lambda: all((slurm_job(i) or {}).get("job_state") == "RUNNING" for i in ids),
             timeout=60)
    yield ids[0]
    subprocess.run(["scancel", *map(str, ids)], check=False)


def test_the_container_is_in_the_jobs_cgroup_whose_devices_are_exactly_its_gpus(
        user: TestbedUser, workdir: Path, two_gpus_held_on_gpu1: int) -> None:
    probe = put(user, workdir / "probe.py", PROBE)
    # The container sees the workdir: device files there stand for gpu1's GPU 2 (this job's, minor 2) and
    # GPU 0 (the holder's, minor 0), as a process would reach them if they were in its container.
    for name, minor in (("own-gpu", 2), ("holders-gpu", 0)):
        os.mknod(workdir / name, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    job = user.submit("--gpus", "2", "-p", "gpu", "--mem", "2G", str(probe), str(workdir / "own-gpu"),
                      str(workdir / "holders-gpu"), cwd=workdir)
    done = user.wait_until_ended(job["id"], "the probe to finish", timeout=180)
    assert done["state"] == "COMPLETED", user.dlsub("logs", job["id"]).stdout
    assert done["nodes"] == "gpu1"
    seen = json.loads((Path(job["job_dir"]) / "probe.json").read_text())
    # Slurm's global ids, and under ConstrainDevices the job's own numbering 0..n-1; no CDI: no device files.
    assert seen["slurm_job_gpus"] == "2,3", seen
    assert seen["cuda_visible_devices"] == "0,1", seen
    # Through the node's CDI spec (nvidia.com/gpu=<Slurm's global id>): exactly its two GPUs' device files,
    # which its device cgroup lets it open as far as a GPU opens without a driver (ENXIO).
    assert seen["gpu_files"] == {"/dev/nvidia2": "ENXIO", "/dev/nvidia3": "ENXIO"}, seen
    # Every controller Slurm tracks the job with holds the container's process: its limits apply to it.
    slurm_id = job["slurm_job_id"]
    for controller in ("memory", "devices", "cpuset", "freezer"):
        assert f"/slurm_gpu1/uid_{user.uid}/job_{slurm_id}/" in seen["cgroups"][controller], (controller, seen)
    # So the job's device cgroup holds the container: its own GPU opens as far as a GPU can without a driver
    # (ENXIO), the other job's is refused (EPERM).
    assert seen["opened"] == {"own-gpu": "ENXIO", "holders-gpu": "EPERM"}, seen


def test_a_job_past_its_memory_is_stopped_by_slurm_and_status_says_so(user: TestbedUser, workdir: Path) -> None:
    hog = put(user, workdir / "hog.py", HOG)
    job = user.submit("--mem", "700M", "-p", "cpu", str(hog), cwd=workdir)
    done = user.wait_until_ended(job["id"], "the job to be stopped", timeout=180)
    assert done["state"] == "FAILED", done
    assert (slurm_job(job["slurm_job_id"]) or {}).get("job_state") == "OUT_OF_MEMORY", slurm_job(job["slurm_job_id"])
    assert "out of memory" in done["reason"] and "--mem" in done["reason"], done
    table = user.dlsub("status", job["id"]).stdout
    assert f"{job['id']}: out of memory" in table, table
    wait_for("no process of the job left on its node", lambda: processes_of_job(job["slurm_job_id"]) == [],
             timeout=60)


def test_jobs_seen_waiting_then_ended_unobserved_show_slurms_end_and_leave_no_process(
        user: TestbedUser, workdir: Path, submitted: list[int]) -> None:
    """Two jobs looked at once while they wait (both cpu nodes held), then left alone until Slurm ends them:
    a short one COMPLETED, and training that ignores every stop signal at Slurm's time limit (1 minute, its
    least), TIMEOUT. `dlsub status` then shows Slurm's end (a job that runs and ends between two looks was
    shown PENDING for ever), and Slurm's kill of the timed-out job's cgroup left nothing of it."""
    holder = user.run("sbatch", "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "--mem=100", "--time=10",
                      "-J", "cpu-holder", "--wrap", "sleep 600", check=True)
    submitted.append(int(holder.stdout.strip().split(";")[0]))
    script = put(user, workdir / "stubborn.py", STUBBORN)
    short = put(user, workdir / "short.py", SHORT)
    job = user.submit("--time", "1", "-p", "cpu", str(script), cwd=workdir)
    quick = user.submit("-p", "cpu", str(short), cwd=workdir)
    slurm_id = job["slurm_job_id"]
    assert [user.status(j["id"])["state"] for j in (job, quick)] == ["PENDING", "PENDING"]
    subprocess.run(["scancel", str(submitted[-1])], check=True)
    # From here on only Slurm is asked until both have ended: dlsub status does not look.
    wait_for("the job's processes", lambda: len(processes_of_job(slurm_id)) > 2, timeout=120)
    wait_for("Slurm to end both", lambda: [(slurm_job(j["slurm_job_id"]) or {}).get("job_state")
                                            for j in (job, quick)] == ["TIMEOUT", "COMPLETED"],
             timeout=180, interval=2)
    assert user.status(job["id"])["state"] == "TIMEOUT"
    assert user.status(quick["id"])["state"] == "COMPLETED"
    wait_for("no process of the job left on its node", lambda: processes_of_job(slurm_id) == [], timeout=60)
    assert user.containers(f"dlsub.slurm_job_id={slurm_id}") == [], "and no container"


def test_a_job_killed_outright_leaves_podman_usable_for_the_users_next_job_on_its_node(
        user: TestbedUser, workdir: Path, submitted: list[int]) -> None:
    holder = user.run("sbatch", "--parsable", "-p", "cpu", "-w", "cpu2", "--exclusive", "--mem=100", "--time=10",
                      "-J", "cpu-holder", "--wrap", "sleep 600", check=True)
    submitted.append(int(holder.stdout.strip().split(";")[0]))
    train = str(EXAMPLES / "train_digits.py")
    killed = user.submit("-p", "cpu", "--cpus", "1", "--mem", "1G", train, "--epochs", "20", cwd=workdir)
    wait_for("training on cpu1", lambda: progress_events(killed["job_dir"], "progress"), timeout=120)
    # What slurmstepd does to a job it aborts: SIGKILL to every process of the job's cgroups, the container's
    # conmon and fuse-overlayfs among them; no SIGTERM first, so no launcher cleans up. On a site Podman's pause
    # process dies with them, started by the job's first podman; on the testbed the tests' own podman calls on
    # the node (user.containers) may have started it outside any job, so it is killed too.
    # (Podman keeps its pause pid where its database says: under the runtime directory, or /tmp/podman-run-UID.)
    pids = processes_of_job(killed["slurm_job_id"], "cpu1")
    for tmp in (f"dlsub-xdg-{user.uid}", f"podman-run-{user.uid}"):
        pause = HOSTS_DIR / "cpu1" / "tmp" / tmp / "libpod" / "tmp" / "pause.pid"
        if pause.exists():
            pids.append(int(pause.read_text()))
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "slurmstepd":
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError):
            pass
    wait_for("Slurm to end it", lambda: (slurm_job(killed["slurm_job_id"]) or {}).get("job_state") not in
             ("RUNNING", "COMPLETING"), timeout=60)
    broken = user.on_node("cpu1", "podman", "ps", "-a")
    assert broken.returncode != 0 and "system migrate" in broken.stderr, \
        ("the state a killed attempt leaves: Podman fails for this user on cpu1", broken)
    nxt = user.submit("-p", "cpu", "--cpus", "1", "--mem", "1G", train, "--epochs", "1", cwd=workdir)
    end = user.wait_until_ended(nxt["id"], timeout=180)
    assert end["state"] == "COMPLETED", job_output(nxt["job_dir"])[-2000:]
    # At least the killed one: an earlier attempt killed on this node may have left its own (a failed run's).
    assert re.search(r"dlsub: on cpu1: [1-9][0-9]* container\(s\) of a killed attempt had left Podman unusable",
                     job_output(nxt["job_dir"])), job_output(nxt["job_dir"])[-2000:]
    assert user.containers(f"dlsub.job_id={killed['id']}", nodes=("cpu1",)) == [], "the dead container removed"
