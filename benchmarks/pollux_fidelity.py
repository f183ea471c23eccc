"""The simulator against the Pollux paper's published average JCTs.

    python benchmarks/pollux_fidelity.py [--loads 1.0,0.5] [--policies tiresias,optimus,goodput,pollux]

For each load and workload: our average JCT for each policy next to the
published figure of the same policy (goodput and pollux are set against
Pollux), and the ratio. tiresias and optimus run as the paper's TunedJobs
baselines; pollux and goodput learn online, without history across jobs (as
in Pollux's own simulator).
"""

from __future__ import annotations

import argparse
import time

from dlsub.policies.api import ClusterView
from dlsub.policies.registry import get_policy
from dlsub.sim.engine import simulate
from dlsub.sim.published import LOAD_DIRS, PUBLISHED_AVG_JCT_S
from dlsub.sim.workload import POLLUX_DIR, read_workload

COMPARED_WITH = {"tiresias": "tiresias", "optimus": "optimus", "goodput": "pollux", "pollux": "pollux"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default="1.0,0.5")
    parser.add_argument("--policies", default="tiresias,optimus,pollux,goodput")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    args = parser.parse_args()
    cluster = ClusterView.uniform(16, 4)
    for load in args.loads.split(","):
        for name in args.policies.split(","):
            published = PUBLISHED_AVG_JCT_S[load][COMPARED_WITH[name]]
            print(f"\n{name} at {load}x load vs published {COMPARED_WITH[name]} (avg JCT, s)")
            print(f"{'workload':>10} {'ours':>9} {'published':>10} {'ratio':>7} "
                  f"{'restarts':>9} {'util':>6} {'wall':>6}")
            ratios = []
            for w in (int(x) for x in args.workloads.split(",")):
                jobs = read_workload(POLLUX_DIR / LOAD_DIRS[load] / f"workload-{w}.csv")
                start = time.perf_counter()
                result = simulate(jobs, POLLUX_DIR / "traces", get_policy(name), cluster)
                wall = time.perf_counter() - start
                s = result.summary()
                ratio = s["avg_jct_s"] / published[w - 1]  # type: ignore[operator]
                ratios.append(ratio)
                print(f"{w:>10} {s['avg_jct_s']:>9} {published[w - 1]:>10} {ratio:>7.3f} {s['restarts']:>9} "
                      f"{s['gpu_utilization']:>6.2f} {wall:>5.1f}s")
            print(f"{'mean':>10} {'':>9} {'':>10} {sum(ratios) / len(ratios):>7.3f}   "
                  f"(worst {max(ratios, key=lambda r: abs(r - 1)):.3f})")


if __name__ == "__main__":
    main()
