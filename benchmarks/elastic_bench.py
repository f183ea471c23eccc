"""What the elastic benchmarks share: node holders, a job's progress events and the agent's decisions.

Imported by benchmarks/elastic_vs_rigid.py and benchmarks/resize_latency.py;
not a benchmark itself. Acts on the live testbed as root (through the
integration tests' livebed helpers, as the testbed user).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testbed"))

from livebed import EXAMPLES, TestbedUser, slurm_job, slurm_jobs, wait_for

TRAIN = str(EXAMPLES / "train_digits.py")
#: The whole GPU node an elastic job could grow onto, or a waiting job wants.
GPUS_PER_NODE = 4


#: Every Slurm job and dlsub job a benchmark started: :func:`clean_up` ends those still alive, whatever failed.
STARTED_SLURM: list[int] = []
STARTED_DLSUB: list[str] = []


def hold_node(user: TestbedUser, wait_running: bool = True, name: str = "holder", gpus: int = GPUS_PER_NODE,
              node: str | None = None) -> int:
    """A job wanting ``gpus`` GPUs of one node (all of one by default; of ``node`` when named), holding them
    until cancelled (the benchmark ends it when it chooses)."""
    where = ["-w", node] if node else []
    out = user.run("sbatch", "--parsable", "-p", "gpu", *where, f"--gres=gpu:{gpus}", "-J", name, "--mem=200",
                   "--cpus-per-task=1", "--time=30", "--wrap", "sleep 1800", check=True)
    job_id = int(out.stdout.strip().split(";")[0])
    STARTED_SLURM.append(job_id)
    if wait_running:
        wait_for("the node holder to run", lambda: (slurm_job(job_id) or {}).get("job_state") == "RUNNING",
                 timeout=120, interval=0.5)
    return job_id


def scancel(*job_ids: int | None) -> None:
    ids = [str(i) for i in job_ids if i]
    if ids:
        subprocess.run(["scancel", *ids], check=False)


def submit(user: TestbedUser, *args: str) -> dict[str, Any]:
    job = user.submit(*args)
    STARTED_DLSUB.append(job["id"])
    return job


def clean_up(user: TestbedUser) -> None:
    """End what this benchmark started and is still alive (only those: the testbed is shared)."""
    for job in STARTED_DLSUB:
        if user.status(job)["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            user.dlsub("cancel", job, check=False)
    alive = [i for i in STARTED_SLURM if not gone(i)]
    scancel(*alive)


#: Slurm states of a job that still holds or wants nodes (squeue --json also lists ended jobs for a while).
ALIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT")


def gone(*job_ids: int | None) -> bool:
    """Whether none of these Slurm jobs (an array's id covers its tasks) is alive."""
    wanted = {i for i in job_ids if i}
    # Read through the client's dialect: squeue --json nests ids and states after 22.05.
    return not [j for j in slurm_jobs() if (j.get("job_id") in wanted or j.get("array_job_id") in wanted)
                and j.get("job_state") in ALIVE]


def gpu_nodes_idle() -> bool:
    out = subprocess.run(["sinfo", "-h", "-p", "gpu", "-N", "-o", "%N %t"], capture_output=True, text=True,
                         check=True).stdout
    return all(line.split()[1].rstrip("*") == "idle" for line in out.splitlines() if line.strip())


def wait_testbed_quiet(timeout: float = 180) -> None:
    """Both GPU nodes idle: no job of anyone's (a benchmark must run alone on the testbed)."""
    wait_for("both GPU nodes idle", gpu_nodes_idle, timeout=timeout, interval=1)


def events(job_dir: str, kind: str | None = None, file: str = "progress.jsonl") -> list[dict[str, Any]]:
    """The job's progress.jsonl events, or another of its event files' (attempts.jsonl), of one kind when given, in
    the order written."""
    path = Path(job_dir) / file
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return [e for e in rows if kind is None or e.get("event") == kind]


def first_after(job_dir: str, kind: str, after: float, world_size: int | None = None) -> dict[str, Any] | None:
    """The first event of ``kind`` at or after time ``after`` (with that world size, when given)."""
    for e in events(job_dir, kind):
        if float(e["time"]) >= after and (world_size is None or e.get("world_size") == world_size):
            return e
    return None


def decisions(user: TestbedUser, job: str, kind: str) -> list[dict[str, Any]]:
    """The agent's decisions of ``kind`` (grow, shrink) about the job, oldest first (`dlsub why --json`)."""
    out = user.dlsub("why", job, "--json", check=False)
    if out.returncode != 0 or not out.stdout.strip().startswith("["):
        return []
    return sorted((d for d in json.loads(out.stdout) if d.get("kind") == kind), key=lambda d: float(d["time"]))


def finished(user: TestbedUser, job: str) -> dict[str, Any] | None:
    status = user.status(job)
    return status if status["state"] in ("COMPLETED", "FAILED", "CANCELLED") else None


def stamp(t0: float, t: float | None) -> str:
    return "-" if t is None else f"{t - t0:6.1f}"


def now() -> float:
    return time.time()
