"""The simulator in Sia's heterogeneous setting against Sia's Table 3 (SOSP '23).

    nice -n 19 python benchmarks/sia_fidelity.py [--data ../shared/data/sia] [--policies sia,pollux]
        [--workloads 1,2,3,4,5,6,7,8] [--information online]

For each Philly workload (``DATA/workloads-philly/workload-N.csv``) on the
paper's cluster (aws 6x4, dgx-ext 2x8, rtx 3x8:
``sim/scenarios/sia-cluster.toml``) with Sia's calibration: each
policy's average and p99 JCT, makespan and GPU-hours per job, then the
mean over the workloads with a 95% interval (Student's t over the
workloads) and the p99 JCT over all their jobs (as the artifact's
``print_run_stats.py`` computes Table 3's) next to the paper's mean (Sia 0.6 h, Pollux heterogeneity-
unaware 1.0 h). ``pollux`` sees one pool of GPUs; ``sia`` is told each
job's model per GPU type; ``goodput`` too, and each job's one-GPU profile
of every type, charged to the job (policies/goodput_types.py; its figures
over arrival orders on the untouched half: benchmarks/goodput_vs_sia.py). When
``goodput`` runs beside ``sia``, the ratio goodput/sia per workload and
its interval follow.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scipy import stats

from dlsub.policies.registry import get_policy
from dlsub.sim.cluster_file import load_cluster
from dlsub.sim.engine import SimConfig, simulate
from dlsub.sim.workload import SCENARIOS_DIR, read_workload

# Table 3, Philly traces, heterogeneous setting: mean average JCT over the traces (hours).
PUBLISHED_AVG_JCT_H = {"sia": 0.6, "pollux": 1.0}
PUBLISHED_P99_JCT_H = {"sia": 9.5, "pollux": 14.9}
PUBLISHED_GPU_H_PER_JOB = {"sia": 4.0, "pollux": 5.6}


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% interval (Student's t)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def pooled_p99(jcts: list[float]) -> float:
    """The p99 JCT as Sia's artifact reports it (``utils/print_run_stats.py``): the JCTs of every job of
    every workload sorted, the one at index ``int(0.99 * N)``."""
    ordered = sorted(jcts)
    return ordered[int(0.99 * len(ordered))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path.cwd().parent / "shared/data/sia")
    parser.add_argument("--policies", default="sia,pollux")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--cluster", type=Path, default=SCENARIOS_DIR / "sia-cluster.toml")
    parser.add_argument("--information", default="online", choices=["online", "oracle"])
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    config = SimConfig(information=args.information, calibration="sia")
    numbers = [int(w) for w in args.workloads.split(",")]
    avg: dict[str, dict[int, float]] = {}
    for name in args.policies.split(","):
        print(f"\n{name} ({args.information}) on {args.cluster.name}; hours")
        print(f"{'workload':>9} {'avg JCT':>8} {'p99 JCT':>8} {'makespan':>9} {'GPU h/job':>10} {'restarts':>9} "
              f"{'wall':>6}")
        avg[name] = {}
        p99s, spans, gpu_hs = [], [], []
        every: list[float] = []  # every job's JCT, all workloads
        for w in numbers:
            jobs = read_workload(args.data / "workloads-philly" / f"workload-{w}.csv")
            start = time.perf_counter()
            result = simulate(jobs, args.data / "traces", get_policy(name), cluster, config)
            wall = time.perf_counter() - start
            s = result.summary()
            every.extend(j.jct_s for j in result.jobs if j.jct_s is not None)
            hours = [float(s[k]) / 3600 if s[k] is not None else float("nan")  # type: ignore[arg-type]
                     for k in ("avg_jct_s", "p99_jct_s", "makespan_s")]
            avg[name][w] = hours[0]
            p99s.append(hours[1])
            spans.append(hours[2])
            gpu_hs.append(float(s["gpu_h_per_job"]))  # type: ignore[arg-type]
            stalled = "  STALLED" if s["stalled"] else ""
            print(f"{w:>9} {hours[0]:>8.3f} {hours[1]:>8.2f} {hours[2]:>9.2f} {gpu_hs[-1]:>10.2f} "
                  f"{s['restarts']:>9} {wall:>5.0f}s{stalled}", flush=True)
        mean, lo, hi = interval(list(avg[name].values()))
        line = f"{'mean':>9} {mean:>8.3f} {statistics.fmean(p99s):>8.2f} {statistics.fmean(spans):>9.2f} " \
               f"{statistics.fmean(gpu_hs):>10.2f}   95% interval of avg JCT [{lo:.3f}, {hi:.3f}]"
        print(line)
        print(f"{'':>9} p99 JCT over all {len(every)} jobs (the artifact's print_run_stats): "
              f"{pooled_p99(every) / 3600:.2f}")
        if name in PUBLISHED_AVG_JCT_H:
            paper = PUBLISHED_AVG_JCT_H[name]
            print(f"{'paper':>9} {paper:>8.3f} {PUBLISHED_P99_JCT_H[name]:>8.2f} {'':>9} "
                  f"{PUBLISHED_GPU_H_PER_JOB[name]:>10.2f}   ours/paper {mean / paper:.3f} "
                  f"({'within' if abs(mean / paper - 1) <= 0.10 else 'outside'} 10%)")
    for a, b in (("goodput", "sia"), ("goodput", "pollux"), ("pollux", "sia")):
        if a in avg and b in avg:
            ratios = [avg[a][w] / avg[b][w] for w in numbers]
            mean, lo, hi = interval(ratios)
            print(f"\n{a}/{b} avg JCT per workload: " + " ".join(f"{r:.3f}" for r in ratios)
                  + f"\n  mean {mean:.3f}, 95% interval [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()
