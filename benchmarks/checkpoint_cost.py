"""What a checkpoint costs the training: plain ``run.save``, DCP sharded save, asynchronous sharded save.

    python benchmarks/checkpoint_cost.py [--mb 256] [--repeats 3] [--dir /tmp]

A model of ``--mb`` MB of float32 weights (square linear layers of 2048),
trained with SGD on CPU. For each way of saving: the time the training is
blocked per checkpoint (median of ``--repeats``), and that as a fraction of
one training step; for the asynchronous save, also how long until the
checkpoint is complete (written and sealed) in the background. Then the
time to restore the sharded checkpoint into the world size that wrote it
(2) and into another (1), and a plain checkpoint into 1.

``run.save`` is how a replicated (DDP) model is saved: rank 0 alone writes
the whole state, so it runs in one process. The sharded saves run in a gloo
group of 2 processes (on loopback) holding half the weights each, as FSDP
does (``fully_shard``): each rank writes its half.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlsub import checkpointing
from dlsub.checkpointing.sharded import ModelState
from dlsub.checkpointing.storage import checkpoint_files

WIDTH = 2048
BATCH = 32


def _layers(mb: int) -> int:
    return max(1, round(mb * 2**20 / (WIDTH * WIDTH * 4)))


def _step_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> float:
    x = torch.randn(BATCH, WIDTH)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first step warms up


def _blocked(save: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        save()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sharded_state(layers: int) -> tuple[dict[str, Any], torch.nn.Module, torch.optim.Optimizer]:
    """This rank's model: under a group, FSDP2 (``fully_shard``) shards every layer over it."""
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return {"app": ModelState(model, optimizer)}, model, optimizer


def rank_main(mode: str, job: Path, layers: int, repeats: int) -> dict[str, float]:
    """One process of the group (or the process alone): what it measured."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    run = checkpointing.init(job, handle_signals=False, keep=2)
    state, model, optimizer = _sharded_state(layers)
    found: dict[str, float] = {}
    if mode == "save":
        found["step_s"] = _step_seconds(model, optimizer)
        found["sharded_s"] = _blocked(lambda: run.save_sharded(state), repeats)
        found["async_s"] = _blocked(lambda: run.save_sharded(state, asynchronous=True), repeats)
        start = time.perf_counter()
        run.wait_for_checkpoint()
        found["async_tail_s"] = time.perf_counter() - start  # after the last call returned, until complete
        start = time.perf_counter()
        run.save_sharded(state, asynchronous=True)
        found["async_returns_s"] = time.perf_counter() - start
        run.wait_for_checkpoint()
        found["async_complete_s"] = time.perf_counter() - start
    else:
        found["restore_s"] = _blocked(lambda: run.restore_sharded(state), repeats)
    if dist.is_initialized():
        dist.destroy_process_group()
    return found


def _group(mode: str, job: Path, layers: int, repeats: int, world: int) -> dict[str, float]:
    """Run rank_main in ``world`` processes; each figure as the slowest rank's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    argv = [sys.executable, __file__, "--rank-mode", mode, "--job", str(job), "--layers", str(layers),
            "--repeats", str(repeats)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**env, "RANK": str(r)})
             for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: {outs}")
    found = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    return {key: max(f[key] for f in found) for key in found[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="the model's weights, MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoints go")
    parser.add_argument("--rank-mode", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_mode:
        print(json.dumps(rank_main(args.rank_mode, Path(args.job), args.layers, args.repeats)))
        return
    layers = _layers(args.mb)
    mb = layers * WIDTH * WIDTH * 4 / 2**20
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Plain save: one process, the whole model (rank 0 of a DDP job).
        torch.manual_seed(0)
        run = checkpointing.init(Path(tmp) / "plain", handle_signals=False, keep=2)
        model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        step1 = _step_seconds(model, optimizer)
        whole = {"model": model.state_dict()}
        plain = _blocked(functools.partial(run.save, whole), args.repeats)
        plain_restore = _blocked(run.restore, args.repeats)
        assert checkpoint_files(run.checkpoint_dir)
        del model, optimizer, whole
        job = Path(tmp) / "sharded"
        saved = _group("save", job, layers, args.repeats, 2)
        same = _group("restore", job, layers, args.repeats, 2)
        other = _group("restore", job, layers, args.repeats, 1)
    print(f"model: {mb:.0f} MB of float32 weights ({layers} layers of {WIDTH}x{WIDTH}), SGD, batch {BATCH}, CPU; "
          f"median of {args.repeats}; torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"step time: {step1:.2f} s in one process (whole model), {saved['step_s']:.2f} s in a group of 2 "
          f"(half each)")
    print(f"{'checkpoint':48} {'blocked s':>10} {'of a step':>10}")
    rows = [("run.save (rank 0 writes all), 1 process", plain, step1),
            ("run.save_sharded, 2 ranks", saved["sharded_s"], saved["step_s"]),
            ("run.save_sharded(asynchronous=True), 2 ranks", saved["async_returns_s"], saved["step_s"])]
    for name, blocked, step in rows:
        print(f"{name:48} {blocked:10.2f} {blocked / step:10.1%}")
    print(f"asynchronous: complete {saved['async_complete_s']:.2f} s after the call (the training runs meanwhile); "
          f"back-to-back saves, each waiting for the previous: {saved['async_s']:.2f} s blocked each")
    print(f"{'restore':48} {'seconds':>10}")
    print(f"{'plain, 1 process':48} {plain_restore:10.2f}")
    print(f"{'sharded, written by 2, into 2 ranks':48} {same['restore_s']:10.2f}")
    print(f"{'sharded, written by 2, into 1 process':48} {other['restore_s']:10.2f}")


if __name__ == "__main__":
    main()
