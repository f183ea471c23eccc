"""How long one scheduling decision takes, and how long a full workload replay takes.

    python benchmarks/policy_speed.py [--jobs 1000] [--nodes 256] [--repeats 5]

Decision: 1,000 jobs drawn (seeded) from the Pollux applications at random
epochs and progress, on 256 nodes x 4 GPUs, half of them already running.
Prints the first (cold: every job's goodput curve computed from the traces)
and the following (warm: curves cached, as in the live agent, whose jobs
change epoch rarely) decision times, median of --repeats.
Replay: workload-6 (1.0x, 160 jobs) for each policy, wall seconds.

Heterogeneous (``--hetero-gpus``; the issue's run: ``--hetero-gpus 10000
--hetero-jobs 5000``; default 0, skipped, to keep the default run short): that many
GPUs of Sia's three types (aws 4-GPU nodes, dgx-ext and rtx 8-GPU nodes, in
the proportions of its 64-GPU cluster) and ``--hetero-jobs`` jobs (5,000)
of Sia's applications with their true model on every type, from
``--sia-data`` (../shared/data/sia). One cold decision at ``--hetero-now``
seconds (default 0: the jobs arrived at 0, 1, 2, ... s) and one warm a minute
later, for each of ``--hetero-policies`` (sia, goodput: both choose type and
size), after one uncounted decision of each that warms the simulator's
interpolation in the traces (cached per application for the process, each
policy asking about placements of its own; each policy's own goodputs stay
cold, their caches cleared, the batch searches' step times included). At 10,000 GPUs x 5,000 jobs, on a shared 2-core
machine (three runs): sia 0.74-0.83 s cold, 0.39-0.45 s warm; goodput
0.77-0.86 s cold, 0.31-0.38 s warm (busier, up to 0.96 and 1.6 s cold); at
8600 s, 0.77 / 0.40 and 0.74 / 0.75. Before the Lagrangian solver, same
script and load: sia 3.5-4.0 s / 2.2-2.4 s, goodput 6.8-7.3 s / 1.7-1.9 s.
Their typed program (114,000-139,000 (job, type, GPUs)
columns) is solved as its linear relaxation through the dual over one price
a GPU type (``dlsub.policies.sia.relaxation_optimum``: 0.1-0.3 s, HiGHS's
optimum to 1e-14 where HiGHS took 2-9 s); the rest is each job's goodput at
every configuration (cold: every model evaluated afresh) and the placement.
pollux (name it in --hetero-policies; not in the default list, to keep the run
short) sees one pool of GPUs. Its choice of GPU counts, an exact knapsack (jobs x
GPUs x widest job: 3.3e9 cells here, 2.2-3.7 s), is solved above 1e8 cells
through its relaxation, a price a GPU (``minimise_relaxed``): the script prints
both, timed, with their total costs (here equal to six figures, 14-26 ms). Same
machine, helpers' simulations paused: at 8600 s (every job an hour old or
more) pollux 0.48 s cold, 0.14 s warm (sia 0.70 / 0.72, goodput 0.65 / 0.63);
at 0 s, where every job is younger than a restart and Pollux's restart factor
makes any allocation worth nothing, 0.52 / 0.27 s, placing none (its fill of
idle GPUs asked every node for every job then: 259 s a decision; now once a
GPU count). Before these changes, at 8600 s: 4.0 s cold, 2.8 s warm.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

from dlsub.policies.api import ClusterView, JobView, Node, PolicyError
from dlsub.policies.pollux import EXACT_CELLS, PolluxPolicy, minimise, minimise_relaxed
from dlsub.policies.registry import get_policy
from dlsub.sim.apps import load_application
from dlsub.sim.engine import simulate
from dlsub.sim.performance import AppPerformance, performance_at, search_grid
from dlsub.sim.workload import POLLUX_DIR, read_workload

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


def synthetic_jobs(count: int, seed: int) -> list[JobView]:
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        app = load_application(POLLUX_DIR / "traces" / rng.choice(APPS))
        epoch = rng.randrange(app.epochs)
        hi = 1 if app.name == "ncf" else min(64, app.max_batch_size // app.min_local_bsz)
        jobs.append(
            JobView(
                name=f"job-{i}",
                arrival_s=float(i),
                gpus=1,
                min_gpus=1,
                max_gpus=hi,
                batch_size=app.init_batch_size,
                adaptive_batch=app.name != "ncf",
                attained_gpu_s=rng.uniform(0, 3600 * 20),
                remaining=app.total_progress - app.progress_at(epoch),
                model=performance_at(app, epoch),
            )
        )
    return jobs


SIA_TYPES = (("aws", 4, 24), ("dgx-ext", 8, 16), ("rtx", 8, 24))  # type, GPUs a node, GPUs of 64


def typed_cluster(total_gpus: int) -> ClusterView:
    """About ``total_gpus`` GPUs of Sia's three types, in the proportions of its 64-GPU cluster."""
    nodes = []
    for gpu_type, per_node, share in SIA_TYPES:
        count = max(1, round(total_gpus * share / 64 / per_node))
        nodes.extend(Node(f"{gpu_type}{i:05d}", per_node, gpu_type=gpu_type) for i in range(count))
    return ClusterView(tuple(nodes))


def typed_jobs(count: int, seed: int, traces: Path) -> list[JobView]:
    """Jobs of Sia's applications at random epochs, each with its true model on every type."""
    rng = random.Random(seed)
    types = [t for t, _, _ in SIA_TYPES]
    jobs = []
    for i in range(count):
        name = rng.choice(APPS)
        apps = {t: load_application(traces / name, t) for t in types}
        app = apps[types[0]]
        epoch = rng.randrange(app.epochs)
        hi = 1 if name == "ncf" else min(64, app.max_batch_size // app.min_local_bsz)
        models = {t: performance_at(a, epoch) for t, a in apps.items()}
        jobs.append(JobView(name=f"job-{i}", arrival_s=float(i), gpus=1, min_gpus=1, max_gpus=hi,
                            batch_size=app.init_batch_size, adaptive_batch=name != "ncf",
                            attained_gpu_s=rng.uniform(0, 3600 * 20),
                            remaining=app.total_progress - app.progress_at(epoch),
                            model=models[types[0]], type_models=models,
                            type_rates={t: a.one_gpu_throughput for t, a in apps.items()}))
    return jobs


def time_typed(policy_name: str, jobs: list[JobView], cluster: ClusterView, now: float = 0.0) -> tuple[float, float]:
    """One cold decision at ``now`` and one warm a minute later (half the jobs keep what the first gave
    them)."""
    policy = get_policy(policy_name)
    performance_at.cache_clear()  # cold: every model's goodput curves computed afresh, whoever ran before
    search_grid.cache_clear()  # and the step times of each batch search, shared by an application's epochs

    def fresh(model: object) -> AppPerformance:
        assert isinstance(model, AppPerformance)
        return performance_at(model.app, model.epoch)

    jobs = [replace(job, model=fresh(job.model), type_models={t: fresh(m) for t, m in (job.type_models or {}).items()})
            for job in jobs]
    start = time.perf_counter()
    first = policy.decide(jobs, cluster, now, {})
    cold = time.perf_counter() - start
    previous = dict(list(first.items())[: len(first) // 2])
    start = time.perf_counter()
    policy.decide(jobs, cluster, now + 60.0, previous)
    return cold, time.perf_counter() - start


def time_decisions(policy_name: str, jobs: list[JobView], cluster: ClusterView, repeats: int) -> tuple[float, float]:
    policy = get_policy(policy_name)
    performance_at.cache_clear()
    search_grid.cache_clear()
    jobs = [JobView(**{**job.__dict__, "model": performance_at(job.model.app, job.model.epoch)}) for job in jobs]
    start = time.perf_counter()
    first = policy.decide(jobs, cluster, 0.0, {})
    cold = time.perf_counter() - start
    # Half the jobs keep running where the first decision put them.
    previous = dict(list(first.items())[: len(first) // 2])
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.decide(jobs, cluster, 60.0, previous)
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="goodput,optimus,tiresias,efifo,gang,fifo,rr")
    parser.add_argument("--replay", default=str(POLLUX_DIR / "workloads" / "workload-6.csv"))
    parser.add_argument("--hetero-gpus", type=int, default=0)
    parser.add_argument("--hetero-jobs", type=int, default=5000)
    parser.add_argument("--hetero-policies", default="sia,goodput")
    parser.add_argument("--hetero-now", type=float, default=0.0)
    parser.add_argument("--sia-data", type=Path, default=Path.cwd().parent / "shared/data/sia")
    args = parser.parse_args()
    cluster = ClusterView.uniform(args.nodes, 4)
    jobs = synthetic_jobs(args.jobs, args.seed)
    print(f"one decision, {args.jobs} jobs on {args.nodes} nodes x 4 GPUs (median of {args.repeats} warm):")
    for name in args.policies.split(","):
        cold, warm = time_decisions(name, jobs, cluster, args.repeats)
        print(f"  {name:>9}: cold {cold * 1000:8.1f} ms   warm {warm * 1000:8.1f} ms")
    workload = read_workload(Path(args.replay))
    print(f"full replay of {Path(args.replay).name} ({len(workload)} jobs, 16 x 4 GPUs):")
    for name in args.policies.split(","):
        start = time.perf_counter()
        result = simulate(workload, POLLUX_DIR / "traces", get_policy(name), ClusterView.uniform(16, 4))
        wall = time.perf_counter() - start
        print(f"  {name:>9}: {wall:6.2f} s wall, avg JCT {result.summary()['avg_jct_s']} s")
    if args.hetero_gpus > 0:
        typed = typed_cluster(args.hetero_gpus)
        kinds = ", ".join(f"{t} {sum(n.gpus for n in typed.nodes if n.gpu_type == t)}" for t in typed.gpu_types())
        many = typed_jobs(args.hetero_jobs, args.seed, args.sia_data / "traces")
        print(f"one decision, {len(many)} jobs on {typed.total_gpus} GPUs of several types ({kinds}), "
              f"at {args.hetero_now:g} s:")
        names = args.hetero_policies.split(",")
        # The simulator's own lookups in the traces (an interpolation of measured step times, cached per
        # application for the process) stand in for a live job's fitted model; whichever policy ran first
        # paid them. One decision of each policy, not counted, pays them for all (each asks about
        # placements of its own); each policy's goodputs stay cold.
        start = time.perf_counter()
        for name in names:
            try:
                time_typed(name, many, typed, args.hetero_now)
            except PolicyError:
                pass
        print(f"  (the traces' interpolation warmed by one uncounted decision of each: "
              f"{time.perf_counter() - start:.1f} s)", flush=True)
        for name in names:
            try:
                cold, warm = time_typed(name, many, typed, args.hetero_now)
            except PolicyError as exc:
                print(f"  {name:>9}: {exc}", flush=True)
                continue
            verdict = "under" if max(cold, warm) < 1.0 else "OVER"
            print(f"  {name:>9}: cold {cold * 1000:8.1f} ms   warm {warm * 1000:8.1f} ms   ({verdict} 1 s)", flush=True)
        if "pollux" in names:
            print_knapsack_gap(many, typed, args.hetero_now)


def print_knapsack_gap(jobs: list[JobView], cluster: ClusterView, now: float) -> None:
    """pollux's choice of GPU counts at this size, exact (the table) and relaxed (a price a GPU, which
    its decision uses above EXACT_CELLS): time and total cost of each."""
    problem = PolluxPolicy().count_problem(jobs, cluster, now, {})
    cells = len(problem.costs) * (problem.capacity + 1) * max(len(cost) for cost in problem.costs)
    found = {}
    for label, solve in (("exact", minimise), ("relaxed", minimise_relaxed)):
        start = time.perf_counter()
        counts = solve(problem.costs, problem.capacity)
        seconds = time.perf_counter() - start
        total = float(sum(cost[n] for cost, n in zip(problem.costs, counts, strict=True)))
        found[label] = total
        print(f"  pollux's counts {label:>7}: {seconds * 1000:8.1f} ms, total cost {total:.6g}, "
              f"{sum(counts)} of {problem.capacity} GPUs", flush=True)
    print(f"  relaxed / exact total cost: {found['relaxed'] / found['exact']:.6f} "
          f"({cells:.2g} cells; exact up to {EXACT_CELLS:.0e})", flush=True)


if __name__ == "__main__":
    main()
