"""Integration (live Slurm testbed + rootless Podman + real PyTorch + Horovod 0.28.1): a Horovod script, as
Horovod's own examples write it (``hvd.init()``, ``hvd.DistributedOptimizer``, ``hvd.broadcast_parameters``),
checkpointing through dlsub's library, runs under dlsub on 2 processes of one node and across 2 nodes, and
is requeued (``dlsub requeue``: SIGUSR1, as before a time limit, a move or a resize) and resumed at the step
it stopped.

The Horovod image is optional (containers/build-horovod-image.sh, ``make image-horovod``: a compiled
Horovod, about 9 minutes to build, never in CI's path), so these tests are skipped where it has not been
built; CI's testbed has none. Run them after ``make image-horovod``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from livebed import TestbedUser, put, wait_for

IMAGE = "localhost/dlsub-torch:2.13.0-cpu-horovod"

HOROVOD_SCRIPT = """
import time
import torch
import horovod.torch as hvd
from dlsub import checkpointing

STEPS = 60
hvd.init()
run = checkpointing.init(total_steps=STEPS)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = run.restore() or {"step": 0}
if "model" in state:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
step = state["step"]
if hvd.rank() == 0:
    print(f"horovod: {hvd.size()} processes on {hvd.cross_size()} node(s), from step {step}", flush=True)
while step < STEPS:
    x = torch.randn(32, 8) + hvd.rank()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    run.report(step=step, loss=float(loss))
    time.sleep(0.2)
    if run.should_stop():
        run.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()})
        print(f"rank {hvd.rank()}: checkpointed at step {step}", flush=True)
        run.exit_for_resume()
# Each rank's inputs differ (shifted by its rank); the averaged gradients keep the replicas equal.
mean = hvd.allreduce(model.weight.detach(), op=hvd.Average)
print(f"rank {hvd.rank()} of {hvd.size()}: weights agree {torch.allclose(mean, model.weight)}", flush=True)
run.finish()
"""


@pytest.fixture
def horovod_image(user: TestbedUser) -> str:
    if user.run("podman", "image", "exists", IMAGE).returncode != 0:
        pytest.skip(f"no {IMAGE} (make image-horovod builds it; it is not in CI's path)")
    return IMAGE


def test_a_horovod_script_on_two_processes_is_requeued_and_resumes_where_it_stopped(
        user: TestbedUser, workdir: Path, horovod_image: str) -> None:
    script = put(user, workdir / "horovod train.py", HOROVOD_SCRIPT)
    job = user.submit("--image", horovod_image, "-p", "gpu", "--gpus", "2", str(script), cwd=workdir)
    wait_for("10 steps", lambda: (user.status(job["id"])["step"] or 0) >= 10, timeout=180)
    user.dlsub("requeue", job["id"])
    done = user.wait_until_ended(job["id"], "the Horovod job to end", timeout=300)
    log = user.dlsub("logs", job["id"]).stdout
    print("\n".join(line for line in log.splitlines() if "horovod:" in line or "checkpointed" in line))
    assert done["state"] == "COMPLETED" and done["attempts"] == 2, log
    saved = set(re.findall(r"checkpointed at step (\d+)", log))
    assert len(saved) == 1, f"both ranks stopped at one step: {saved}\n{log}"
    (at,) = saved
    assert "horovod: 2 processes on 1 node(s), from step 0" in log, log
    assert f"horovod: 2 processes on 1 node(s), from step {at}" in log and int(at) > 0, log
    assert log.count("weights agree True") == 2 and "weights agree False" not in log, log


def test_a_horovod_script_runs_across_two_nodes(user: TestbedUser, workdir: Path, horovod_image: str) -> None:
    script = put(user, workdir / "horovod train.py", HOROVOD_SCRIPT)
    job = user.submit("--image", horovod_image, "--nodes", "2", "--gpus-per-node", "1", str(script), cwd=workdir)
    done = user.wait_until_ended(job["id"], "the Horovod gang to end", timeout=300)
    log = user.dlsub("logs", job["id"]).stdout
    assert done["state"] == "COMPLETED", log
    assert "horovod: 2 processes on 2 node(s), from step 0" in log, log
    assert log.count("weights agree True") == 2 and "weights agree False" not in log, log
