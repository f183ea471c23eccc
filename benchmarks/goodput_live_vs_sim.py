"""Live against simulated: average JCT of one small workload of jobs elastic in GPUs on the testbed and in the
simulator.

    flock /tmp/dlsub-testbed.lock python benchmarks/goodput_live_vs_sim.py [--policies goodput,fifo]
        [--arrivals 0,30,60,90] [--epochs 12] [--restart-penalty 18] [--keep DIR] [--json]
        [--sim-only | --live-from DIR/results.json] [--two-kinds [--kind-slowdown 3]]

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

Two kinds of GPU (``--two-kinds``, goodput only): the gpu partition's gpu1
holds a100s and gpu2 v100s (Slurm's GRES types), and the jobs alternate
between two applications, both scaling well (--good-per-sample), each
--kind-slowdown times slower on one kind (train_digits' --gpu-slowdown,
read against the node's GPU type): ``a100-fast`` is slow on v100,
``v100-fast`` on a100 (the first job and every second after it is
a100-fast). Live, the agent runs goodput with ``[goodput] across_gpu_types
= true`` (policies/actions/gpu_kind_rules.py: it grows a job on its kind
only and moves it to the other kind, checkpoint and requeue, when its
figures say the gain beats the restart). The agent knows a kind a job has
not run on only from earlier runs of the same command there (its one-GPU
profile, Sia's bootstrap, kept in the agent's memory), so before the
workload each command runs on one GPU of each kind (every other GPU
held), until the agent has read three reports from it; that takes about
two minutes and is no job's JCT. Slurm starts each main job on a GPU of
whatever kind is idle; the agent moves it from there. Simulated: the same
jobs on a cluster of one 4-GPU node of each kind, per-kind traces
(``placements-<kind>.csv``, ``scalability-<kind>.csv``) from the same
throttle model times each kind's slowdown, the agent's policy object
(TypedGoodputPolicy, the same restart margin), and no profile cost (live,
the profiles ran before). The report adds each job's kinds live (start by
start) and in the simulator (decision by decision), the moves live and
what each cost, and the step times per kind.

Runs as root (acts as the testbed user dltest) under the testbed lock;
needs the agent service and an otherwise idle testbed; about 5 min per
policy. --sim-only runs the simulations alone, --live-from the simulations
and the report on a kept run's live results (neither needs the testbed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gzip
import json
import math
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from elastic_bench import (
    GPUS_PER_NODE,
    TRAIN,
    clean_up,
    events,
    gone,
    hold_node,
    now,
    scancel,
    submit,
    wait_testbed_quiet,
)

from dlsub.agent.live_models import sizing_policy
from dlsub.contract import FINAL_STATES
from dlsub.policies.api import Allocations, ClusterView, Decision, Jobs, Policy
from dlsub.policies.efifo import ElasticFifoPolicy
from dlsub.sim.apps import normalise
from dlsub.sim.cluster_file import load_cluster
from dlsub.sim.engine import SimConfig, SimResult, simulate
from dlsub.sim.workload import read_workload
from dlsub.site_config.policy_file import load_policy
from livebed import GPU_TYPES, USER, TestbedUser, agent_policy, attempts, reports_on, slurm_job, wait_for

REPO = Path(__file__).resolve().parents[1]
BATCH = 64  # train_digits' global batch (its default)
NODES = 2  # the testbed's gpu partition, of GPUS_PER_NODE each
#: The testbed's GPU kinds (gpu1's GRES gpu:a100:4, gpu2's gpu:v100:4), and the node of each.
KIND_NODE = {kind: node for node, kind in GPU_TYPES.items()}
KINDS = tuple(sorted(KIND_NODE))
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
    """An application's emulated speed: train_digits' --throttle and --throttle-per-sample, and on GPUs of a
    kind in ``slowdown`` both that many times longer (--gpu-slowdown KIND=FACTOR)."""

    name: str
    throttle: float = 0.0
    per_sample: float = 0.0
    slowdown: tuple[tuple[str, float], ...] = ()

    def args(self) -> list[str]:
        return ["--throttle", str(self.throttle), "--throttle-per-sample", str(self.per_sample),
                *(f"--gpu-slowdown={kind}={factor:g}" for kind, factor in self.slowdown)]

    def on(self, kind: str) -> Emulated:
        """The application as it runs on GPUs of ``kind`` (named ``NAME@KIND``): its throttles times the kind's
        slowdown, as train_digits multiplies its sleep."""
        factor = dict(self.slowdown).get(kind, 1.0)
        return Emulated(f"{self.name}@{kind}", self.throttle * factor, self.per_sample * factor)

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


def write_traces(folder: Path, apps: Sequence[Emulated], epochs: int, step_model: StepModel,
                 kinds: Sequence[str] = ()) -> Path:
    """One trace folder per application, in GPUs: every placement of 1 to 4 GPUs, at local batches of 16, 32
    and 64 (the simulator gives a job of batch 64 up to 64 / 16 = 4 replicas, as --gpus 1:4 does live).
    With ``kinds``, Sia's layout: ``placements-<kind>.csv`` and ``scalability-<kind>.csv`` for each, from the
    application as it runs there (:meth:`Emulated.on`); the validation file is the same on every kind."""
    per_epoch = steps_per_epoch()
    for app in apps:
        where = folder / app.name
        where.mkdir(parents=True, exist_ok=True)
        for suffix, emulated in ([(f"-{k}", app.on(k)) for k in kinds] if kinds else [("", app)]):
            rows = []
            for placement in placements(MAX_GPUS):
                world = sum(placement)
                for local in (BATCH // 4, BATCH // 2, BATCH):
                    rows.append((placement, world, local, step_model(emulated, world, world * local)))
            (where / f"placements{suffix}.csv").write_text("placement,local_bsz,step_time,sync_time\n" + "".join(
                f"{''.join(map(str, p))},{local},{step:.6f},0\n" for p, _, local, step in rows))
            (where / f"scalability{suffix}.csv").write_text(
                "num_nodes,num_replicas,local_bsz,step_time,sync_time\n" + "".join(
                    f"{len(p)},{w},{local},{step:.6f},0\n" for p, w, local, step in rows))
        # Progress counts steps at the first batch size: epoch k ends after k x 22 steps.
        (where / f"validation-{BATCH}.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n" + "".join(
            f"{k * per_epoch},{k * per_epoch},0,1,1\n" for k in range(1, epochs + 1)))
    return folder


def write_workload(path: Path, jobs: Sequence[JobSpec]) -> Path:
    path.write_text("name,time,application,num_replicas,batch_size,epochs\n" + "".join(
        f"{j.name},{j.arrival_s:g},{j.app.name},1,{BATCH},{j.epochs}\n" for j in jobs))
    return path


def write_cluster(path: Path, kinds: Sequence[str] = ()) -> Path:
    """The testbed's gpu partition: its 2 nodes of 4 GPUs; with ``kinds``, one node of each kind (gpu1's
    a100s, gpu2's v100s)."""
    if kinds:
        assert len(kinds) == NODES, kinds
        path.write_text("# The testbed's gpu partition, a node of each GPU kind\n" + "".join(
            f"[[group]]\npartition = \"gpu\"\nnodes = 1\ngpus_per_node = {GPUS_PER_NODE}\ngpu_type = \"{kind}\"\n"
            for kind in kinds))
        return path
    path.write_text(f"# The testbed's gpu partition\n[[group]]\npartition = \"gpu\"\nnodes = {NODES}\n"
                    f"gpus_per_node = {GPUS_PER_NODE}\n")
    return path


def sim_policy(live_name: str, policy_file: Path, across_kinds: bool = False) -> Policy:
    """The simulator's policy for a live one: for goodput, the object the agent itself builds from policy.toml
    (``across_kinds``: with ``[goodput] across_gpu_types = true``, as the two-kind run sets it live)."""
    if live_name == "goodput":
        site = load_policy(policy_file)
        site = dataclasses.replace(site, policy="goodput", goodput=dataclasses.replace(
            site.goodput, across_gpu_types=across_kinds or site.goodput.across_gpu_types))
        built = sizing_policy(site)
        assert built is not None
        return built
    return ElasticFifoPolicy()


class KindLog:
    """A policy with each job's GPU kind and count noted whenever its decision changes them (the report's
    "where the simulator put it"); the decisions are the policy's, untouched. Only goodput runs across
    kinds, so that is its name."""

    name: ClassVar[str] = "goodput"

    def __init__(self, policy: Policy, cluster: ClusterView) -> None:
        assert policy.name == self.name, policy.name
        self.policy = policy
        self.kind_of = cluster.type_of()
        self.path: dict[str, list[tuple[float, str, int]]] = {}

    def __getattr__(self, name: str) -> Any:
        # What the engine asks of a policy (type_aware, learns_online, elastic, ...): the policy's answer.
        return getattr(self.policy, name)

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        decision = self.policy.decide(jobs, cluster, now, previous)
        for name, alloc in decision.items():
            if not alloc.gpus:
                continue
            kind = Counter(self.kind_of[n] for n in alloc.nodes).most_common(1)[0][0]
            seen = self.path.setdefault(name, [])
            if not seen or seen[-1][1:] != (kind, alloc.gpus):
                seen.append((now, kind, alloc.gpus))
        return decision


def run_sim(folder: Path, jobs: Sequence[JobSpec], live_name: str, args: argparse.Namespace,
            step_model: StepModel) -> tuple[SimResult, dict[str, list[tuple[float, str, int]]]]:
    """The simulation, and (on two kinds) each job's kinds and GPU counts as the policy changed them."""
    kinds = KINDS if args.two_kinds else ()
    traces = write_traces(folder / "traces", sorted({j.app for j in jobs}, key=lambda a: a.name),
                          max(j.epochs for j in jobs), step_model, kinds)
    workload = write_workload(folder / "workload.csv", jobs)
    cluster = load_cluster(write_cluster(folder / "cluster.toml", kinds))
    # Live, the one-GPU profiles of every kind ran before the workload (no job's time): none charged here.
    # On two kinds, as the agent does there, a job's model is lent what earlier runs of its command measured (one
    # user's, a command per application here).
    config = SimConfig(interval_s=args.tick, restart_penalty_s=args.restart_penalty, information="online",
                       profile_s=0.0 if kinds else SimConfig.profile_s, history="one-user" if kinds else "none")
    policy = sim_policy(live_name, args.policy_file, across_kinds=bool(kinds))
    logged = KindLog(policy, cluster) if kinds else None
    result = simulate(read_workload(workload), traces, logged or policy, cluster, config, workload_name="live-vs-sim")
    return result, (logged.path if logged else {})


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
    """(Submit, End) of a Slurm job from accounting, as epoch seconds (None where not known yet): its first
    record's Submit and its last's End (-D: a job requeued, as a move to another GPU kind does, has a record per
    run, and a new Submit at each requeue)."""
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", str(slurm_job_id), "-o", "Submit,End"],
                         capture_output=True, text=True).stdout.strip().splitlines()

    def stamp(text: str) -> float | None:
        try:
            return datetime.datetime.fromisoformat(text).timestamp()  # the testbed's local time
        except ValueError:
            return None  # "Unknown"

    runs = sorted(((stamp(submit), stamp(end)) for submit, end, *_ in (line.split("|") for line in out)),
                  key=lambda run: run[0] or 0.0)
    if not runs or runs[0][0] is None:
        return None, None
    return runs[0][0], runs[-1][1]


def _step_samples(job_dir: str) -> dict[tuple[str, int], list[float]]:
    """Seconds per step between consecutive progress reports of one group, by (GPU kind, world size); the kind
    is the last start event's ("" where the GPUs name none)."""
    found: dict[tuple[str, int], list[float]] = {}
    last: dict[str, Any] | None = None
    kind = ""
    for event in events(job_dir):
        if event.get("event") == "start":
            kind = str(event.get("gpu_type") or "")
        if event.get("event") != "progress" or "world_size" not in event:
            last = None  # a (re)start: the next report includes restoring
            continue
        if last is not None and last.get("world_size") == event["world_size"] and event["step"] > last["step"]:
            found.setdefault((kind, int(event["world_size"])), []).append(
                (float(event["time"]) - float(last["time"])) / (int(event["step"]) - int(last["step"])))
        last = event
    return found


def step_times(job_dir: str) -> dict[int, float]:
    """Median seconds per step at each world size, from consecutive progress reports of one group."""
    per_world: dict[int, list[float]] = {}
    for (_, world), samples in _step_samples(job_dir).items():
        per_world.setdefault(world, []).extend(samples)
    return {w: statistics.median(v) for w, v in sorted(per_world.items())}


def step_times_by_kind(job_dir: str) -> dict[str, dict[int, float]]:
    """Median seconds per step at each world size on each GPU kind."""
    out: dict[str, dict[int, float]] = {}
    for (kind, world), samples in sorted(_step_samples(job_dir).items()):
        out.setdefault(kind, {})[world] = statistics.median(samples)
    return out


def resize_pauses(job_dir: str, step_of: Callable[[str, int], float]) -> list[float]:
    """Training time lost to each resize (or move to another kind): from the last report before the group
    re-formed to the first after, less the steps done in between at the step time ``step_of(kind, world)``
    of the new group (checkpoint, rendezvous, restore; on a move also the requeue)."""
    lost: list[float] = []
    before: dict[str, Any] | None = None
    restarted = False
    kind = ""
    for event in events(job_dir):
        if event.get("event") == "start":
            restarted = before is not None
            kind = str(event.get("gpu_type") or "")
        elif event.get("event") == "progress" and "world_size" in event:
            if restarted and before is not None:
                step = step_of(kind, int(event["world_size"]))
                lost.append(float(event["time"]) - float(before["time"])
                            - (int(event["step"]) - int(before["step"])) * step)
            before, restarted = event, False
    return lost


def step_on(by_kind: Mapping[str, Mapping[int, float]],
            any_kind: Mapping[int, float] | None = None) -> Callable[[str, int], float]:
    """Step time by (kind, world size): ``by_kind``'s, else ``any_kind``'s at that world size on any kind (0 where
    neither has it)."""
    def step(kind: str, world: int) -> float:
        found = by_kind.get(kind, {}).get(world)
        return found if found is not None else (any_kind or {}).get(world, 0.0)
    return step


def profile_kinds(user: TestbedUser, apps: Sequence[Emulated], args: argparse.Namespace) -> float:
    """Each application's command run on one GPU of each kind until the agent has read three of its reports
    there: what the agent bootstraps a kind a job has not run on from (its memory of this user's earlier runs
    of the same command). Every other GPU is held, so Slurm can only start it there. Seconds taken."""
    started = now()
    kinds = sorted(KIND_NODE)
    for shift in range(len(kinds)):
        _profile_round(user, [(app, kinds[(i + shift) % len(kinds)]) for i, app in enumerate(apps)], args)
    return now() - started


def _profile_round(user: TestbedUser, runs: Sequence[tuple[Emulated, str]], args: argparse.Namespace) -> None:
    """One profile of each application on its kind at once (see :func:`profile_kinds`)."""
    holds = {node: hold_node(user, node=node, name="profile-hold") for node in KIND_NODE.values()}
    jobs: list[tuple[dict[str, Any], str]] = []
    try:
        for app, kind in runs:
            node = KIND_NODE[kind]
            # One GPU of ``node`` free, none elsewhere; the previous command's job is a few seconds old, too young
            # for the agent to move it onto the GPUs freed here meanwhile (a move must beat its restart).
            scancel(holds[node])
            wait_for("the node's hold gone", functools.partial(gone, holds[node]), timeout=60, interval=0.5)
            holds[node] = hold_node(user, node=node, gpus=GPUS_PER_NODE - 1, name="profile-hold")
            job = submit(user, "-p", "gpu", "--time", "20", "--name", f"profile-{app.name}", "--cpus", "1",
                         "--mem", args.mem, "--gpus", f"1:{MAX_GPUS}", TRAIN, "--epochs", str(args.epochs),
                         *app.args())
            jobs.append((job, kind))
            wait_for(f"{app.name}'s profile job to run", functools.partial(running, int(job["slurm_job_id"])),
                     timeout=60, interval=0.5)
        for job, kind in jobs:
            wait_for(f"job {job['id']}: three reports on {kind}",
                     lambda job=job, kind=kind: reports_on(job["job_dir"], kind) >= 3, timeout=240)
        newest = max(float(e["time"]) for job, _ in jobs for e in events(job["job_dir"], "progress"))
        wait_for("a tick of the agent after the profiles' reports", lambda: agent_tick_after(user, newest), timeout=60)
    finally:
        for job, _ in jobs:
            user.dlsub("cancel", job["id"], check=False)
        for job, _ in jobs:
            user.wait_until_ended(job["id"])
        scancel(*holds.values())
        wait_for("the profile holds gone", lambda: gone(*holds.values()), timeout=60, interval=0.5)


def running(slurm_job_id: int) -> bool:
    return (slurm_job(slurm_job_id) or {}).get("job_state") == "RUNNING"


def agent_tick_after(user: TestbedUser, when: float) -> bool:
    """Whether a tick of the agent began after ``when`` (so it has read what was reported by then)."""
    status = json.loads(user.run("dlsub", "agent", "status", "--json", timeout=60).stdout)
    return float(status.get("last_tick") or 0.0) > when


def run_live(live_name: str, jobs: Sequence[JobSpec], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Submit the workload on schedule under ``live_name``; each job's JCT and what it went through."""
    user = TestbedUser(USER)
    wait_testbed_quiet()
    submitted: dict[str, dict[str, Any]] = {}
    ended: dict[str, dict[str, Any]] = {}
    with agent_policy(live_name, "[goodput]\nacross_gpu_types = true" if args.two_kinds else ""):
        if args.two_kinds:
            took = profile_kinds(user, sorted({j.app for j in jobs}, key=lambda a: a.name), args)
            if not args.json:
                print(f"profiles of each command on each kind: {took:.0f} s (before the workload)", flush=True)
            wait_testbed_quiet()
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
        if args.two_kinds:
            by_kind = step_times_by_kind(job["job_dir"])
            rows[-1] |= {"kinds": [e.get("gpu_type") for e in starts], "step_s_by_kind": by_kind,
                         "moves": sum(1 for a in attempts(job["job_dir"])
                                      if a.get("event") == "end" and a.get("action") == "move")}
            lost = resize_pauses(job["job_dir"], step_on(by_kind))
        else:
            lost = resize_pauses(job["job_dir"], step_on({}, rows[-1]["step_s"]))
        rows[-1]["resize_lost_s"] = [round(x, 1) for x in lost]
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
            # On two kinds, each kind's times under the name the traces give the application there (Emulated.on).
            for kind, steps in (row.get("step_s_by_kind") or {}).items():
                for world, step in steps.items():
                    seen.setdefault((f"{row['app']}@{kind}", int(world)), []).append(step)

    def model(app: Emulated, world: int, batch: int) -> float:
        found = seen.get((app.name, world))
        # Only the global batch of 64 ever runs live; other batches (trace points the jobs never use) keep the model.
        if found and batch == BATCH:
            return statistics.median(found)
        return fallback(app, world, batch)

    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default=None,
                        help="live policies, in the order run [goodput,fifo; with --two-kinds goodput]")
    parser.add_argument("--arrivals", default="0,30,60,90",
                        help="submission times, s; the first job and every third after it scale poorly")
    parser.add_argument("--epochs", type=int, default=12, help="per job (22 steps of 64 samples each)")
    parser.add_argument("--poor-throttle", type=float, default=0.4, help="the poor scaler: seconds per step")
    parser.add_argument("--good-per-sample", type=float, default=0.012,
                        help="the good scalers: seconds per sample of a process's share of the batch")
    parser.add_argument("--overhead-s", type=float, default=0.02,
                        help="the traces' real compute per step on the shared cores (elastic_vs_rigid: ~0.02 s)")
    parser.add_argument("--two-kinds", action="store_true",
                        help="the two-kind workload: jobs alternately fast on a100 and on v100 (see above)")
    parser.add_argument("--kind-slowdown", type=float, default=3.0,
                        help="with --two-kinds: how many times slower each application is on its slow kind")
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
    policies = [p for p in (args.policies or ("goodput" if args.two_kinds else "goodput,fifo")).split(",") if p]
    valid = ["goodput"] if args.two_kinds else list(SIM_COUNTERPART)
    for name in policies:
        if name not in valid:
            # policy.toml refuses across_gpu_types under any other policy.
            parser.error(f"--policies: {name!r}; valid{' with --two-kinds' if args.two_kinds else ''}: "
                         f"{', '.join(valid)}")
    arrivals = [float(a) for a in args.arrivals.split(",")]
    apps: list[Emulated]
    if args.two_kinds:
        # Each fast on one kind, --kind-slowdown times slower on the other; the first job and every second after
        # it are fast on a100.
        apps = [Emulated(f"{fast}-fast", per_sample=args.good_per_sample, slowdown=((slow, args.kind_slowdown),))
                for fast, slow in (KINDS, KINDS[::-1])]
    else:
        # The first job and every third after it scale poorly.
        apps = [Emulated("poor", throttle=args.poor_throttle), Emulated("good", per_sample=args.good_per_sample),
                Emulated("good", per_sample=args.good_per_sample)]
    jobs = [JobSpec(f"j{i + 1}-{apps[i % len(apps)].name}", t, apps[i % len(apps)], args.epochs)
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
    out: dict[str, Any] = {"jobs": [dataclasses.asdict(j) for j in jobs], "two_kinds": args.two_kinds,
                           "policies": {}}
    with tempfile.TemporaryDirectory(prefix="dlsub-livesim-") as scratch:
        base = args.keep or Path(scratch)
        for name in policies:
            folder = base / name
            sim, sim_kinds = run_sim(folder, jobs, name, args, model)
            cli = cli_avg_jct(folder, name, args)
            sim_cal = run_sim(base / f"{name}-measured", jobs, name, args, calibrated)[0] if live else None
            out["policies"][name] = {
                "sim_policy": SIM_COUNTERPART[name], "live": live.get(name),
                "sim": [dataclasses.asdict(r) | {"jct_s": r.jct_s, "kinds": sim_kinds.get(r.name)} for r in sim.jobs],
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
    kinds = (f" ({', '.join(f'{node} {kind}' for kind, node in sorted(KIND_NODE.items()))}; each application "
             f"{args.kind_slowdown:g}x slower on its slow kind, goodput across GPU kinds; the sim charges no profile)"
             if args.two_kinds else "")
    print(f"\n{len(jobs)} jobs elastic in GPUs (--gpus 1:{MAX_GPUS}, {args.epochs} epochs x "
          f"{steps_per_epoch()} steps) at {args.arrivals} s on {NODES} nodes x {GPUS_PER_NODE} GPUs{kinds}; sim: "
          f"interval {args.tick} s, restart penalty {args.restart_penalty} s, online information")
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
          "restarts)" + ("; then each start's kind:world size live (moves), and the sim's kind:GPUs at each change "
                         "(@ s after arrival)" if args.two_kinds else ""))
    for name, res in out["policies"].items():
        sims = {r["name"]: r for r in res["sim"]}
        for i, spec in enumerate(jobs):
            row = res["live"][i] if res["live"] else None
            s = sims[spec.name]
            live_text = (f"{fmt(row['jct_s'])} s ({fmt(row['first_start_s'], '4.1f')} s, {row['resizes']}, "
                         f"{row['world_sizes']})" if row else "-")
            if row and row["state"] != "COMPLETED":
                live_text += f" {row['state']}"  # its JCT is still to its end, but say it did not complete
            start = None if s["start_s"] is None else s["start_s"] - s["arrival_s"]
            print(f"  {name:<8} {spec.name:<8} live {live_text:<36} sim {fmt(s['jct_s'])} s "
                  f"({fmt(start, '4.1f')} s, {s['restarts']})")
            if args.two_kinds:
                live_kinds = (" ".join(f"{k}:{w}" for k, w in zip(row["kinds"], row["world_sizes"], strict=True))
                              + f" ({row['moves']} moves)" if row else "-")
                sim_kinds = " ".join(f"{k}:{g}@{t - s['arrival_s']:.0f}" for t, k, g in s["kinds"] or [])
                print(f"  {'':<8} {'':<8} live {live_kinds:<36} sim {sim_kinds}")
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
        if args.two_kinds:
            fast = {j.name: j.app.name.split("-")[0] for j in jobs}
            slow_live = [r["name"] for r in live_rows if r.get("kinds") and r["kinds"][0] != fast[r["name"]]]
            slow_sim = [r["name"] for r in res["sim"] if r["kinds"] and r["kinds"][0][1] != fast[r["name"]]]
            print(f"  kinds under {name}: started on the slow kind live {', '.join(slow_live) or 'none'} (Slurm starts "
                  f"a main job on any idle GPU; the agent moves it once its figures beat the restart: "
                  f"{sum(r.get('moves', 0) for r in live_rows)} moves, each counted among the resizes' losses above "
                  f"with its requeue), in the sim {', '.join(slow_sim) or 'none'} (the policy chooses the kind at "
                  "the start); the profiles of each kind ran before the workload live, free in the sim")
    seen: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        by_kind = r.get("step_s_by_kind")
        for kind, steps in (by_kind.items() if by_kind else [("", r["step_s"])]):
            for world, step in steps.items():
                seen.setdefault((f"{r['app']}@{kind}" if kind else r["app"], int(world)), []).append(step)
    apps = {j.app.name: j.app for j in jobs} | {j.app.on(k).name: j.app.on(k) for j in jobs for k in KINDS}
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
