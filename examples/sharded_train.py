"""Plain PyTorch with dlsub.checkpointing and sharded checkpoints (FSDP2 under torchrun).

Under torchrun each layer is sharded over the group with ``fully_shard`` and
every rank writes its own shards (``run.save_sharded``); in one process the
same script trains the whole model. A checkpoint every ``--every`` steps is
asynchronous (written in a thread while training goes on); the one dlsub
asks for (``run.should_stop()``) is synchronous, then the process exits
"resume me". A restart at another world size (an elastic resize) restores
the same checkpoint resharded. Generated data, nothing downloaded.

    python examples/sharded_train.py
    torchrun --standalone --nproc-per-node 2 examples/sharded_train.py
    dlsub --gpus 1:4 examples/sharded_train.py
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from dlsub import checkpointing
from dlsub.checkpointing.sharded import ModelState


def main(argv: list[str] | None = None, on_step: Callable[[int], None] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="steps between periodic (asynchronous) checkpoints")
    args = parser.parse_args(argv)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run = checkpointing.init(total_steps=args.steps)
    state = {"app": ModelState(model, optimizer), "step": 0}
    run.restore_sharded(state)  # False on a first start: the state stays as it is
    generator = torch.Generator().manual_seed(1)
    target = torch.randn(32, 1, generator=generator).to(device)
    loss = torch.tensor(0.0)
    for step in range(state["step"], args.steps):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(step)).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.report(step=step + 1, loss=loss.item(), samples=(step + 1) * 64)
        if on_step is not None:
            on_step(step + 1)
        if run.should_stop():
            run.save_sharded({**state, "step": step + 1})  # synchronous: done before the exit
            run.exit_for_resume()
        if (step + 1) % args.every == 0:
            run.save_sharded({**state, "step": step + 1}, asynchronous=True)
    run.finish()
    return float(loss.item())


if __name__ == "__main__":
    main()
