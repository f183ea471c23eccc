"""goodput on what jobs report (online) against the oracle and the published Pollux figures.

    python benchmarks/goodput_online.py [--loads 1.0,0.5] [--workloads 1,...,8] [--skip-sim] [--skip-decision]

Simulation: for each load and workload, goodput's average JCT in online
mode (the default: fitted from each job's reports, no remaining work) and
in oracle mode, each against the published Pollux average JCT; the mean
ratio per load is the floor to hold (online no worse than Pollux, <= 1).

Decision: one goodput decision for --jobs jobs on --nodes 4-GPU nodes,
each job's model fitted (throughput_fit) from reports taken from the
Pollux traces at the sizes it has run (1 to 16 GPUs, seeded), with
gradient noise from a random epoch. Prints the fitting time per job and
the cold (first) and warm (median of --repeats) decision times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from dlsub.policies.api import ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import BatchLimits, FittedPerformance, GradientStats
from dlsub.policies.perf_models.throughput_fit import StepReport, fit
from dlsub.policies.placement import packed_placement
from dlsub.policies.registry import get_policy
from dlsub.sim.apps import Application, load_application
from dlsub.sim.engine import SimConfig, simulate
from dlsub.sim.published import LOAD_DIRS, PUBLISHED_AVG_JCT_S
from dlsub.sim.workload import POLLUX_DIR, read_workload

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


def simulations(loads: list[str], workloads: list[int]) -> None:
    cluster = ClusterView.uniform(16, 4)
    for load in loads:
        published = PUBLISHED_AVG_JCT_S[load]["pollux"]
        print(f"\ngoodput at {load}x load vs published Pollux (avg JCT, s; ratio < 1 beats Pollux)")
        print(f"{'workload':>9} {'pollux':>7} {'online':>8} {'ratio':>6} {'oracle':>8} {'ratio':>6} "
              f"{'restarts on/or':>15} {'wall on/or':>11}")
        ratios: dict[str, list[float]] = {"online": [], "oracle": []}
        for w in workloads:
            jobs = read_workload(POLLUX_DIR / LOAD_DIRS[load] / f"workload-{w}.csv")
            row = {}
            for mode in ("online", "oracle"):
                result = simulate(jobs, POLLUX_DIR / "traces", get_policy("goodput"), cluster,
                                  SimConfig(information=mode))
                row[mode] = result.summary()
                ratios[mode].append(row[mode]["avg_jct_s"] / published[w - 1])  # type: ignore[operator]
            on, orc = row["online"], row["oracle"]
            print(f"{w:>9} {published[w - 1]:>7} {on['avg_jct_s']:>8} {ratios['online'][-1]:>6.3f} "
                  f"{orc['avg_jct_s']:>8} {ratios['oracle'][-1]:>6.3f} "
                  f"{on['restarts']:>7}/{orc['restarts']:<7} {on['wall_s']:>5.0f}/{orc['wall_s']:<5.0f}")
        print(f"{'mean':>9} {'':>7} {'':>8} {statistics.mean(ratios['online']):>6.3f} {'':>8} "
              f"{statistics.mean(ratios['oracle']):>6.3f}")


def reports_from_traces(app: Application, sizes: list[int]) -> tuple[list[StepReport], int]:
    """What a job of ``app`` reports after running at each of ``sizes`` GPUs (packed on 4-GPU nodes),
    at its initial batch and four times that; and the batch it ran last."""
    out = []
    batch = app.init_batch_size
    for gpus in sizes:
        placement = packed_placement(gpus, 4)
        for batch in (app.init_batch_size, min(app.max_batch_size, 4 * app.init_batch_size)):
            config = app.batch_config(gpus, batch)
            step = app.step_time(placement, config)
            micro, sync = app.step_sync(placement, config.atomic)
            out.append(StepReport(len(placement), gpus, config.atomic, config.accum_steps, step,
                                  (micro - sync) if config.accum_steps else None))
    return out, batch


def fitted_jobs(count: int, seed: int) -> tuple[list[JobView], float]:
    rng = random.Random(seed)
    jobs = []
    fit_s = 0.0
    for i in range(count):
        app = load_application(POLLUX_DIR / "traces" / rng.choice(APPS))
        epoch = rng.randrange(app.epochs)
        sizes = sorted({1} | set(rng.sample([2, 4, 8, 16], rng.randrange(0, 4))))
        reports, batch = reports_from_traces(app, sizes)
        start = time.perf_counter()
        fitted = fit(reports)
        fit_s += time.perf_counter() - start
        sqr, var = app.grad_stats(batch, epoch)
        limits = BatchLimits(app.init_batch_size, app.max_batch_size, app.min_local_bsz, app.max_local_bsz)
        hi = 1 if app.name == "ncf" else min(64, app.max_batch_size // app.min_local_bsz)
        jobs.append(JobView(
            name=f"job-{i}", arrival_s=float(i), gpus=1, min_gpus=1, max_gpus=hi,
            batch_size=app.init_batch_size, adaptive_batch=app.name != "ncf",
            attained_gpu_s=rng.uniform(0, 3600 * 20), progress=app.progress_at(epoch),
            model=FittedPerformance(fitted, limits, GradientStats(sqr, var)),
        ))
    return jobs, fit_s / count


def decision(count: int, nodes: int, repeats: int, seed: int) -> None:
    jobs, fit_per_job = fitted_jobs(count, seed)
    cluster = ClusterView.uniform(nodes, 4)
    policy = GoodputPolicy()
    start = time.perf_counter()
    first = policy.decide(jobs, cluster, 0.0, {})
    cold = time.perf_counter() - start
    previous = dict(list(first.items())[: len(first) // 2])
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.decide(jobs, cluster, 60.0, previous)
        warm.append(time.perf_counter() - start)
    print(f"\none goodput decision, {count} jobs with fitted models on {nodes} nodes x 4 GPUs:")
    print(f"  fit: {fit_per_job * 1000:.1f} ms per job (once per new report, not per decision)")
    print(f"  decision: cold {cold * 1000:.1f} ms, warm {statistics.median(warm) * 1000:.1f} ms "
          f"(median of {repeats}); {sum(a.gpus for a in first.values())} GPUs to {len(first)} jobs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default="1.0,0.5")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--skip-decision", action="store_true")
    args = parser.parse_args()
    if not args.skip_decision:
        decision(args.jobs, args.nodes, args.repeats, args.seed)
    if not args.skip_sim:
        simulations(args.loads.split(","), [int(w) for w in args.workloads.split(",")])


if __name__ == "__main__":
    main()
