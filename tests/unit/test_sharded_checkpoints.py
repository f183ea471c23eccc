"""Unit (real gloo groups on loopback, CPU): sharded checkpoints through torch.distributed.checkpoint.

A DTensor sharded over 2 ranks is saved by each rank's shards and restored, with the same values, into 4
ranks and into one process with no group; a save killed midway leaves the previous checkpoint the one
restored; an asynchronous save holds the values of the moment it was called."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from conftest import NO_HANG_S, REPO, run_ranks

from dlsub import checkpointing
from dlsub.checkpointing.sharded import MANIFEST, sharded_checkpoints

# Each rank: a 16x3 tensor sharded by rows over the group (a DTensor), a plain tensor and a step. "save": a
# synchronous save at step 5, then an asynchronous one at step 6 after which the training changes the values
# at once; "restore": restores into zeros and prints what it holds.
_RANK = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from dlsub import checkpointing
    mode, job = sys.argv[1], sys.argv[2]
    group = int(os.environ["WORLD_SIZE"]) > 1
    if group:
        from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    def state_at(step):
        full = torch.arange(48.0).reshape(16, 3) + step if step >= 0 else torch.zeros(16, 3)
        weight = distribute_tensor(full, mesh, [Shard(0)]) if group else full
        return {"weight": weight, "bias": torch.full((4,), float(step)), "step": step}
    run = checkpointing.init(job, handle_signals=False, keep=2)
    if mode == "save":
        run.save_sharded(state_at(5), step=5)
        state = state_at(6)
        run.save_sharded(state, step=6, asynchronous=True)
        state["weight"].to_local().add_(1000.0)  # the next training step: it must not reach the checkpoint
        state["bias"].add_(1000.0)
        run.finish()
        print(json.dumps([run.rank]))
    else:
        state = state_at(-1)
        found = run.restore_sharded(state)
        got = state["weight"].full_tensor() if group else state["weight"]
        print(json.dumps([run.rank, found, got.flatten().tolist(), state["bias"].tolist(), state["step"],
                          run.resized]))
    if group:
        dist.destroy_process_group()
""")


def _ranks(mode: str, job: Path, world: int) -> list[list]:  # type: ignore[type-arg]
    return sorted(json.loads(line) for line in run_ranks(_RANK, [mode, str(job)], [{"OMP_NUM_THREADS": "1"}] * world))


def test_saved_by_two_ranks_sync_and_async_restores_into_four_and_into_one(tmp_path: Path) -> None:
    job = tmp_path / "job"
    _ranks("save", job, 2)
    assert [seq for seq, _ in sharded_checkpoints(job / "checkpoints")] == [6, 5]
    for seq, folder in sharded_checkpoints(job / "checkpoints"):
        assert json.loads((folder / MANIFEST).read_text())["world_size"] == 2
        # Each rank wrote its own shard file.
        assert sorted(p.name for p in folder.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"], seq
    expected = (torch.arange(48.0) + 6).tolist()
    four = _ranks("restore", job, 4)
    assert four == [[r, True, expected, [6.0] * 4, 6, True] for r in range(4)], \
        "every rank of a bigger group restores the asynchronous save's values, and knows the size changed"
    one = checkpointing.init(job, handle_signals=False)  # this process: no group at all
    state = {"weight": torch.zeros(16, 3), "bias": torch.zeros(4), "step": -1}
    assert one.restore_sharded(state) and one.resized and state["step"] == 6
    assert state["weight"].flatten().tolist() == expected and state["bias"].tolist() == [6.0] * 4
    events = [json.loads(line) for line in (job / "progress.jsonl").read_text().splitlines()]
    checkpoint = [e for e in events if e["event"] == "checkpoint"]
    assert [(e["step"], e["seq"], Path(e["path"]).name) for e in checkpoint] == [(5, 5, "dcp-00000005"),
                                                                                (6, 6, "dcp-00000006")]
    assert [e["step"] for e in events if e["event"] == "restore"] == [6, 6]
    assert [e["event"] for e in events][-1] == "restore" and "finished" in [e["event"] for e in events]


def test_nothing_to_restore_leaves_the_state_alone(tmp_path: Path) -> None:
    run = checkpointing.init(tmp_path / "job", handle_signals=False)
    state = {"w": torch.zeros(3), "step": -1}
    assert not run.restore_sharded(state) and state["step"] == -1 and not run.resized


_KILLED = textwrap.dedent("""
    import os, signal, sys
    import torch
    import torch.distributed.checkpoint as dcp
    from dlsub import checkpointing
    run = checkpointing.init(sys.argv[1], handle_signals=False)
    run.save_sharded({"w": torch.full((64,), 1.0), "step": 1}, step=1)
    original = dcp.FileSystemWriter.write_data
    def write_then_die(self, plan, planner):
        original(self, plan, planner).wait()  # the shards are written; the save never completes
        os.kill(os.getpid(), signal.SIGKILL)
    dcp.FileSystemWriter.write_data = write_then_die
    run.save_sharded({"w": torch.full((64,), 2.0), "step": 2}, step=2)
""")


def test_a_save_killed_midway_leaves_the_previous_one_restored_and_the_next_save_works(tmp_path: Path) -> None:
    job = tmp_path / "job"
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(job)], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=NO_HANG_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = sorted(p.name for p in (job / "checkpoints").iterdir())
    assert names == ["dcp-00000001", "dcp-00000002.partial"], names
    run = checkpointing.init(job, handle_signals=False)
    state = {"w": torch.zeros(64), "step": 0}
    assert run.restore_sharded(state) and state["step"] == 1 and torch.equal(state["w"], torch.full((64,), 1.0))
    run.save_sharded({"w": torch.full((64,), 3.0), "step": 3})
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["dcp-00000001", "dcp-00000003"], \
        "the next save passes the killed one's number and clears its leftovers"


def test_corrupt_newest_falls_back_and_pruning_keeps_the_newest_good(tmp_path: Path) -> None:
    run = checkpointing.init(tmp_path / "job", handle_signals=False, keep=2)
    for step in (1, 2, 3):
        run.save_sharded({"w": torch.full((8,), float(step))}, step=step)
    assert [seq for seq, _ in sharded_checkpoints(run.checkpoint_dir)] == [3, 2]
    shard = next((run.checkpoint_dir / "dcp-00000003").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    state = {"w": torch.zeros(8)}
    assert run.restore_sharded(state) and torch.equal(state["w"], torch.full((8,), 2.0))
    # With both kept ones corrupt, a new save keeps the older good one too.
    (run.checkpoint_dir / "dcp-00000002" / ".metadata").write_bytes(b"")
    good = run.save_sharded({"w": torch.full((8,), 4.0)}, step=4)
    assert sorted(p.name for _, p in sharded_checkpoints(run.checkpoint_dir)) == ["dcp-00000003", "dcp-00000004"]
    assert good.name == "dcp-00000004"


def test_plain_save_is_unchanged_beside_sharded(tmp_path: Path) -> None:
    run = checkpointing.init(tmp_path / "job", handle_signals=False)
    run.save_sharded({"w": torch.ones(2)}, step=1)
    path = run.save({"plain": 1}, step=2)
    assert path is not None and path.name == "ckpt-00000002.pt"
    assert run.restore() == {"plain": 1}
