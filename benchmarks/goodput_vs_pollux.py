"""goodput against pollux in the same simulator, over seeded arrival orders.

    python benchmarks/goodput_vs_pollux.py [--loads 0.5,1.0] [--orders 5] [--jitter 120]
        [--workloads 1,2,3,4,5,6,7,8] [--history none,one-user] [--procs 2] [--raw FILE]
        [--variant K=V,...] [--paired] [--tuned-on 1-4|5-8]
        [--generated [--stated-missing 0.5] [--stated-error 2]] [--resize-costs restart,10,9.3/0.6,0]

For each load, each arrival order (seed 1..N: every arrival delayed by up
to --jitter seconds) and each workload, goodput and pollux run on the same
jobs, online (each job knows only what it reported). The ratio of their
average JCTs (goodput / pollux; below 1 goodput wins) is averaged over the
half's workloads for each order: workloads 1-4 (the half goodput's
constants were tuned on) and 5-8 (untouched), separately. Printed: the
mean over orders and its 95% interval (Student's t), and whether 1 lies
inside it (no difference shown). Then the same with goodput given history
across jobs (``--history one-user``: an assumption, the workload is one
user's and a command is an application and batch size; the Pollux
workloads state neither) and pollux left as Pollux ran (no history), and
the paired change history makes, with its interval.

Beside the average JCT, each policy's p99 JCT and GPU-hours per job, and
goodput/pollux of each, with the same intervals (``dlsub.sim.compare``);
the claim sentence names the JCT ratio and the GPU-hours ratio together
(issue 54: a lead bought with GPU-hours is no lead). Runs kept in --raw
before p99 JCT and GPU-hours were are run again.

pollux's own average JCT in these runs is printed beside Pollux's
published figure (1.0x and 0.5x, no jitter in the paper).

Only the artifact's 0.5x and 1.0x workloads: its other loads are the
acceptance set and are never run here. --generated runs workloads of our
own instead, at any load (``dlsub generate-workload``, written from the
Pollux paper's description, with users' stated lengths as the options
say): workload K is the generator's seed K, at each load. --raw FILE keeps every run's result
as a line of JSON; a run already in it is not run again (resume).

--variant K=V,... runs goodput with those constructor arguments (e.g.
``explore_batch=1.5``) in place of its defaults; with --paired, plain goodput
runs too and the paired change the variant makes is printed. --tuned-on 5-8
labels workloads 5-8 as the half a constant was chosen on and 1-4 as
untouched (the reverse split).

--resize-costs C,... (issue 52): what a resize in place costs in the
simulator (``SimConfig.resize_penalty_s``): ``restart`` (a resize costs a
restart, as every figure before issue 52 was run), seconds (10: dlsub's
resize through a checkpoint restart as measured on 30 Nov; 0: free resizes, a bound), or
``GROW/SHRINK`` seconds (``6/0.4``, the default and the simulator's: dlsub's grow and shrink in process
as measured on 3 Dec, priced apart, ``SimConfig.shrink_penalty_s``). Every
policy runs at each; each cost is reported as above (the policy alone: the
same cost for both), then, with ``restart`` and a measured cost among them,
the systems as systems: goodput at dlsub's resize (the first ``GROW/SHRINK``
entry, else the first cost other than ``restart`` and 0) against pollux at
``restart`` (Pollux restarts on
every change, the 30 s its simulator charged); and each policy's paired
change from ``restart`` to each other cost (what the cheaper resize alone
gives it). Rows of --raw kept before the option are ``restart`` rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dlsub.policies.api import ClusterView, Policy
from dlsub.policies.registry import get_policy
from dlsub.sim.compare import METRICS, Lookup, claim, figures, interval, per_order, table, verdict
from dlsub.sim.engine import RESTART_COST, SimConfig, dlsub_resize_cost, resize_cost_label, resize_penalties, simulate
from dlsub.sim.generate import Statements, TraceJob, generate, read_philly
from dlsub.sim.published import LOAD_DIRS, PUBLISHED_AVG_JCT_S
from dlsub.sim.workload import POLLUX_DIR, WorkloadJob, read_workload

HALVES = {"tuned (1-4)": (1, 2, 3, 4), "untouched (5-8)": (5, 6, 7, 8)}
REVERSED = {"tuned (5-8)": (5, 6, 7, 8), "untouched (1-4)": (1, 2, 3, 4)}
Task = tuple[str, int, int, str, str, str]  # load, workload, seed, policy, history, resize cost
RESTART = RESTART_COST  # --resize-costs: a resize costs a restart (SimConfig.resize_penalty_s None)
# Issue 54: goodput's average JCT at most this times pollux's, at no more GPU-hours per job.
CLAIM_GOAL = 0.90
PHILLY = Path(__file__).resolve().parents[1].parent / "shared/data/pollux/traces/philly.csv"


@dataclass(frozen=True)
class Source:
    """Where workload K of a load comes from: the artifact's files, or the generator's seed K."""

    trace: list[TraceJob] | None = None
    statements: Statements | None = None

    def workload(self, load: str, number: int) -> list[WorkloadJob]:
        if self.trace is None:
            return read_workload(POLLUX_DIR / LOAD_DIRS[load] / f"workload-{number}.csv")
        return generate(self.trace, float(load), number, self.statements)

    @property
    def label(self) -> str:
        if self.trace is None:
            return "artifact"
        told = self.statements or Statements(1.0, 1.0)
        return f"generated, stated missing {told.missing:g}, error x{told.error:g}"

    def label_for(self, policy: str) -> str:
        """pollux reads no stated length: its runs serve every statement setting of the same workloads."""
        return "generated" if policy == "pollux" and self.trace is not None else self.label


def resize_penalty(cost: str) -> float | None:
    """A --resize-costs entry as SimConfig.resize_penalty_s (a grow's, for ``GROW/SHRINK``)."""
    return resize_penalties(cost)[0]


def run(task: Task, jitter: float, source: Source) -> dict[str, object]:
    load, workload, seed, policy, history, resize = task
    jobs = source.workload(load, workload)
    grow_s, shrink_s = resize_penalties(resize)
    config = SimConfig(seed=seed, arrival_jitter_s=jitter, information="online", history=history,
                       resize_penalty_s=grow_s, shrink_penalty_s=shrink_s)
    summary = simulate(jobs, POLLUX_DIR / "traces", policy_of(policy), ClusterView.uniform(16, 4), config).summary()
    return {"load": load, "workload": workload, "seed": seed, "policy": policy, "history": history,
            "resize": resize, "jitter": jitter, "source": source.label_for(policy), "avg_jct_s": summary["avg_jct_s"],
            "p99_jct_s": summary["p99_jct_s"], "gpu_h_per_job": summary["gpu_h_per_job"],
            "restarts": summary["restarts"], "resizes": summary["resizes"], "stalled": summary["stalled"],
            "wall_s": summary["wall_s"]}


def policy_of(label: str) -> Policy:
    """``name`` or ``name:k=v,...`` (constructor arguments, numbers) as a policy."""
    name, _, params = label.partition(":")
    kwargs = {key: float(value) for key, value in (item.split("=", 1) for item in params.split(",") if item)}
    return type(get_policy(name))(**kwargs) if kwargs else get_policy(name)


def _key(row: dict[str, object]) -> Task:
    return (str(row["load"]), int(row["workload"]), int(row["seed"]),  # type: ignore[call-overload]
            str(row["policy"]), str(row["history"]), cost_label(row.get("resize", RESTART)))


def cost_label(cost: object) -> str:
    """A resize cost as runs are keyed: ``restart``, its seconds as --resize-costs spells them (10, 0, 2.5), or
    ``GROW/SHRINK`` seconds (9.3/0.6)."""
    return resize_cost_label(cost)


def figures_of(row: Mapping[str, object]) -> dict[str, float] | None:
    """A run's figures (:data:`~dlsub.sim.compare.METRICS`); None for a row kept before p99 JCT and GPU-hours
    were (it is run again)."""
    if any(row.get(metric) is None for metric in METRICS):
        return None
    return {metric: float(row[metric]) for metric in METRICS}  # type: ignore[arg-type]


Results = dict[Task, dict[str, float]]
Runs = dict[tuple[str, int, int, str, str], dict[str, float]]  # one resize cost's (or mix's) runs, by Task[:5]


def at_costs(results: Results, costs: Mapping[str, str]) -> Runs:
    """The runs of each policy at its resize cost (``costs[policy]``, else ``costs[""]``), keyed without it."""
    return {task[:5]: row for task, row in results.items() if task[5] == costs.get(task[3], costs[""])}


def runs_of(results: Results, load: str, policy: str, history: str, cost: str) -> Lookup:
    return lambda w, s: results.get((load, w, s, policy, history, cost))


def mechanism(results: Results, loads: list[str], seeds: list[int], workloads: list[int], costs: list[str],
              policies: list[str], history: str, halves: Mapping[str, tuple[int, ...]]) -> None:
    """Each policy's paired change in average JCT and GPU-hours a job from a resize costing a restart to each
    other cost: per order, the mean over the half's workloads of (run at the cost) / (run at restart)."""
    for load in loads:
        for half, members in halves.items():
            ws = [w for w in members if w in workloads]
            for policy in policies if ws else []:
                for cost in (c for c in costs if c != RESTART):
                    ratios = figures(runs_of(results, load, policy, history, cost),
                                     runs_of(results, load, policy, history, RESTART), ws, seeds)
                    if ratios:
                        print(f"  {load}x {half}, {policy} at resize {cost} s / at restart: avg JCT "
                              f"{ratios['avg_jct_s'].text()} {verdict(ratios['avg_jct_s'])}, GPU-h/job "
                              f"{ratios['gpu_h_per_job'].text()} {verdict(ratios['gpu_h_per_job'])}")


def report(results: Runs, loads: list[str], seeds: list[int], workloads: list[int],
           histories: list[str], goodput: str = "goodput", halves: Mapping[str, tuple[int, ...]] = HALVES,
           paired: bool = False, generated: bool = False) -> None:
    def lookup(load: str, policy: str, history: str) -> Lookup:
        return lambda w, s: results.get((load, w, s, policy, history))

    for load in loads:
        print(f"\n== {load}x load, {len(seeds)} arrival orders (seeds {seeds[0]}..{seeds[-1]}) ==")
        published = PUBLISHED_AVG_JCT_S.get(load, {}).get("pollux") if not generated else None
        for half, members in halves.items():
            ws = [w for w in members if w in workloads]
            if not ws:
                continue
            ours = [statistics.mean(results[(load, w, s, "pollux", "none")]["avg_jct_s"] for s in seeds) for w in ws]
            print(f"\n{half}: workloads {','.join(map(str, ws))}")
            if published is not None:
                print("  pollux avg JCT, mean over orders (published):  "
                      + "  ".join(f"w{w} {o:.0f} ({published[w - 1]})" for w, o in zip(ws, ours, strict=True)))
            else:
                artifact = PUBLISHED_AVG_JCT_S.get(load, {}).get("pollux")
                print("  pollux avg JCT, mean over orders:  " + "  ".join(f"w{w} {o:.0f}" for w, o in zip(ws, ours,
                                                                                                           strict=True))
                      + f"  mean {statistics.mean(ours):.0f}"
                      + (f" (Pollux published, artifact's workloads: mean {statistics.mean(artifact):.0f})"
                         if artifact else ""))
            rows = {"pollux": figures(lookup(load, "pollux", "none"), None, ws, seeds)}
            rows.update({f"{goodput}, {h}" if len(histories) > 1 else goodput:
                         figures(lookup(load, goodput, h), None, ws, seeds) for h in histories})
            print("\n".join("  " + line for line in table(rows)))
            per_order_jct: dict[str, list[float]] = {}
            for history in histories:
                base = lookup(load, "pollux", "none")
                ratios = figures(lookup(load, goodput, history), base, ws, seeds)
                per_order_jct[history] = per_order(lookup(load, goodput, history), base, "avg_jct_s", ws, seeds)
                label = "online, no history" if history == "none" else f"online, history {history} (assumed source)"
                for metric, name in METRICS.items():
                    print(f"  {goodput}/pollux {name:<9}, {label:<45} {ratios[metric].text()}  "
                          f"{verdict(ratios[metric])}")
                print("  " + claim(goodput, "pollux", ratios, CLAIM_GOAL, f"at {load}x load, {half}, {label}"))
            for history in histories:
                if history == "none" or "none" not in per_order_jct:
                    continue
                diffs = [a - b for a, b in zip(per_order_jct[history], per_order_jct["none"], strict=True)]
                change = interval(diffs)
                print(f"  change in avg JCT ratio from history {history} (paired):{'':<6} {change.text()}  "
                      f"{verdict(change, 0.0)}")
            for history in histories if paired else []:
                diffs = [statistics.mean((results[(load, w, s, goodput, history)]["avg_jct_s"]
                                          - results[(load, w, s, "goodput", history)]["avg_jct_s"])
                                         / results[(load, w, s, "pollux", "none")]["avg_jct_s"] for w in ws)
                         for s in seeds]
                change = interval(diffs)
                print(f"  change from {goodput} over goodput, history {history} (paired): {change.text()}  "
                      f"{verdict(change, 0.0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default="0.5,1.0")
    parser.add_argument("--orders", type=int, default=5)
    parser.add_argument("--jitter", type=float, default=120.0, help="seconds; each arrival delayed by up to this")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--history", default="none,one-user",
                        help="goodput's history sources to compare (pollux always runs without)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--variant", default="", help="goodput's constructor arguments, K=V,... (numbers)")
    parser.add_argument("--paired", action="store_true", help="with --variant: run plain goodput too, and compare")
    parser.add_argument("--tuned-on", choices=("1-4", "5-8"), default="1-4",
                        help="the half a constant was chosen on (5-8: the reverse split)")
    parser.add_argument("--raw", type=Path, default=None, help="keep (and resume from) every run's result, JSON lines")
    parser.add_argument("--generated", action="store_true",
                        help="workload K: the generator's seed K (any load), not the artifact's workload-K.csv")
    parser.add_argument("--philly", type=Path, default=PHILLY, help="with --generated: the Philly trace")
    parser.add_argument("--stated-missing", type=float, default=0.5,
                        help="with --generated: share of jobs that state no length (1: none does)")
    parser.add_argument("--stated-error", type=float, default=2.0,
                        help="with --generated: stated lengths off by a factor in [1/E, E], log-uniform")
    parser.add_argument("--resize-costs", default="6/0.4",
                        help="what a resize in place costs, each run: 'restart' (as before issue 52), seconds "
                             "(0: free, a bound), or GROW/SHRINK seconds (6/0.4: dlsub's measured resize in "
                             "process, the default)")
    args = parser.parse_args()
    try:
        costs = [cost_label(c) for c in args.resize_costs.split(",")]
    except ValueError as exc:
        parser.error(f"--resize-costs: {exc}")
    loads = args.loads.split(",")
    source = Source()
    if args.generated:
        source = Source(read_philly(args.philly), Statements(args.stated_missing, args.stated_error))
    for load in loads:
        if load not in LOAD_DIRS and not args.generated:
            parser.error(f"load {load}: only {', '.join(LOAD_DIRS)} (other loads are the acceptance set)")
    seeds = list(range(1, args.orders + 1))
    workloads = [int(w) for w in args.workloads.split(",")]
    histories = args.history.split(",")
    goodput = f"goodput:{args.variant}" if args.variant else "goodput"
    policy_of(goodput)  # a bad --variant fails here, before any run
    goodputs = [goodput, "goodput"] if args.paired and args.variant else [goodput]
    results: Results = {}
    if args.raw is not None and args.raw.exists():
        for line in args.raw.read_text().splitlines():
            row = json.loads(line)
            if (row["jitter"] == args.jitter and row.get("source", "artifact") == source.label_for(row["policy"])
                    and (kept := figures_of(row)) is not None):
                results[_key(row)] = kept
    tasks: list[Task] = []
    for load in loads:
        for seed in seeds:
            for w in workloads:
                for cost in costs:
                    tasks.append((load, w, seed, "pollux", "none", cost))
                    tasks.extend((load, w, seed, g, h, cost) for g in goodputs for h in histories)
    todo = [task for task in tasks if task not in results]
    rows: Iterator[dict[str, object]]
    if args.procs == 1:  # in this process, one at a time (no pool)
        rows = (run(task, args.jitter, source) for task in todo)
    else:
        pool = ProcessPoolExecutor(max_workers=args.procs)
        rows = pool.map(run, todo, [args.jitter] * len(todo), [source] * len(todo))
    for row in rows:
        if row["stalled"]:
            print(f"warning: stalled: {row}")
        results[_key(row)] = figures_of(row) or {}
        if args.raw is not None:
            with args.raw.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
    halves = HALVES if args.tuned_on == "1-4" else REVERSED
    for cost in costs:
        print(f"\n######## every policy at resize cost {cost}{'' if cost == RESTART else ' s'} (the policy alone)")
        print(f"goodput vs pollux, dlsub's simulator, 16 nodes x 4 GPUs, arrivals jittered up to {args.jitter:g} s, "
              f"workloads: {source.label}")
        report(at_costs(results, {"": cost}), loads, seeds, workloads, histories, goodput, halves,
               paired=len(goodputs) > 1, generated=args.generated)
    measured = dlsub_resize_cost(costs)
    if RESTART in costs and measured:
        print(f"\n######## systems: goodput at dlsub's resize ({measured} s), pollux at a restart for every change")
        report(at_costs(results, {"": measured, "pollux": RESTART}), loads, seeds, workloads, histories, goodput,
               halves, paired=False, generated=args.generated)
    if RESTART in costs and len(costs) > 1:
        print("\n######## the cheaper resize alone, each policy (paired against a resize costing a restart)")
        for history in histories:
            mechanism(results, loads, seeds, workloads, costs, ["pollux", *goodputs], history, halves)


if __name__ == "__main__":
    main()
