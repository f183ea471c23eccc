"""A user's training script for the device checks: a CUDA model under DDP, written with dlsub's library.

    torchrun ... gpu_train.py [--steps N] [--throttle S] [--timings FILE]

As a researcher writes it (the README's loop): ``checkpointing.init()``,
``restore()``, one step, ``report()``, and on ``should_stop()`` a save and
``exit_for_resume()``. The process group's backend is NCCL on a GPU (gloo
without one); ``GPU_CHECK_BACKEND`` names another, for a group that NCCL
refuses (two ranks on one GPU). Rank 0 appends one JSON line per run of the
script to ``--timings`` (default ``$DLSUB_JOB_DIR/timings.jsonl``): the GPU's
name, the backend, the world size, the step it resumed at and the GPU time of
each step (synchronized; the ``--throttle`` sleep, which stretches a run so
that a resize can happen during it, is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dlsub import checkpointing


def model(width: int, layers: int) -> nn.Sequential:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--throttle", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--timings", type=Path)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = os.environ.get("GPU_CHECK_BACKEND") or ("nccl" if cuda else "gloo")
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1

    run = checkpointing.init(total_steps=args.steps)
    torch.manual_seed(0)
    net = model(args.width, args.layers).to(device)
    trained: nn.Module = (nn.parallel.DistributedDataParallel(net, device_ids=[local_rank] if cuda else None)
                          if dist.is_initialized() else net)
    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-3)
    state = run.restore(map_location=device) or {"step": 0}
    if "model" in state:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    data = torch.Generator(device=device).manual_seed(1000 * start + rank)

    step_s: list[float] = []
    step = start
    for step in range(start, args.steps):
        began = time.perf_counter()
        x = torch.randn(args.batch, args.width, device=device, generator=data)
        loss = trained(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - began)
        run.report(step=step + 1, loss=float(loss))
        if args.throttle:
            time.sleep(args.throttle)
        if run.should_stop():
            run.save({"step": step + 1, "model": net.state_dict(), "optimizer": optimizer.state_dict()})
            write_timings(args, rank, cuda, backend, world, start, step_s, stopped=True)
            run.exit_for_resume()
    write_timings(args, rank, cuda, backend, world, start, step_s, stopped=False)
    run.finish()


def write_timings(args: argparse.Namespace, rank: int, cuda: bool, backend: str, world: int, start: int,
                  step_s: list[float], stopped: bool) -> None:
    if rank != 0:
        return
    path = args.timings or Path(os.environ.get("DLSUB_JOB_DIR", "."), "timings.jsonl")
    record = {"time": time.time(), "device_name": torch.cuda.get_device_name() if cuda else "cpu",
              "cuda": torch.version.cuda, "backend": backend if dist.is_initialized() else None,
              "world_size": world, "resumed_at": start, "steps": len(step_s), "stopped": stopped,
              "step_ms": [round(s * 1000, 3) for s in step_s]}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
