"""Integration (live Slurm testbed + rootless Podman + the agent service): a ``--gpus 1`` job started on CPUs in
immediate mode whose script dies there for want of a GPU is sent back to wait for its GPU partition, and
completes there (issue 49, item 5).

The testbed's GPUs are device nodes without a driver and its image's torch is a CPU build, so a real ``.cuda()``
fails on its GPU nodes too. The script stands in for it: it raises the error torch raises for ``.cuda()`` in a
CPU build ("Torch not compiled with CUDA enabled") when it finds no ``/dev/nvidia*``, and runs when it does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from livebed import TestbedUser, attempts, job_output, put, wait_for

NEEDS_A_GPU = """\
import glob
import sys

gpus = glob.glob("/dev/nvidia[0-9]*")
if not gpus:
    # torch's own words for .cuda() in a CPU build (torch/cuda/__init__.py, _lazy_init)
    raise AssertionError("Torch not compiled with CUDA enabled")
print(f"trained on {len(gpus)} GPU(s)", file=sys.stderr)
"""


def test_a_script_that_needs_a_gpu_waits_for_its_partition_and_completes_there(
        user: TestbedUser, workdir: Path, gpus_busy: list[int], service_agent: None) -> None:
    script = put(user, workdir / "needs a gpu.py", NEEDS_A_GPU)
    job = user.submit("--mode", "immediate", "--gpus", "1", str(script), cwd=workdir)
    assert job["partition"] == "cpu" and job["ideal_partition"] == "gpu"

    # Its attempt on cpu dies; its launcher requeues it held, and the agent sends it to wait on gpu (every GPU
    # is another job's), not to fail.
    waiting = wait_for("the job to wait on gpu",
                       lambda: (s := user.status(job["id"]))["partition"] == "gpu" and s["state"] == "PENDING" and s,
                       timeout=120)
    assert waiting["slurm_job_id"] == job["slurm_job_id"]
    why = user.dlsub("why", job["id"]).stdout
    assert "died for want of a GPU" in why and "gpu" in why, why

    subprocess.run(["scancel", *map(str, gpus_busy)], check=True)
    final = user.wait_until_ended(job["id"], "the job to complete on gpu", timeout=240)
    assert final["state"] == "COMPLETED", final
    runs = attempts(job["job_dir"])
    assert [a["partition"] for a in runs if a["event"] == "start"] == ["cpu", "gpu"]
    assert [a.get("action") for a in runs if a["event"] == "end"][0] == "needs-gpu"
    text = job_output(job["job_dir"])
    assert "the training needs a GPU (AssertionError: Torch not compiled with CUDA enabled)" in text, text
    assert "trained on 1 GPU(s)" in text, text
