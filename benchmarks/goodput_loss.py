"""Where goodput loses to pollux on one workload: per application, from the simulator's own records.

    python benchmarks/goodput_loss.py --load 2.0 --seed 1 [--stated-missing 1] [--stated-error 2]
        [--variant K=V,...] [--jitter 0] [--artifact 0.5|1.0 --workload K]

Runs pollux and goodput (online, no history) on the generated workload of
that load and seed (``dlsub generate-workload``), recording each policy's
every decision: the GPUs and batch size each job was given, and what the
job's model (fitted online from its own reports) predicted its goodput
there, against the traces' true goodput. Printed per application, for
each policy: jobs, average JCT, waiting before the first start, GPU-hours,
restarts, the mean GPUs and batch size while running, the median of
predicted / true goodput, the mean of the true goodput at the batch size
given over the true goodput at the best batch size on the same GPUs
(batch/best: what the batch choice alone lost), and each application's
share of the difference in average JCT (goodput minus pollux, seconds
over all jobs). ``--artifact LOAD --workload K`` reads the Pollux artifact's
workload-K of that load instead (0.5x and 1.0x only: its other loads are the
acceptance set); ``--seed`` is then the arrival order.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from goodput_vs_pollux import PHILLY, Source, policy_of

from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs, Policy
from dlsub.sim.apps import Application, load_application
from dlsub.sim.engine import SimConfig, SimResult, simulate
from dlsub.sim.generate import Statements, generate, read_philly
from dlsub.sim.published import LOAD_DIRS
from dlsub.sim.workload import POLLUX_DIR


@dataclass
class Seen:
    """What one job was given and predicted, interval by interval, while it held GPUs."""

    gpus: list[int] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # predicted / true goodput
    # true goodput at the batch given over the true goodput at the best batch on the same placement
    batch_share: list[float] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # nodes the job's GPUs were on
    # true goodput over GPUs x the best true goodput on one GPU: what each GPU gave, as a share of one alone
    per_gpu: list[float] = field(default_factory=list)


class Recorder:
    """A policy that decides as ``inner`` does and keeps what each job was given."""

    def __init__(self, inner: Policy, apps: dict[str, Application]) -> None:
        self.inner, self.apps = inner, apps
        self.name = inner.name
        for attr in ("elastic", "adapts_batch", "learns_online", "times_compute", "holds_partial"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))
        self.seen: dict[str, Seen] = defaultdict(Seen)

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        decision = self.inner.decide(jobs, cluster, now, previous)
        for job in jobs:
            alloc = decision.get(job.name)
            if alloc is None or alloc.gpus == 0 or job.model is None:
                continue
            app = self.apps[job.name]
            batch = alloc.batch_size or job.batch_size or app.init_batch_size
            epoch = bisect.bisect_right(list(app.epoch_end), job.progress)
            true = app.goodput(alloc.placement, app.batch_config(alloc.gpus, batch), epoch)
            seen = self.seen[job.name]
            seen.gpus.append(alloc.gpus)
            seen.batches.append(batch)
            seen.nodes.append(len(alloc.placement))
            if true > 0:
                seen.accuracy.append(job.model.goodput(alloc.placement, batch) / true)
                seen.batch_share.append(true / best_true(app, alloc.placement, alloc.gpus, epoch, batch))
                one = best_true(app, (1,), 1, epoch, app.init_batch_size)
                seen.per_gpu.append(true / (alloc.gpus * one) if one > 0 else 0.0)
        return decision


def best_true(app: Application, placement: tuple[int, ...], gpus: int, epoch: int, given: int) -> float:
    """The traces' best goodput on ``placement`` over batch sizes from the application's smallest to its
    largest (60 steps, log-spaced) and ``given``."""
    lo = max(app.init_batch_size, gpus * app.min_local_bsz)
    candidates = {given, *(int(b) for b in np.geomspace(min(lo, app.max_batch_size), app.max_batch_size, 60))}
    return max(app.goodput(placement, app.batch_config(gpus, b), epoch) for b in candidates)


def table(results: dict[str, tuple[SimResult, Recorder]]) -> None:
    names = list(results)
    rows = {name: {job.name: job for job in result.jobs} for name, (result, _) in results.items()}
    apps = sorted({job.application for job in results[names[0]][0].jobs})
    total = len(results[names[0]][0].jobs)
    print(f"{'application':12} {'policy':8} {'jobs':>4} {'avg JCT':>8} {'wait':>6} {'GPU-h':>6} {'restarts':>8} "
          f"{'GPUs':>5} {'nodes':>5} {'batch':>6} {'pred/true':>9} {'batch/best':>10} {'per GPU':>7}")
    for app in apps:
        for name in names:
            jobs = [job for job in rows[name].values() if job.application == app]
            seen = [results[name][1].seen[job.name] for job in jobs]
            gpus = [g for s in seen for g in s.gpus]
            batches = [b for s in seen for b in s.batches]
            acc = [a for s in seen for a in s.accuracy]
            share = [a for s in seen for a in s.batch_share]
            nodes = [n for s in seen for n in s.nodes]
            per_gpu = [a for s in seen for a in s.per_gpu]
            print(f"{app:12} {name:8} {len(jobs):4d} {statistics.mean(j.jct_s or 0.0 for j in jobs):8.0f} "
                  f"{statistics.mean((j.start_s or 0.0) - j.arrival_s for j in jobs):6.0f} "
                  f"{statistics.mean(j.gpu_s for j in jobs) / 3600:6.2f} "
                  f"{statistics.mean(j.restarts for j in jobs):8.1f} {statistics.mean(gpus or [0]):5.1f} "
                  f"{statistics.mean(nodes or [0]):5.2f} "
                  f"{statistics.mean(batches or [0]):6.0f} {statistics.median(acc or [0.0]):9.2f} "
                  f"{statistics.mean(share or [0.0]):10.2f} {statistics.mean(per_gpu or [0.0]):7.2f}")
        if len(names) == 2:
            diff = sum((rows[names[1]][n].jct_s or 0.0) - (rows[names[0]][n].jct_s or 0.0)
                       for n, job in rows[names[0]].items() if job.application == app) / total
            print(f"{'':12} {names[1]} - {names[0]}: {diff:+.0f} s of the average JCT")
    for name in names:
        print(f"{name}: {results[name][0].summary()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--philly", type=Path, default=PHILLY)
    parser.add_argument("--stated-missing", type=float, default=1.0)
    parser.add_argument("--stated-error", type=float, default=2.0)
    parser.add_argument("--variant", default="", help="goodput's constructor arguments, K=V,...")
    parser.add_argument("--artifact", choices=sorted(LOAD_DIRS), default=None,
                        help="the Pollux artifact's workloads of this load, not a generated one")
    parser.add_argument("--workload", type=int, default=1, help="with --artifact: workload-K.csv")
    args = parser.parse_args()
    if args.artifact is not None:
        jobs = Source().workload(args.artifact, args.workload)
    else:
        jobs = generate(read_philly(args.philly), args.load, args.seed,
                        Statements(args.stated_missing, args.stated_error))
    traces = POLLUX_DIR / "traces"
    apps = {job.name: load_application(traces / job.application) for job in jobs}
    config = SimConfig(seed=args.seed, arrival_jitter_s=args.jitter, information="online")
    results = {}
    for label in ("pollux", f"goodput:{args.variant}" if args.variant else "goodput"):
        recorder = Recorder(policy_of(label), apps)
        result = simulate(jobs, traces, recorder, ClusterView.uniform(16, 4), config)  # type: ignore[arg-type]
        results[label.split(":")[0]] = (result, recorder)
    if args.artifact is not None:
        print(f"artifact {args.artifact}x workload {args.workload}, order {args.seed}, jitter {args.jitter:g} s")
    else:
        print(f"load {args.load:g}, seed {args.seed}, stated missing {args.stated_missing:g}, "
              f"error x{args.stated_error:g}, jitter {args.jitter:g} s")
    table(results)


if __name__ == "__main__":
    main()
