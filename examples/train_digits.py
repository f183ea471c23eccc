"""Train a small CNN on handwritten digits (UCI optdigits, shipped in examples/data).

Written with dlsub's checkpointing library, it survives SIGUSR1/SIGTERM,
requeues and moves: it saves at every epoch and when asked to stop, and
resumes from the last checkpoint at the exact batch it stopped. It runs the
same off-cluster (``python train_digits.py``), under torchrun on any number of
processes (DDP with gloo), and through ``dlsub train_digits.py``.

Elastic: ``--batch-size`` is the *global* batch, kept fixed whatever the
group's size: each of the ``run.world_size`` processes takes its share of
every step, in micro-batches of at most ``--micro-batch`` samples whose
gradients it accumulates. Progress is counted in samples, so a run resized
between two attempts (``run.resized``) resumes at the very sample it stopped
at, and the model sees the same data in the same order at any size.

``--adaptive-batch`` lets dlsub choose the global batch instead (AdaptDL
style): ``--batch-size`` becomes the initial batch the learning rate is tuned
for, ``--max-batch`` the largest allowed, ``--micro-batch`` the most one
process computes at once. At each (re)start the script takes
``run.batch_size`` in ``run.accumulation_steps`` micro-steps of
``run.micro_batch_size`` per process, reports the gradient-noise statistics
the agent's goodput policy weighs a bigger batch with, and scales the learning
rate by AdaScale's gain. Its position stays counted in samples, so a batch
changed on resume continues at the right sample.
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlsub import checkpointing

DATA = Path(__file__).resolve().parent / "data" / "digits.csv.gz"


def load_digits(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with gzip.open(path, "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = torch.from_numpy(raw[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    labels = torch.from_numpy(raw[:, 64].astype(np.int64))
    return images, labels


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64,
                   help="global batch: samples per optimizer step, over all processes")
    p.add_argument("--micro-batch", type=int, default=64,
                   help="most samples one process computes at once (the rest is gradient accumulation)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-every", type=int, default=5, help="steps between progress reports")
    p.add_argument("--throttle", type=float, default=0.0,
                   help="sleep this many seconds per step, to stretch a demo run so it can be watched or signalled")
    p.add_argument("--throttle-per-sample", type=float, default=0.0,
                   help="also sleep this many seconds per sample of this process's share of each step: with the "
                        "global batch fixed, a step then takes THROTTLE*batch/world_size, as data-parallel "
                        "GPUs would (the testbed's fake GPUs share two cores, so more processes are not faster)")
    p.add_argument("--throttle-per-node", type=float, default=0.0,
                   help="also sleep this many seconds per step for each node of the group beyond the first, as a "
                        "model whose all-reduce crosses a slow network would (the testbed's nodes share one "
                        "machine, so a second node costs nothing): such a model is slower on two nodes than on one")
    p.add_argument("--cpu-slowdown", type=float, default=1.0,
                   help="multiply --throttle by this when no GPU is visible: on a testbed whose GPUs are fake, "
                        "makes a CPU node as much slower than a GPU one as it would be on real hardware")
    p.add_argument("--gpu-slowdown", action="append", default=[], metavar="TYPE=FACTOR",
                   help="multiply --throttle by FACTOR on GPUs of TYPE (DLSUB_GPU_TYPE, the type Slurm's GRES gives "
                        "the node's GPUs), repeatable: on a testbed whose GPUs are fake, makes this model as much "
                        "slower on one kind of GPU as it would be on real hardware, each model in its own way")
    p.add_argument("--adaptive-batch", action="store_true",
                   help="let dlsub choose the global batch between --batch-size and --max-batch")
    p.add_argument("--max-batch", type=int, default=1024, help="with --adaptive-batch: the largest global batch")
    p.add_argument("--regroup-in-process", action="store_true",
                   help="when dlsub grows or shrinks the group (an elastic job's worker joins or leaves), the "
                        "processes that stay go on from memory instead of restarting from a checkpoint")
    p.add_argument("--data", type=Path, default=DATA)
    args = p.parse_args()
    try:
        args.gpu_slowdown = {t: float(f) for t, _, f in (item.partition("=") for item in args.gpu_slowdown)}
        well_formed = all(t and f > 0 for t, f in args.gpu_slowdown.items())
    except ValueError:  # a factor that is not a number
        well_formed = False
    if not well_formed:
        p.error("--gpu-slowdown takes TYPE=FACTOR, a positive factor, e.g. --gpu-slowdown v100=2.5")
    return args


def slowdown(args: argparse.Namespace) -> float:
    """How much longer --throttle sleeps here: on no GPU, --cpu-slowdown; on a GPU, its type's --gpu-slowdown."""
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return args.cpu_slowdown
    return args.gpu_slowdown.get(os.environ.get("DLSUB_GPU_TYPE", ""), 1.0)


def step_pause(args: argparse.Namespace, samples: int, world: int, per_node: int) -> float:
    """Seconds a step sleeps (before --gpu-slowdown): --throttle, --throttle-per-sample for each of this process's
    ``samples``, and --throttle-per-node for each node of a group of ``world`` processes, ``per_node`` a node,
    beyond the first."""
    nodes = -(-world // per_node)
    return args.throttle + args.throttle_per_sample * samples + args.throttle_per_node * (nodes - 1)


class GradientNoise:
    """Pollux's gradient-noise statistics, measured on two halves of a process's share of a step.

    Two half-batch gradients g1, g2 of b samples each and their mean g give
    tr(cov) = 2b (mean |gi|^2 - |g|^2) and |true gradient|^2 = |g|^2 - tr(cov)/2b;
    ``var`` is tr(cov) over the initial batch (its scale), both smoothed.
    """

    def __init__(self, init_batch: int, smoothing: float = 0.9) -> None:
        self.init_batch, self.smoothing = init_batch, smoothing
        self.sqr: float | None = None
        self.var: float | None = None

    def measure(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        half = len(y) // 2
        if half < 1:
            return
        params = [p for p in net.parameters() if p.requires_grad]
        grads = []
        for part in (slice(0, half), slice(half, 2 * half)):  # the bare module: no DDP all-reduce
            loss = F.cross_entropy(net(x[part]), y[part])
            grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
        mean = (grads[0] + grads[1]) / 2
        mean_sq = float(mean.square().sum())
        trace = 2 * half * max(0.0, float(sum(g.square().sum() for g in grads)) / 2 - mean_sq)
        sqr, var = max(0.0, mean_sq - trace / (2 * half)), trace / self.init_batch
        a = self.smoothing if self.sqr is not None else 0.0
        self.sqr = a * (self.sqr or 0.0) + (1 - a) * sqr
        self.var = a * (self.var or 0.0) + (1 - a) * var

    def gain(self, batch: int) -> float:
        """AdaScale: how many initial-batch steps one step of ``batch`` is worth (1 until measured)."""
        if self.sqr is None or self.var is None or self.var + self.sqr <= 0:
            return 1.0
        scale = batch / self.init_batch
        return (self.var + self.sqr) / (self.var / scale + self.sqr)


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # Processes on each node (torchrun's LOCAL_WORLD_SIZE): the group spans world / per_node nodes.
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    # A group of one too where it may grow in process under torchrun (its MASTER_ADDR): the group is what a joining
    # process joins.
    distributed = world > 1 or (args.regroup_in_process and "MASTER_ADDR" in os.environ)
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(args.seed)
    # torch's CPU threads are left to OMP_NUM_THREADS, which dlsub sets from the CPUs Slurm gave the job on its node
    # (os.cpu_count() is the whole node's, whatever share of it the job has).

    images, labels = load_digits(args.data)
    split = int(0.8 * len(labels))
    train_x, train_y = images[:split], labels[:split]
    test_x, test_y = images[split:], labels[split:]
    # Every step takes the same global batch; the last partial batch of an epoch is dropped.
    per_epoch = len(train_y) // args.batch_size
    total_steps = args.epochs * per_epoch

    sizes = (checkpointing.BatchSizes(init=args.batch_size, max=args.max_batch, local_max=args.micro_batch)
             if args.adaptive_batch else None)
    run = checkpointing.init(total_steps=total_steps, total_epochs=args.epochs, batch_size=sizes)
    batch = run.batch_size if args.adaptive_batch and run.batch_size else args.batch_size
    net = SmallCNN()  # its state is saved without DDP's wrapper, so any world size can load it
    model: nn.Module = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    state = run.restore()
    step, epoch, sample_in_epoch = 0, 0, 0
    if state is not None:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch = state["step"], state["epoch"]
        # Older checkpoints counted batches of this same global size.
        sample_in_epoch = state.get("sample_in_epoch", state.get("batch_in_epoch", 0) * args.batch_size)
    # Samples trained on so far: with a batch that changes between attempts, no longer step x batch.
    seen = state.get("samples_seen", step * args.batch_size) if state is not None else 0
    if args.adaptive_batch:
        # The steps left at this batch: what the agent's ETA counts on until the batch changes again.
        run.total_steps = total_steps = (step + (len(train_y) - sample_in_epoch) // batch
                                         + (args.epochs - epoch - 1) * (len(train_y) // batch))
    if state is not None:
        if rank == 0:
            print(f"resumed from step {step} (epoch {epoch}, sample {sample_in_epoch}) from {run.restored_from}"
                  f" at world size {world}{' (resized)' if run.resized else ''}", flush=True)
    elif rank == 0:
        print(f"starting from scratch: {args.epochs} epochs x {per_epoch} steps, world size {world}", flush=True)
    if rank == 0 and os.environ.get("DLSUB_GPU_TYPE"):
        print(f"on {os.environ['DLSUB_GPU_TYPE']} GPUs (throttle x{slowdown(args):g})", flush=True)

    def snapshot() -> dict:
        return {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "epoch": epoch, "sample_in_epoch": sample_in_epoch, "samples_seen": seen,
                "args": vars(args) | {"data": str(args.data)}}

    def shares() -> tuple[int, list[int]]:
        """This process's micro-batch, and every process's share of each global batch."""
        if args.adaptive_batch:  # dlsub's split: equal shares of accumulation_steps micro-batches each
            micro = run.micro_batch_size or args.micro_batch
            return micro, [micro * run.accumulation_steps] * world
        return args.micro_batch, [batch // world + (1 if r < batch % world else 0) for r in range(world)]

    micro, share = shares()
    offset = sum(share[:rank])

    def regrouped(change: checkpointing.Change) -> None:
        """The group re-formed in process (a member left or joined): the same model, wrapped for the new group, and this
        process's share of the same global batch (the data's position is the samples seen, unchanged)."""
        nonlocal model, world, rank, micro, share, offset
        world, rank = run.world_size, run.rank
        model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
        micro, share = shares()
        offset = sum(share[:rank])
        if rank == 0:
            print(f"re-formed in process at step {step}: world size {world} "
                  f"(the re-formation took {change.paused_s:.2f} s)", flush=True)

    if args.regroup_in_process and distributed and not args.adaptive_batch:
        run.regroup_in_process(snapshot, on_change=regrouped)
    noise = GradientNoise(args.batch_size) if args.adaptive_batch else None
    started = time.time()
    loss: torch.Tensor | None = None
    while epoch < args.epochs:
        # Same shuffle for an epoch on every attempt: resuming mid-epoch skips exactly the samples done.
        order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        model.train()
        while sample_in_epoch + batch <= len(train_y):
            mine = order[sample_in_epoch + offset:sample_in_epoch + offset + share[rank]]
            # This step reports (the same test as after it): measure the gradient noise it will report.
            reporting = (step + 1) % args.report_every == 0 or sample_in_epoch + 2 * batch > len(train_y)
            if noise is not None:
                if reporting:
                    noise.measure(net, train_x[mine], train_y[mine])
                for group in optimizer.param_groups:
                    group["lr"] = args.lr * noise.gain(batch)
            optimizer.zero_grad()
            chunks = mine.split(max(1, micro))
            for i, idx in enumerate(chunks):
                # Sum of per-sample losses over the global batch; DDP averages gradients over the
                # processes, so scale by world / batch to get the mean over the global batch.
                loss_sum = F.cross_entropy(model(train_x[idx]), train_y[idx], reduction="sum")
                last = i == len(chunks) - 1
                if world > 1 and not last:
                    with model.no_sync():
                        (loss_sum * world / batch).backward()
                else:
                    (loss_sum * world / batch).backward()
            loss = loss_sum / max(len(chunks[-1]), 1)
            optimizer.step()
            step += 1
            sample_in_epoch += batch
            seen += batch
            pause = step_pause(args, share[rank], world, per_node)
            if pause:
                time.sleep(pause * slowdown(args))
            if step % args.report_every == 0 or sample_in_epoch + batch > len(train_y):
                grads = {"grad_sqr": noise.sqr, "grad_var": noise.var} if noise is not None else {}
                run.report(step=step, epoch=epoch, loss=loss.item(), samples=seen, world_size=world, **grads)
            if run.should_stop():
                run.save(snapshot(), step=step)
                if rank == 0:
                    print(f"stop requested ({run.stop_reason}): checkpointed at step {step}", flush=True)
                run.exit_for_resume()
            if run.should_finish():  # the loss reached `dlsub submit --target-loss` / init(target_loss=)
                break
        if run.should_finish():
            if rank == 0:
                print(f"target loss {run.target_loss} reached at step {step}", flush=True)
            break
        epoch += 1
        sample_in_epoch = 0
        run.save(snapshot(), step=step)

    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    # Resumed from a checkpoint at its last step, it trained no step in this attempt: no loss to report.
    run.report(step=step, epoch=epoch, loss=loss.item() if loss is not None else None, samples=seen,
               test_accuracy=accuracy)
    run.finish()
    if rank == 0:
        print(f"done: {step} steps in {time.time() - started:.1f} s this attempt, test accuracy {accuracy:.3f}",
              flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
