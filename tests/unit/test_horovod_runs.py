"""Unit (no Slurm, no Podman): Horovod scripts run unchanged under dlsub's torchrun, and checkpoint through dlsub.

Skipped where Horovod is not installed (CI's venv); run with a Python that has horovod.torch (gloo) and
pytest. Each run is torchrun (one agent, or two agents on loopback as two "nodes", as a gang runs it with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) starting ``python -m dlsub.checkpointing.rank_output SCRIPT``, as dlsub's
launcher has it start the processes; the script is plain Horovod (hvd.init, DistributedOptimizer,
broadcast_parameters) with dlsub's restore / should_stop / save / exit_for_resume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from dlsub import contract
from dlsub.checkpointing.storage import checkpoint_files, checkpoint_step

pytest.importorskip("horovod.torch")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240

SCRIPT = r'''
import os, signal
import torch
import horovod.torch as hvd
from dlsub import checkpointing


def say(line):  # one write: the ranks share torchrun's output
    os.write(1, (line + "\n").encode())


hvd.init()
if os.environ.get("TEST_TORCH_TOO"):  # a Horovod script that sets up torch.distributed as well (env://)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    assert (dist.get_rank(), dist.get_world_size()) == (hvd.rank(), hvd.size())
run = checkpointing.init()
torch.manual_seed(1000 + hvd.rank())  # every rank starts from other weights: only the broadcast makes them one
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters())
start = 0
state = run.restore()
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    say(f"RESTORED rank={hvd.rank()} step={start}")
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
total = int(os.environ["TEST_STEPS"])
signal_at, signal_rank = int(os.environ.get("TEST_SIGNAL_AT", "-1")), int(os.environ.get("TEST_SIGNAL_RANK", "-1"))
for step in range(start, total):
    if step == signal_at and hvd.rank() == signal_rank:
        os.kill(os.getpid(), signal.SIGUSR1)  # the launcher's stop request, to this rank alone
    data = torch.Generator().manual_seed(100 * step + hvd.rank())  # each rank its own batch, each step its own
    x = torch.randn(16, 4, generator=data) + hvd.rank()
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.report(step=step + 1, loss=float(loss.detach()))
    if run.should_stop():
        run.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1})
        say(f"STOPPED rank={hvd.rank()} step={step + 1} reason={run.stop_reason}")
        run.exit_for_resume()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
low, high = hvd.allreduce(flat, op=hvd.Min), hvd.allreduce(flat, op=hvd.Max)
say(f"DONE rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
    f"cross={hvd.cross_rank()}/{hvd.cross_size()} agree={torch.equal(low, high)} "
    f"agent_store={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')} "
    f"weights={','.join(f'{v:.6f}' for v in flat.tolist())}")
run.finish()
'''


def base_env(job_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "DLSUB_", "SLURM_", "TORCHELASTIC_", "MASTER_"))}
    env.update(PYTHONPATH=str(REPO), DLSUB_JOB_DIR=str(job_dir), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               **extra)
    return env


def torchrun(script: Path, env: dict[str, str], *, nodes: int, per_node: int) -> str:
    """Run ``script`` through dlsub's rank entry point under ``nodes`` torchrun agents of ``per_node``
    processes on loopback; their output together, once all have exited 0."""
    entry = ["-m", "dlsub.checkpointing.rank_output", str(script)]
    if nodes == 1:
        commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                     f"--nproc-per-node={per_node}", *entry]]
        envs = [env]
    else:
        endpoint = f"127.0.0.1:{free_port()}"
        commands = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                     f"--nproc-per-node={per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                     "--rdzv-id=hvd-test", "--local-addr=127.0.0.1", *entry] for _ in range(nodes)]
        envs = [{**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}] * nodes  # as dlsub runs a gang
    procs = [subprocess.Popen(cmd, env=e, cwd=script.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for cmd, e in zip(commands, envs, strict=True)]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = "\n".join(outputs)
    assert all(proc.returncode == 0 for proc in procs), text[-6000:]
    return text


def records(text: str, kind: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line.split(kind, 1)[1])) for line in text.splitlines() if kind in line]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train_hvd.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("nodes, per_node, torch_too", [(1, 1, ""), (1, 2, ""), (2, 1, ""), (2, 1, "1")])
def test_a_horovod_script_trains_as_one_group(script: Path, tmp_path: Path, nodes: int, per_node: int,
                                              torch_too: str) -> None:
    """Unit (no Slurm, no Podman): every process's hvd.init() joins torchrun's group (size, local and cross
    ranks as torchrun numbered them) and DistributedOptimizer keeps their weights equal (each rank started
    from its own and trained on its own data). A script that also calls init_process_group finds
    MASTER_PORT free again (rank 0 served the port's exchange there in a gang) and the same ranks. A process
    alone is Horovod's one process, as without dlsub."""
    size = nodes * per_node
    env = base_env(tmp_path / "job", TEST_STEPS="6", TEST_TORCH_TOO=torch_too)
    text = torchrun(script, env, nodes=nodes, per_node=per_node)
    done = sorted(records(text, "DONE"), key=lambda r: int(r["rank"]))
    assert [r["rank"] for r in done] == [str(r) for r in range(size)], text[-4000:]
    for r in done:
        rank = int(r["rank"])
        assert r["size"] == str(size)
        assert r["local"] == f"{rank % per_node}/{per_node}" and r["cross"] == f"{rank // per_node}/{nodes}"
        assert r["agree"] == "True"
        # Both ways the port is shared: torchrun's own store (one node), or rank 0 serving it (a gang).
        assert r["agent_store"] == ("True" if nodes == 1 else "False")
    assert len({r["weights"] for r in done}) == 1


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 2)])
def test_a_stop_on_one_rank_stops_all_at_one_step_and_resumes_there(script: Path, tmp_path: Path, nodes: int,
                                                                    per_node: int) -> None:
    """Unit (no Slurm, no Podman): SIGUSR1 to one rank at step 3: every rank stops after the same step (the
    others for "peer"), one checkpoint is written, the attempt asks to be resumed; a second run restores
    that step on every rank and ends with the weights of a run that was never stopped."""
    size, signal_rank, total = nodes * per_node, nodes * per_node - 1, 6
    job = tmp_path / "job"
    stopped = torchrun(script, base_env(job, TEST_STEPS=str(total), TEST_SIGNAL_AT="3",
                                        TEST_SIGNAL_RANK=str(signal_rank)), nodes=nodes, per_node=per_node)
    stops = records(stopped, "STOPPED")
    assert sorted(int(r["rank"]) for r in stops) == list(range(size)), stopped[-4000:]
    assert {r["step"] for r in stops} == {"4"}
    assert {r["reason"] for r in stops if r["rank"] == str(signal_rank)} == {"SIGUSR1"}
    assert {r["reason"] for r in stops if r["rank"] != str(signal_rank)} == {"peer"}
    assert not records(stopped, "DONE")
    checkpoints = checkpoint_files(job / contract.CHECKPOINT_DIR)
    assert len(checkpoints) == 1, checkpoints
    assert checkpoint_step(checkpoints[0][1]) == 4
    assert contract.resume_marker(job, "local").is_file(), sorted(str(p) for p in job.rglob("*"))

    resumed = torchrun(script, base_env(job, TEST_STEPS=str(total)), nodes=nodes, per_node=per_node)
    restored = records(resumed, "RESTORED")
    assert sorted(int(r["rank"]) for r in restored) == list(range(size)) and {r["step"] for r in restored} == {"4"}
    done = records(resumed, "DONE")
    assert len(done) == size and {r["agree"] for r in done} == {"True"}

    straight = torchrun(script, base_env(tmp_path / "straight", TEST_STEPS=str(total)), nodes=nodes,
                        per_node=per_node)
    expected = {r["weights"] for r in records(straight, "DONE")}
    assert len(expected) == 1 and {r["weights"] for r in done} == expected
