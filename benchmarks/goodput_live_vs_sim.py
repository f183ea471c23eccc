"""Live against simulated: average JCT of one small workload of jobs elastic in GPUs on the testbed and in the
simulator.

    flock /tmp/dlsub-testbed.lock python benchmarks/goodput_live_vs_sim.py [--policies goodput,fifo]
        [--arrivals 0,30,60,90] [--epochs 12] [--restart-penalty 18] [--keep DIR] [--json]
        [--sim-only | --live-from DIR/results.json]

The workload: jobs of 1 to 4 GPUs (`dlsub -p gpu --gpus 1:4 --cpus 1 train_digits.py
--epochs E`: a main job of one GPU and three held one-GPU workers), submitted
at --arrivals seconds, that share the testbed's two 4-GPU nodes: a node holds
GPUs of several jobs at once. The testbed's fake GPUs share two cores, so each
job emulates its per-GPU speed with train_digits' throttles: the first and
every third after it (``poor``) sleep --poor-throttle s per step whatever its
size (it scales poorly), the others (``good``) sleep --good-per-sample s per
sample of their process's share of the global batch of 64 (four GPUs step
four times as fast).

Live: for each policy, the agent service restarted under that policy
(policy.toml's ``policy``, restored after), the jobs submitted on schedule
on an otherwise idle testbed, and each job's JCT taken from Slurm (its main
job's End minus Submit, sacct).

Simulated: the same workload for :func:`dlsub.sim.engine.simulate`
in online mode, from files the benchmark writes (kept with --keep):

* traces, one folder per application, from the same throttle model: the
  time of one step at each placement of 1 to 4 GPUs (on one node or split
  over two) and local batch is the throttle plus --overhead-s of real
  compute on the shared cores; ``validation-64.csv`` says an epoch is the 22
  steps train_digits runs (1,437 training samples, batch 64) with no
  batch-size gain, so the batch stays 64 as live, and local batches of 16 to
  64 give each job 1 to 4 replicas;
* a workload CSV whose rows declare the jobs' epochs (live, the job reports
  its total steps, so the agent knows the remaining work too);
* a cluster file: the testbed's gpu partition, 2 nodes x 4 GPUs. The live
  agent asks the policy in exactly these terms
  (policies/actions/goodput_resize_rules.py): the nodes by name with their
  GPUs, each job's Allocation (the node of each GPU it holds), sizes in GPUs;
  what is live only is said to the policy (a job changes size a worker at a
  time, and grows in place).

The scheduling interval is the agent's tick (3 s) and the restart penalty
the testbed's measured within-node resize (benchmarks/resize_latency.py
--within-node: about 18 s), which the simulator also charges at a job's
first start (live: container start, torch import, rendezvous). `dlsub
simulate` takes --interval and --restart-penalty, but it builds ``goodput``
with its own restart margin (30 s x 10), while the live agent's is
``moves.restart_cost_s + min_saving_s`` (policy.toml; 20 s on the testbed):
so the benchmark calls the engine with the very policy object the agent
builds (:func:`dlsub.agent.live_models.sizing_policy`), and prints the
CLI's figure beside it. Live ``fifo`` grows elastic jobs onto idle GPUs
oldest first and shrinks them for waiting jobs: its simulated counterpart
is ``efifo``.

Prints live and simulated average JCT per policy and their ratio (the
floor: within 25%), per job, and where the gap comes from: start-up and
teardown, the training each resize cost live against the penalty, step
times measured live against the traces (and the simulation re-run on the
measured ones), and the simulator's whole-second epochs.

Where the two decide differently (per job, not only in seconds): live, a
waiting job's minimum comes first whatever the policy (policies/actions/resize_rules.py
shrinks a running job for it, the newest job's newest worker first); in the
simulator the policy alone decides. Live, a job's GPUs are only ever taken
for another job of the same user (another user's reported throughput is
that user's word); the simulator has no users.

Runs as root (acts as the testbed user dltest) under the testbed lock;
needs the agent service and an otherwise idle testbed; about 5 min per
policy. --sim-only runs the simulations alone, --live-from the simulations
and the report on a kept run's live results (neither needs the testbed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import math
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_bench import TRAIN, clean_up, events, gone, now, submit, wait_testbed_quiet

from dlsub.agent.live_models import sizing_policy
from dlsub.contract import FINAL_STATES
from dlsub.policies.api import Policy
from dlsub.policies.efifo import ElasticFifoPolicy
from dlsub.sim.apps import normalise
from dlsub.sim.cluster_file import load_cluster
from dlsub.sim.engine import SimConfig, SimResult, simulate
from dlsub.sim.workload import read_workload
from dlsub.site_config.policy_file import load_policy
from livebed import USER, TestbedUser, agent_policy, wait_for

REPO = Path(__file__).resolve().parents[1]
BATCH = 64  # train_digits' global batch (its default)
NODES, GPUS_PER_NODE = 2, 4  # the testbed's gpu partition
MAX_GPUS = 4  # each job's --gpus 1:4
#: Live policy -> the simulator's policy that does what the agent does under it.
SIM_COUNTERPART = {"goodput": "goodput", "fifo": "efifo"}


def steps_per_epoch(batch: int = BATCH) -> int:
    """train_digits' steps per epoch: 80% of the shipped data set for training, whole batches only."""
    with gzip.open(REPO / "examples" / "data" / "digits.csv.gz", "rt") as fh:
        rows = sum(1 for line in fh if line.strip())
    return int(0.8 * rows) // batch


@dataclass(frozen=True)
class Emulated:
    """An application's emulated speed: train_digits' --throttle and --throttle-per-sample."""

    name: str
    throttle: float = 0.0
    per_sample: float = 0.0

    def args(self) -> list[str]:
        return ["--throttle", str(self.throttle), "--throttle-per-sample", str(self.per_sample)]

    def step_s(self, world: int, batch: int, overhead_s: float) -> float:
        """One step on ``world`` processes: rank 0 (the largest share) sleeps, then all-reduce waits for it."""
        return self.throttle + self.per_sample * math.ceil(batch / world) + overhead_s


@dataclass(frozen=True)
class JobSpec:
    name: str
    arrival_s: float
    app: Emulated
    epochs: int


#: Step time of an application on ``world`` processes at a global ``batch``.
StepModel = Callable[[Emulated, int, int], float]


# ------------------------------------------------------------------ simulated


def placements(most: int) -> list[tuple[int, ...]]:
    """Every placement of 1 to ``most`` GPUs on one node or split over two, in the traces' form ("13", not "31")."""
    seen = {normalise(tuple(p for p in (a, b) if p)) for a in range(1, most + 1) for b in range(0, most + 1 - a)}
    return sorted(seen, key=lambda p: (sum(p), len(p), p))


def write_traces(folder: Path, apps: Sequence[Emulated], epochs: int, step_model: StepModel) -> Path:
    """One trace folder per application, in GPUs: every placement of 1 to 4 GPUs, at local batches of 16, 32
    and 64 (the simulator gives a job of batch 64 up to 64 / 16 = 4 replicas, as --gpus 1:4 does live)."""
    per_epoch = steps_per_epoch()
    for app in apps:
        where = folder / app.name
        where.mkdir(parents=True, exist_ok=True)
        rows = []
        for placement in placements(MAX_GPUS):
            world = sum(placement)
            for local in (BATCH // 4, BATCH // 2, BATCH):
                rows.append((placement, world, local, step_model(app, world, world * local)))
        (where / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n" + "".join(
            f"{''.join(map(str, p))},{local},{step:.6f},0\n" for p, _, local, step in rows))
        (where / "scalability.csv").write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n" + "".join(
            f"{len(p)},{w},{local},{step:.6f},0\n" for p, w, local, step in rows))
        # Progress counts steps at the first batch size: epoch k ends after k x 22 steps.
        (where / f"validation-{BATCH}.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n" + "".join(
            f"{k * per_epoch},{k * per_epoch},0,1,1\n" for k in range(1, epochs + 1)))
    return folder


def write_workload(path: Path, jobs: Sequence[JobSpec]) -> Path:
    path.write_text("name,time,application,num_replicas,batch_size,epochs\n" + "".join(
        f"{j.name},{j.arrival_s:g},{j.app.name},1,{BATCH},{j.epochs}\n" for j in jobs))
    return path


def write_cluster(path: Path) -> Path:
    path.write_text(f"# The testbed's gpu partition\n[[group]]\npartition = \"gpu\"\nnodes = {NODES}\n"
                    f"gpus_per_node = {GPUS_PER_NODE}\n")
    return path


def sim_policy(live_name: str, policy_file: Path) -> Policy:
    """The simulator's policy for a live one: for goodput, the object the agent itself builds from policy.toml."""
    if live_name == "goodput":
        built = sizing_policy(dataclasses.replace(load_policy(policy_file), policy="goodput"))
        assert built is not None
        return built
    return ElasticFifoPolicy()


def run_sim(folder: Path, jobs: Sequence[JobSpec], live_name: str, args: argparse.Namespace,
            step_model: StepModel) -> SimResult:
    traces = write_traces(folder / "traces", sorted({j.app for j in jobs}, key=lambda a: a.name),
                          max(j.epochs for j in jobs), step_model)
    workload = write_workload(folder / "workload.csv", jobs)
    cluster = load_cluster(write_cluster(folder / "cluster.toml"))
    config = SimConfig(interval_s=args.tick, restart_penalty_s=args.restart_penalty, information="online")
    return simulate(read_workload(workload), traces, sim_policy(live_name, args.policy_file), cluster, config,
                    workload_name="live-vs-sim")


def cli_avg_jct(folder: Path, live_name: str, args: argparse.Namespace) -> float | None:
    """`dlsub simulate` on the same files (its own goodput restart margin); None if the CLI fails."""
    out = subprocess.run(
        ["dlsub", "simulate", str(folder / "workload.csv"), "--policy", SIM_COUNTERPART[live_name],
         "--cluster", str(folder / "cluster.toml"), "--traces", str(folder / "traces"), "--interval",
         str(args.tick), "--restart-penalty", str(args.restart_penalty), "--json"],
        capture_output=True, text=True)
    if out.returncode != 0:
        return None
    value = json.loads(out.stdout).get("avg_jct_s")
    return float(value) if value is not None else None


# ------------------------------------------------------------------ live


def sacct_times(slurm_job_id: int) -> tuple[float | None, float | None]:
    """(Submit, End) of a Slurm job from accounting, as epoch seconds (None where not known yet)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(slurm_job_id), "-o", "Submit,End"],
                         capture_output=True, text=True).stdout.strip().splitlines()

    def stamp(text: str) -> float | None:
        try:
            return datetime.datetime.fromisoformat(text).timestamp()  # the testbed's local time
        except ValueError:
            return None  # "Unknown"

    if not out:
        return None, None
    submit, end = out[0].split("|")[:2]
    return stamp(submit), stamp(end)


def step_times(job_dir: str) -> dict[int, float]:
    """Median seconds per step at each world size, from consecutive progress reports of one group."""
    per_world: dict[int, list[float]] = {}
    last: dict[str, Any] | None = None
    for event in events(job_dir):
        if event.get("event") != "progress" or "world_size" not in event:
            last = None  # a (re)start: the next report includes restoring
            continue
        if last is not None and last.get("world_size") == event["world_size"] and event["step"] > last["step"]:
            per_world.setdefault(int(event["world_size"]), []).append(
                (float(event["time"]) - float(last["time"])) / (int(event["step"]) - int(last["step"])))
        last = event
    return {w: statistics.median(v) for w, v in sorted(per_world.items())}


def resize_pauses(job_dir: str, steps: Mapping[int, float]) -> list[float]:
    """Training time lost to each resize: from the last report before the group re-formed to the first after,
    less the steps done in between at the new size's step time (checkpoint, rendezvous, restore)."""
    lost: list[float] = []
    before: dict[str, Any] | None = None
    restarted = False
    for event in events(job_dir):
        if event.get("event") == "start":
            restarted = before is not None
        elif event.get("event") == "progress" and "world_size" in event:
            if restarted and before is not None:
                step = steps.get(int(event["world_size"]), 0.0)
                lost.append(float(event["time"]) - float(before["time"])
                            - (int(event["step"]) - int(before["step"])) * step)
            before, restarted = event, False
    return lost


def run_live(live_name: str, jobs: Sequence[JobSpec], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Submit the workload on schedule under ``live_name``; each job's JCT and what it went through."""
    user = TestbedUser(USER)
    wait_testbed_quiet()
    submitted: dict[str, dict[str, Any]] = {}
    ended: dict[str, dict[str, Any]] = {}
    with agent_policy(live_name):
        t0 = now()
        while len(ended) < len(jobs):
            for spec in jobs:
                if spec.name not in submitted and now() - t0 >= spec.arrival_s:
                    submitted[spec.name] = submit(
                        user, "-p", "gpu", "--time", "20", "--name", spec.name, "--cpus", "1", "--mem", args.mem,
                        "--gpus", f"1:{MAX_GPUS}", TRAIN,
                        "--epochs", str(spec.epochs), *spec.app.args())
            # One `dlsub status` for all jobs every 2 s: the poll shares the two cores with the jobs (JCT is
            # Slurm's, not the poll's).
            states = {s["id"]: s for s in json.loads(user.dlsub("status", "--json").stdout)}
            for name, job in submitted.items():
                state = states.get(job["id"], {})
                if name not in ended and state.get("state") in FINAL_STATES:
                    ended[name] = state
            if now() - t0 > args.live_limit_s:
                raise RuntimeError(f"{live_name}: not done after {args.live_limit_s:.0f} s: "
                                   f"{sorted(set(submitted) - set(ended))} still running")
            time.sleep(2.0)
        slurm_ids = [i for job in submitted.values() for i in (job["slurm_job_id"], job.get("worker_array_id"))]
        wait_for("the jobs' Slurm jobs gone", lambda: gone(*slurm_ids), timeout=120, interval=0.5)
    rows = []
    for spec in jobs:
        job, final = submitted[spec.name], ended[spec.name]
        submit_s, end_s = sacct_times(int(job["slurm_job_id"]))
        starts = events(job["job_dir"], "start")
        progress = events(job["job_dir"], "progress")
        rows.append({
            "name": spec.name, "app": spec.app.name, "state": final["state"], "id": job["id"],
            "jct_s": round(end_s - submit_s, 1) if submit_s and end_s else None,
            "arrival_s": round(submit_s - t0, 1) if submit_s else None,
            "first_start_s": round(float(starts[0]["time"]) - submit_s, 1) if starts and submit_s else None,
            "last_report_to_end_s": round(end_s - float(progress[-1]["time"]), 1) if progress and end_s else None,
            "world_sizes": [e.get("world_size") for e in starts],
            "resizes": len(final.get("resizes") or []),
            "step_s": step_times(job["job_dir"]),
        })
        rows[-1]["resize_lost_s"] = [round(x, 1) for x in resize_pauses(job["job_dir"], rows[-1]["step_s"])]
    return rows


# ------------------------------------------------------------------ report


def avg(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if len(known) == len(values) and known else None


def fmt(value: float | None, spec: str = "7.1f") -> str:
    return "      -" if value is None else format(value, spec)


def measured_model(live: Mapping[str, list[dict[str, Any]]], jobs: Sequence[JobSpec],
                   fallback: StepModel) -> StepModel:
    """Step times measured live (median per application and world size over every run), else ``fallback``."""
    seen: dict[tuple[str, int], list[float]] = {}
    for rows in live.values():
        for row in rows:
            for world, step in row["step_s"].items():
                seen.setdefault((row["app"], int(world)), []).append(step)

    def model(app: Emulated, world: int, batch: int) -> float:
        found = seen.get((app.name, world))
        # Only the global batch of 64 ever runs live; other batches (trace points the jobs never use) keep the model.
        if found and batch == BATCH:
            return statistics.median(found)
        return fallback(app, world, batch)

    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="goodput,fifo", help="live policies, in the order run")
    parser.add_argument("--arrivals", default="0,30,60,90",
                        help="submission times, s; the first job and every third after it scale poorly")
    parser.add_argument("--epochs", type=int, default=12, help="per job (22 steps of 64 samples each)")
    parser.add_argument("--poor-throttle", type=float, default=0.4, help="the poor scaler: seconds per step")
    parser.add_argument("--good-per-sample", type=float, default=0.012,
                        help="the good scalers: seconds per sample of a process's share of the batch")
    parser.add_argument("--overhead-s", type=float, default=0.02,
                        help="the traces' real compute per step on the shared cores (elastic_vs_rigid: ~0.02 s)")
    parser.add_argument("--tick", type=int, default=3, help="the agent's tick = the simulator's interval, s")
    parser.add_argument("--restart-penalty", type=int, default=18,
                        help="the simulator's restart penalty, s (resize_latency --within-node: ~18 s)")
    parser.add_argument("--policy-file", type=Path, default=Path("/etc/dlsub/policy.toml"),
                        help="whose moves.restart_cost_s + min_saving_s make goodput's margin "
                             "[the testbed's; etc/testbed/policy.toml when absent]")
    parser.add_argument("--mem", default="1800M",
                        help="memory per member (main job, each worker): four must fit a GPU node's 8000 MB")
    parser.add_argument("--live-limit-s", type=float, default=480.0, help="give up a live run after this long")
    parser.add_argument("--sim-only", action="store_true", help="no live runs (no testbed needed)")
    parser.add_argument("--live-from", type=Path, default=None,
                        help="take the live results from a previous run's results.json (see --keep)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the traces, workload, cluster and results.json here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.policy_file.exists():
        args.policy_file = REPO / "etc" / "testbed" / "policy.toml"
    policies = [p for p in args.policies.split(",") if p]
    for name in policies:
        if name not in SIM_COUNTERPART:
            parser.error(f"--policies: {name!r}; valid: {', '.join(SIM_COUNTERPART)}")
    arrivals = [float(a) for a in args.arrivals.split(",")]
    poor = Emulated("poor", throttle=args.poor_throttle)
    good = Emulated("good", per_sample=args.good_per_sample)
    jobs = [JobSpec(f"j{i + 1}-{(poor if i % 3 == 0 else good).name}", t, poor if i % 3 == 0 else good, args.epochs)
            for i, t in enumerate(arrivals)]

    def model(app: Emulated, world: int, batch: int) -> float:
        return app.step_s(world, batch, args.overhead_s)

    live: dict[str, list[dict[str, Any]]] = {}
    if args.live_from:
        # A previous run's live results (its results.json): the simulations and the report again, no testbed.
        saved = json.loads(args.live_from.read_text())["policies"]
        live = {name: saved[name]["live"] for name in policies if saved.get(name, {}).get("live")}
    elif not args.sim_only:
        try:
            for name in policies:
                live[name] = run_live(name, jobs, args)
                if not args.json:
                    print(f"live {name}: " + ", ".join(f"{r['name']} {r['jct_s']} s" for r in live[name]),
                          flush=True)
        finally:
            clean_up(TestbedUser(USER))
    calibrated = measured_model(live, jobs, model)
    out: dict[str, Any] = {"jobs": [dataclasses.asdict(j) for j in jobs], "policies": {}}
    with tempfile.TemporaryDirectory(prefix="dlsub-livesim-") as scratch:
        base = args.keep or Path(scratch)
        for name in policies:
            folder = base / name
            sim = run_sim(folder, jobs, name, args, model)
            cli = cli_avg_jct(folder, name, args)
            sim_cal = run_sim(base / f"{name}-measured", jobs, name, args, calibrated) if live else None
            out["policies"][name] = {
                "sim_policy": SIM_COUNTERPART[name], "live": live.get(name),
                "sim": [dataclasses.asdict(r) | {"jct_s": r.jct_s} for r in sim.jobs],
                "sim_avg_jct_s": sim.summary()["avg_jct_s"], "cli_avg_jct_s": cli,
                "sim_measured_steps_avg_jct_s": sim_cal.summary()["avg_jct_s"] if sim_cal else None,
            }
    if args.keep:
        (args.keep / "results.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    report(out, jobs, args, model)


def report(out: Mapping[str, Any], jobs: Sequence[JobSpec], args: argparse.Namespace, model: StepModel) -> None:
    print(f"\n{len(jobs)} jobs elastic in GPUs (--gpus 1:{MAX_GPUS}, {args.epochs} epochs x "
          f"{steps_per_epoch()} steps) at {args.arrivals} s on {NODES} nodes x {GPUS_PER_NODE} GPUs; sim: interval "
          f"{args.tick} s, restart penalty {args.restart_penalty} s, online information")
    print(f"{'policy (sim)':<17} {'live avg JCT':>12} {'sim avg JCT':>12} {'sim/live':>9}  floor  "
          f"{'sim on live steps':>17} {'CLI sim':>8}")
    for name, res in out["policies"].items():
        live_avg = avg([r["jct_s"] for r in res["live"]]) if res["live"] else None
        sim_avg = res["sim_avg_jct_s"]
        ratio = sim_avg / live_avg if live_avg and sim_avg else None
        verdict = "-" if ratio is None else ("met" if abs(ratio - 1) <= 0.25 else "NOT met")
        print(f"{name + ' (' + res['sim_policy'] + ')':<17} {fmt(live_avg, '10.1f')} s {fmt(sim_avg, '10.1f')} s "
              f"{fmt(ratio, '9.2f')}  {verdict:<6} {fmt(res['sim_measured_steps_avg_jct_s'], '15.1f')} s "
              f"{fmt(res['cli_avg_jct_s'], '6.1f')} s")
    print("\nper job: live JCT (submit->first training start, resizes, world sizes) | sim JCT (first start, "
          "restarts)")
    for name, res in out["policies"].items():
        sims = {r["name"]: r for r in res["sim"]}
        for i, spec in enumerate(jobs):
            row = res["live"][i] if res["live"] else None
            s = sims[spec.name]
            live_text = (f"{fmt(row['jct_s'])} s ({fmt(row['first_start_s'], '4.1f')} s, {row['resizes']}, "
                         f"{row['world_sizes']})" if row else "-")
            start = None if s["start_s"] is None else s["start_s"] - s["arrival_s"]
            print(f"  {name:<8} {spec.name:<8} live {live_text:<36} sim {fmt(s['jct_s'])} s "
                  f"({fmt(start, '4.1f')} s, {s['restarts']})")
    if not any(res["live"] for res in out["policies"].values()):
        return
    print("\nwhere the gap comes from:")
    rows = [r for res in out["policies"].values() for r in res["live"] or []]
    starts = [r["first_start_s"] for r in rows if r["first_start_s"] is not None]
    tails = [r["last_report_to_end_s"] for r in rows if r["last_report_to_end_s"] is not None]
    if starts:
        print(f"  start-up: submit -> training start {statistics.median(starts):.1f} s median live (the sim charges "
              f"{args.restart_penalty} s + up to one {args.tick} s interval, and counts the steps from there)")
    if tails:
        print(f"  end: last report -> Slurm End {statistics.median(tails):.1f} s median live (test accuracy, "
              f"container exit; the sim ends at the last step)")
    for name, res in out["policies"].items():
        live_rows = res["live"] or []
        lost = [x for r in live_rows for x in r.get("resize_lost_s", [])]
        sim_restarts = sum(r["restarts"] for r in res["sim"])
        print(f"  resizes under {name}: {sum(r['resizes'] for r in live_rows)} live, training lost to each "
              f"{', '.join(f'{x:.1f}' for x in lost) or '-'} s (checkpoint, worker start, rendezvous, restore); "
              f"{sim_restarts} simulated, {args.restart_penalty} s each")
    seen: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        for world, step in r["step_s"].items():
            seen.setdefault((r["app"], int(world)), []).append(step)
    apps = {j.app.name: j.app for j in jobs}
    per_epoch = steps_per_epoch()
    for (app, world), steps in sorted(seen.items()):
        predicted = model(apps[app], world, BATCH)
        measured = statistics.median(steps)
        # The simulator ends each epoch on a whole second (engine.SimJob.advance rounds), which short epochs feel.
        epoch = per_epoch * predicted
        print(f"  step time {app} at world size {world}: {measured:.3f} s live (median over runs, with the other "
              f"jobs on the two cores), {predicted:.3f} s in the traces ({measured / predicted - 1:+.1%}); an "
              f"epoch of {epoch:.2f} s takes {round(epoch)} s in the sim ({round(epoch) / epoch - 1:+.1%})")


if __name__ == "__main__":
    main()
