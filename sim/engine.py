"""The simulation loop: advance every job one interval, then let the policy decide.

Time moves in scheduling intervals (60 s). Inside an interval a job runs
at the goodput of its placement and batch size, crossing epoch boundaries
at the exact second (an adaptive job re-tunes its batch size between epochs,
and in Sia's setting after every interval); a job whose GPUs change pays the restart penalty
(30 s without progress) first, its first start included, unless the change is a resize in place
(:func:`resized_in_place`: the same kind of GPUs, grown onto a superset or shrunk onto a subset of the
GPUs per node it held), which pays the resize penalty (``SimConfig.resize_penalty_s``, measured; a shrink
``SimConfig.shrink_penalty_s`` where that is set). A job holding
fewer GPUs than it needs to run (a partial gang) holds them and makes no
progress.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dlsub.policies.api import Allocation, ClusterView, JobView, Policy, check_decision
from dlsub.sim import sia_setting
from dlsub.sim.apps import Application, BatchConfig, TraceError, load_application
from dlsub.sim.information import Information, OracleInformation, command_of, information_for
from dlsub.sim.profile_cost import (
    MEASURED_BATCH_STARTUP_S,
    MEASURED_STARTUP_S,
    MEASURED_TEARDOWN_S,
    PROFILE_COSTS,
    PROFILE_MIN_S,
    PROFILE_STEPS,
    modelled_profile_s,
)
from dlsub.sim.workload import WorkloadError, WorkloadJob

# Pollux ran ncf at a fixed batch size of 32768 on one GPU.
FIXED_BATCH = {"ncf": 32768}
MAX_REPLICAS = 64


@dataclass(frozen=True)
class SimConfig:
    interval_s: int = 60
    restart_penalty_s: int = 30
    # Seconds without progress after a resize in place (resized_in_place); any other change of GPUs (a move
    # to other nodes or another GPU kind, a start after waiting) pays a restart, the first start included.
    # 6.0: a grow as dlsub resizes in process (issue 52: the staying ranks go on, the new worker's processes
    # join them), measured on the testbed on 3 Dec 2026 (`benchmarks/resize_latency.py --both --samples 5`,
    # median, decision -> first step at the new size): 6.0 s across nodes (4.7-6.5), 3.6 s within a node
    # (3.5-3.7); the larger, as the simulator does not tell the two apart. A training that does not re-form
    # in process restarts from a checkpoint instead: 8.2 s across nodes, 5.9 s within one (the same runs).
    # None: a resize costs a restart, as before issue 52 (the figures published before then; `--resize-penalty
    # restart`). 0: free resizes, a bound. Never more than the job's restart: a resize is that restart's path
    # without the move.
    resize_penalty_s: float | None = 6.0
    # What a resize in place that takes GPUs away (a shrink) costs; None: the same as resize_penalty_s. 0.4:
    # the staying ranks re-form in process without the leaving ones, the same runs: 0.4 s across nodes
    # (0.4-0.5), 0.3 s within a node (0.3-0.4). Never more than the job's restart either.
    shrink_penalty_s: float | None = 0.4
    seed: int = 0
    arrival_jitter_s: float = 0.0
    # What a policy that learns is told: "online" (only what the live agent
    # could see) or "oracle" (see dlsub.sim.information).
    information: str = "online"
    # Where a job's history across jobs comes from, online: "none", the
    # workload's "columns" (user, command) or the "one-user" assumption.
    history: str = "none"
    # Stop when nothing has progressed for this long while jobs wait (a deadlock).
    stall_limit_s: float = 6 * 3600.0
    max_time_s: float = 60 * 24 * 3600.0
    # "sia": Sia's per-application slowdowns and restart penalties, and batch sizes re-tuned every interval
    # (see sia_setting).
    calibration: str = "none"
    # On a cluster of several GPU types, what a policy that reads each job's one-GPU profile of every type
    # (``profiles_types``: goodput) pays for it. ``profile_s``: how long one profile runs, a few steps on one
    # GPU of a type. ``profile``: when it runs (PROFILE_MODES).
    profile_s: float = 60.0
    profile: str = "before"
    # "before" only: the profile's step on the type where the job runs fastest is kept as its first report
    # there (one GPU, its first batch), so that its model there exists at its first start, which may then be
    # wider than one GPU; the other types are bootstrapped from it, as after any run. (False: the profiles'
    # throughputs alone, the first start on one GPU.)
    profile_report: bool = True
    # "before" only, for a policy whose ``profile_batches`` is above 1: the seconds each batch size beyond the
    # first adds to the profile (a few more steps of the run already started on that GPU, no new start), so
    # the job's first start waits profile_s plus this for each.
    profile_batch_s: float = 20.0
    # How the "before" profile's wait is charged (sim/profile_cost.py, issue 54): "flat", profile_s and
    # profile_batch_s above, assumed (every figure before the measurement); "steps", modelled: the measured
    # start-up (profile_startup_s), then dlsub estimate's timed steps (profile_steps, at least profile_min_s)
    # at the job's own step on one GPU of each type (so a slow type or a slow model costs more), the types
    # side by side; each further batch size profile_batch_startup_s plus its own timed steps.
    # The defaults: the testbed's measured start-up and end (6.3 s, a floor: sim/profile_cost.py). "flat" with
    # profile_s 60 and profile_batch_s 20 gives back the figures run before (goodput_vs_sia.py --profile-cost flat).
    profile_cost: str = "steps"
    profile_startup_s: float = MEASURED_STARTUP_S + MEASURED_TEARDOWN_S
    profile_steps: int = PROFILE_STEPS
    profile_min_s: float = PROFILE_MIN_S
    profile_batch_startup_s: float = MEASURED_BATCH_STARTUP_S


# When a job's one-GPU profiles of the GPU types run, for a policy that reads them (SimConfig.profile):
# - "before": all of them before its first start, which waits profile_s longer holding its GPUs (counted in
#   its GPU-hours); the policy knows every type's profile from the job's arrival.
# - "beside": each on one GPU of its type left idle by a decision, while the job waits or runs (a live agent
#   submits the profile as a short job of its own on that type's partition, as `dlsub estimate` profiles a
#   partition). The job never waits for it; each profile's GPU-seconds are counted in its GPU-hours; the
#   policy knows a type's profile from the next decision on (profile_s is at most one interval, so the
#   profile's GPU is free again by then: no other job is placed on it meanwhile). A type with no idle GPU is
#   profiled at a later decision; the type a job first starts on needs none (its own first run measures it).
# - "history": none runs; a type is known to a job once it, or an earlier run of its command (SimConfig.history
#   says whose runs those are), has run there: what the live agent does (agent/live_models.py, per_kind), at
#   no cost. A job of a command new to the cluster knows only the types it has run on.
PROFILE_MODES = ("before", "beside", "history")


@dataclass
class SimJob:
    spec: WorkloadJob
    app: Application
    arrival_s: float
    lo: int
    hi: int
    gpus: int
    batch_size: int
    adaptive: bool
    info: Information = field(default_factory=OracleInformation)
    progress: float = 0.0
    epoch: int = 0
    attained_gpu_s: float = 0.0
    alloc: Allocation | None = None
    config: BatchConfig | None = None
    penalty_left: float = 0.0
    starts: int = 0
    first_start_s: float | None = None
    completion_s: float | None = None
    running_since_s: float | None = None
    waiting_since_s: float | None = None
    # On a cluster with GPU types: the application's traces per type, and the type it runs on (or last ran on).
    apps: dict[str, Application] = field(default_factory=dict)
    gpu_type: str = ""
    slowdown: float = 1.0  # progress runs this many times slower than the traces (calibration)
    restart_s: float | None = None  # its own restart penalty, when the setting has one per application
    told_restart_s: float | None = None  # what a policy is told a restart costs it (the setting's)
    resize_s: float | None = None  # what a resize in place costs it (None: a restart; SimConfig.resize_penalty_s)
    told_resize_s: float | None = None  # what a policy is told a resize in place costs it (None: a restart)
    shrink_s: float | None = None  # what a shrink in place costs it (None: a restart; SimConfig.shrink_penalty_s)
    resizes: int = 0  # reallocations that were resizes in place (of its restarts, starts - 1)
    profile_s: float = 0.0  # added to its first start: its profile of every GPU type (SimConfig.profile_s)
    # The types whose one-GPU profile the policy is told (None: every type's; SimConfig.profile "beside" or "history").
    profiled: frozenset[str] | None = None
    profile_reported: bool = False  # SimConfig.profile_report: its profile is among its reports already

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def epochs(self) -> int:
        return self.spec.epochs if self.spec.epochs is not None else self.app.epochs

    @property
    def done(self) -> bool:
        return self.completion_s is not None

    @property
    def placement(self) -> tuple[int, ...]:
        return self.alloc.placement if self.alloc else ()

    def can_run(self) -> bool:
        return self.alloc is not None and self.lo <= self.alloc.gpus

    def _choose_config(self) -> None:
        assert self.alloc is not None
        replicas = self.alloc.gpus
        if self.adaptive:
            # The job tunes its batch on what it knows (its own reports, online).
            batch = self.info.model(self).best_batch(self.placement)[0]
        else:
            batch = self.alloc.batch_size or self.batch_size
        self.config = self.app.batch_config(replicas, batch)

    def reallocate(self, alloc: Allocation | None, now: float, penalty_s: float, gpu_type: str = "") -> None:
        """Give the job ``alloc`` (on ``gpu_type``, on a typed cluster) from ``now``. It pays a restart
        (``penalty_s``, or its own ``restart_s``), or, where the change is a resize in place and resizes have
        a price of their own, that: ``shrink_s`` where it takes GPUs away, else ``resize_s``."""
        if alloc is None or alloc.gpus == 0:
            self.alloc, self.config = None, None
            self.running_since_s, self.waiting_since_s = None, now
            return
        in_place = resized_in_place(self.alloc, alloc, self.gpu_type, gpu_type or self.gpu_type)
        shrink = in_place and self.alloc is not None and alloc.gpus < self.alloc.gpus
        resize_s = self.shrink_s if shrink else self.resize_s
        if gpu_type != self.gpu_type and gpu_type in self.apps:
            # A new kind of GPU: its traces from now on; the progress (type-independent) is the checkpoint's.
            self.gpu_type, self.app = gpu_type, self.apps[gpu_type]
        if self.restart_s is not None:
            penalty_s = self.restart_s
        if in_place and resize_s is not None:
            penalty_s = min(resize_s, penalty_s)
            self.resizes += 1
        self.alloc = alloc
        if self.adaptive and alloc.batch_size:
            self.config = self.app.batch_config(alloc.gpus, alloc.batch_size)
        else:
            self._choose_config()
        self.penalty_left = penalty_s + (self.profile_s if self.starts == 0 else 0.0)
        self.starts += 1
        if self.first_start_s is None:
            self.first_start_s = now
        if self.profiled is not None:
            self.profiled |= {self.gpu_type}  # its run there measures it
        self.running_since_s, self.waiting_since_s = now, None

    def advance(self, start: float, seconds: float) -> bool:
        """Run from ``start`` for ``seconds``; True when progress was made."""
        if self.done or self.alloc is None:
            return False
        gpus = self.alloc.gpus
        if not self.can_run():
            return False
        clock = start
        delay = min(self.penalty_left, seconds)
        self.penalty_left -= delay
        self.attained_gpu_s += delay * gpus
        clock += delay
        seconds -= delay
        progressed = False
        while seconds > 0 and not self.done:
            assert self.config is not None
            batch = self.config.total(gpus)
            rate = self.app.efficiency(batch, self.epoch) / self.app.step_time(self.placement, self.config)
            rate /= self.slowdown
            epoch_end = self.app.progress_at(self.epoch + 1)
            progressed = True
            if self.progress + rate * seconds < epoch_end:
                self.progress += rate * seconds
                self.attained_gpu_s += seconds * gpus
                seconds = 0
            else:
                delta = min(seconds, round((epoch_end - self.progress) / rate))
                self.epoch += 1
                self.progress = epoch_end
                clock += delta
                self.attained_gpu_s += delta * gpus
                seconds -= delta
                if self.epoch >= self.epochs:
                    self.completion_s = clock
                elif self.adaptive:
                    self._choose_config()  # batch size re-tuned between epochs
        return progressed

    @property
    def remaining(self) -> float:
        return max(self.app.progress_at(self.epochs) - self.progress, 0.0)

    def view(self) -> JobView:
        return self.info.view(self)


def resized_in_place(old: Allocation | None, new: Allocation, old_type: str, new_type: str) -> bool:
    """Whether going from ``old`` to ``new`` is a resize in place: a running job on the same kind of GPUs,
    grown onto a superset or shrunk onto a subset of the GPUs it held on each node (the live agent's jobs
    grow by adding workers and shrink by sending some away; dlsub re-forms the group on the GPUs it keeps).
    Anything else, a move to other nodes or another kind, or a reshape that is neither, is a restart."""
    if old is None or old_type != new_type:
        return False
    held, given = Counter(old.nodes), Counter(new.nodes)
    return held != given and (held <= given or given <= held)


def resize_cost(config: SimConfig, restart_s: float | None, shrink: bool = False) -> float | None:
    """What a resize in place costs a job whose restart costs ``restart_s`` (None: the config's restart
    penalty): SimConfig.resize_penalty_s (``shrink``: SimConfig.shrink_penalty_s, where that is set), never
    more than its restart; None where resizes cost a restart.
    In Sia's calibration (per-application restarts, which Sia's paper measured; it measured no resize) a
    resize costs the same measured seconds for every application: dlsub's figure, measured on a small
    model, so for an application whose restart is mostly its own loading (imagenet's 250 s) a lower bound."""
    penalty_s = config.resize_penalty_s
    if shrink and config.shrink_penalty_s is not None:
        penalty_s = config.shrink_penalty_s
    if penalty_s is None:
        return None
    return min(penalty_s, config.restart_penalty_s if restart_s is None else restart_s)


RESTART_COST = "restart"  # a resize cost spelt as the benchmarks' --resize-costs spell it: a resize costs a restart


def resize_cost_label(cost: object) -> str:
    """A resize cost as the benchmarks' --resize-costs spell it and key their runs: ``restart`` (None too),
    seconds (``10``, ``0``, ``2.5``: a grow and a shrink alike), or ``GROW/SHRINK`` seconds (``9.3/0.6``).
    Raises ValueError for anything else."""
    if cost is None or cost == RESTART_COST:
        return RESTART_COST
    parts = str(cost).split("/")
    if len(parts) > 2:
        raise ValueError(f"resize cost {cost!r}: restart, SECONDS or GROW/SHRINK seconds")
    seconds = [float(part) for part in parts]
    if any(not math.isfinite(s) or s < 0 for s in seconds):
        raise ValueError(f"resize cost {cost!r}: seconds must be finite and at least 0")
    if len(seconds) == 2 and seconds[0] == seconds[1]:
        seconds = seconds[:1]  # 10/10 is 10
    return "/".join(f"{s:g}" for s in seconds)


def resize_penalties(cost: object) -> tuple[float | None, float | None]:
    """A resize cost (:func:`resize_cost_label`) as (SimConfig.resize_penalty_s, SimConfig.shrink_penalty_s):
    ``restart`` (None, None); seconds (S, None: a shrink costs a grow's); ``GROW/SHRINK`` (GROW, SHRINK)."""
    label = resize_cost_label(cost)
    if label == RESTART_COST:
        return None, None
    grow, _, shrink = label.partition("/")
    return float(grow), float(shrink) if shrink else None


def dlsub_resize_cost(costs: Sequence[str]) -> str | None:
    """Of the benchmarks' resize costs (labels), the one the systems comparison gives dlsub: the first
    ``GROW/SHRINK`` entry (grows and shrinks measured apart), else the first other than ``restart`` and 0
    (the bounds); None when there is none."""
    labels = [resize_cost_label(cost) for cost in costs]
    return next((c for c in labels if "/" in c), None) or next((c for c in labels if c not in (RESTART_COST, "0")),
                                                                None)


@dataclass(frozen=True)
class JobResult:
    name: str
    application: str
    arrival_s: float
    start_s: float | None
    completion_s: float | None
    restarts: int
    gpu_s: float
    resizes: int = 0  # of its restarts, those that were resizes in place (resized_in_place)

    @property
    def jct_s(self) -> float | None:
        return None if self.completion_s is None else self.completion_s - self.arrival_s


@dataclass
class Sample:
    time_s: float
    allocated_gpus: int
    running_jobs: int
    waiting_jobs: int


@dataclass
class SimResult:
    policy: str
    workload: str
    total_gpus: int
    jobs: list[JobResult]
    timeline: list[Sample] = field(default_factory=list)
    stalled: bool = False
    wall_s: float = 0.0
    information: str = "oracle"  # what the policy was told (see information.py)
    history: str = "none"  # whose earlier runs online fits started from (see information.py)

    def summary(self) -> dict[str, object]:
        jcts = sorted(j.jct_s for j in self.jobs if j.jct_s is not None)
        done = [j for j in self.jobs if j.completion_s is not None]
        first = min((j.arrival_s for j in self.jobs), default=0.0)
        end = max((j.completion_s for j in done if j.completion_s is not None), default=first)
        span = [s for s in self.timeline if s.time_s <= end] or self.timeline
        util = sum(s.allocated_gpus for s in span) / (len(span) * self.total_gpus) if span else 0.0
        return {
            "policy": self.policy,
            "workload": self.workload,
            "information": self.information,
            "history": self.history,
            "jobs": len(self.jobs),
            "completed": len(done),
            "stalled": self.stalled,
            "avg_jct_s": round(sum(jcts) / len(jcts), 1) if jcts else None,
            "p50_jct_s": round(_percentile(jcts, 50), 1) if jcts else None,
            "p99_jct_s": round(_percentile(jcts, 99), 1) if jcts else None,
            "makespan_s": round(end - first, 1) if len(done) == len(self.jobs) else None,
            "gpu_utilization": round(util, 4),
            "restarts": sum(j.restarts for j in self.jobs),
            "resizes": sum(j.resizes for j in self.jobs),
            "gpu_h_per_job": round(sum(j.gpu_s for j in self.jobs) / 3600 / len(self.jobs), 3) if self.jobs else None,
            "wall_s": round(self.wall_s, 2),
        }


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    rank = (len(sorted_values) - 1) * pct / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo))


def profile_batches(policy: Policy) -> int:
    """How many batch sizes the policy's one-GPU profile times on a job's fastest type (its
    ``profile_batches``; 1 where it names none): SimConfig.profile_report keeps each as a report."""
    return max(1, int(getattr(policy, "profile_batches", 1)))


def make_jobs(
    workload: Sequence[WorkloadJob], traces_dir: Path, policy: Policy, config: SimConfig,
    cluster: ClusterView | None = None,
) -> list[SimJob]:
    """The jobs as the policy's kind runs them: rigid at the workload's tuned
    settings, elastic with the tuned batch size, or adaptive (GPUs and batch).

    On a cluster with GPU types each job reads its application's traces for
    every type; a policy that is not ``type_aware`` sizes a job to at most
    the smallest type's GPUs (see sia_setting)."""
    gpu_types = cluster.gpu_types() if cluster is not None else []
    type_cap = MAX_REPLICAS
    if gpu_types and cluster is not None and not getattr(policy, "type_aware", False):
        type_cap = min(sum(node.gpus for node in cluster.nodes if node.gpu_type == t) for t in gpu_types)
    elastic = getattr(policy, "elastic", False)
    adapts = getattr(policy, "adapts_batch", False)
    profiles = len(gpu_types) > 1 and getattr(policy, "profiles_types", False)
    flat_s = config.profile_s if profiles and config.profile == "before" and config.profile_cost == "flat" else 0.0
    if flat_s > 0 and config.profile_report:
        flat_s += config.profile_batch_s * (profile_batches(policy) - 1)
    modelled = profiles and config.profile == "before" and config.profile_cost == "steps"
    profiled = frozenset[str]() if profiles and config.profile in ("beside", "history") else None
    rng = random.Random(config.seed)
    info = information_for(config.information, policy, config.history)
    if config.history == "columns" and not any(spec.user and spec.command for spec in workload):
        raise WorkloadError("--history columns needs the workload's user and command columns; this workload "
                            "states neither, so no job has a known earlier run")
    jobs = []
    for spec in workload:
        trace = traces_dir / spec.application
        if not trace.is_dir():
            known = sorted(p.name for p in traces_dir.iterdir() if p.is_dir())
            raise WorkloadError(
                f"job {spec.name}: no traces for application {spec.application!r} in {traces_dir}; "
                f"known: {', '.join(known)}"
            )
        try:
            apps = {t: load_application(trace, t) for t in gpu_types}
        except TraceError as exc:
            raise WorkloadError(f"job {spec.name}: {exc}") from None
        app = apps[gpu_types[0]] if gpu_types else load_application(trace)
        if spec.epochs is not None and spec.epochs > len(app.epoch_end):
            raise WorkloadError(f"job {spec.name}: {spec.epochs} epochs declared; the traces of "
                                f"{app.name} measure {len(app.epoch_end)}")
        fixed = FIXED_BATCH.get(app.name)
        adaptive = adapts and fixed is None
        batch = fixed if (adapts and fixed) else spec.batch_size
        if not elastic:
            lo = hi = spec.num_replicas
        elif adaptive:
            lo, hi = 1, max(1, min(MAX_REPLICAS, app.max_batch_size // app.min_local_bsz))
        else:
            lo, hi = 1, max(1, min(MAX_REPLICAS, batch // app.min_local_bsz))
        if app.name in FIXED_BATCH and elastic:
            hi = 1  # as in the Pollux evaluation
        if elastic:
            hi = max(lo, min(hi, type_cap))
        jitter = rng.uniform(0, config.arrival_jitter_s) if config.arrival_jitter_s else 0.0
        restart_s = (sia_setting.restart_s(config.calibration, app.name, config.restart_penalty_s)
                     if config.calibration != "none" else None)
        told_restart_s = sia_setting.told_restart_s(config.calibration, app.name)
        slowdown = sia_setting.slowdown(config.calibration, app.name)
        # The profile's wait (SimConfig.profile_cost): the batches timed as observe_profile records them.
        profile_s = flat_s if not modelled else modelled_profile_s(
            apps, app.init_batch_size if adaptive else batch, adaptive,
            profile_batches(policy) if config.profile_report else 1,
            startup_s=config.profile_startup_s, batch_startup_s=config.profile_batch_startup_s,
            steps=config.profile_steps, min_s=config.profile_min_s, slowdown=slowdown)
        job = SimJob(spec, app, spec.arrival_s + jitter, lo, hi, spec.num_replicas, batch, adaptive, info,
                     apps=apps, gpu_type=gpu_types[0] if gpu_types else "",
                     slowdown=slowdown,
                     restart_s=restart_s, told_restart_s=told_restart_s,
                     resize_s=resize_cost(config, restart_s), told_resize_s=resize_cost(config, told_restart_s),
                     shrink_s=resize_cost(config, restart_s, shrink=True),
                     profile_s=profile_s, profiled=profiled)
        jobs.append(job)
    return jobs


def one_type(alloc: Allocation, type_of: dict[str, str], job: SimJob) -> tuple[Allocation, str]:
    """The allocation on one GPU type: the type that holds most of its GPUs (a tie: the type where the job
    runs fastest on one GPU), and that type."""
    counts: dict[str, int] = {}
    for node in alloc.nodes:
        counts[type_of[node]] = counts.get(type_of[node], 0) + 1
    if len(counts) == 1:
        return alloc, next(iter(counts))
    kept = max(counts, key=lambda t: (counts[t], job.apps[t].one_gpu_throughput if t in job.apps else 0.0))
    return Allocation(tuple(node for node in alloc.nodes if type_of[node] == kept), alloc.batch_size), kept


def start_profiles(jobs: Sequence[SimJob], cluster: ClusterView, type_of: dict[str, str], profile_s: float) -> None:
    """SimConfig.profile "beside": after a decision, each job (in arrival order) still owed the profile of a
    type gets it on one GPU of that type the decision left idle, if there is one; its GPU-seconds are the
    job's. The policy is told the profile from the next decision on."""
    idle: dict[str, int] = {}
    for node in cluster.nodes:
        idle[node.gpu_type] = idle.get(node.gpu_type, 0) + node.gpus
    for job in jobs:
        for name in job.alloc.nodes if job.alloc is not None else ():
            idle[type_of[name]] -= 1
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        if job.profiled is None:
            continue
        for gpu_type in sorted(set(job.apps) - job.profiled):
            if idle.get(gpu_type, 0) > 0:
                idle[gpu_type] -= 1
                job.profiled |= {gpu_type}
                job.attained_gpu_s += profile_s


def share_profiles(jobs: Sequence[SimJob], ran_on: dict[tuple[str, ...], set[str]], history: str) -> None:
    """SimConfig.profile "history": after a decision, each job is told the types its command's runs had run
    on before it (told from the next decision on, once they have reported); then this decision's starts are
    added to what its command has run on."""
    for job in jobs:
        command = command_of(job, history)
        if job.profiled is not None and command is not None and command in ran_on:
            job.profiled |= ran_on[command]
    for job in jobs:
        command = command_of(job, history)
        if job.alloc is not None and command is not None:
            ran_on.setdefault(command, set()).add(job.gpu_type)


def run_interval(job: SimJob, start: float, seconds: float, retune: bool = False) -> bool:
    """Run the job one interval from ``start`` and take its report; True when it progressed. ``retune``:
    an adaptive job that progressed then picks its batch size again, on what it has reported so far (Sia's
    artifact, ``job.py``: ``step`` ends each pass with ``update_local_bsz``); else only between epochs and
    when its GPUs change."""
    if not job.advance(start, seconds):
        return False
    job.info.observe(job)
    if retune and job.adaptive and not job.done:
        job._choose_config()
    return True


ProgressFn = Callable[[int, int], None]


def simulate(
    workload: Sequence[WorkloadJob],
    traces_dir: Path,
    policy: Policy,
    cluster: ClusterView,
    config: SimConfig = SimConfig(),
    *,
    workload_name: str = "",
    on_progress: ProgressFn | None = None,
) -> SimResult:
    wall = time.perf_counter()
    if config.calibration not in sia_setting.CALIBRATIONS:
        raise WorkloadError(f"unknown calibration {config.calibration!r}; valid: "
                            f"{', '.join(sia_setting.CALIBRATIONS)}")
    if config.profile not in PROFILE_MODES:
        raise WorkloadError(f"unknown profile mode {config.profile!r}; valid: {', '.join(PROFILE_MODES)}")
    if config.profile_cost not in PROFILE_COSTS:
        raise WorkloadError(f"unknown profile cost {config.profile_cost!r}; valid: {', '.join(PROFILE_COSTS)}")
    if config.profile == "beside" and not 0 <= config.profile_s <= config.interval_s:
        raise WorkloadError(f"a profile run beside the job takes at most one interval ({config.interval_s} s), "
                            f"so that its GPU is free by the next decision; got {config.profile_s} s")
    if config.profile == "history" and config.history == "none":
        raise WorkloadError("profile mode 'history' learns a type from earlier runs of a job's command: it needs "
                            "a history source (SimConfig.history 'columns' or 'one-user')")
    jobs = make_jobs(workload, traces_dir, policy, config, cluster)
    ran_on: dict[tuple[str, ...], set[str]] = {}  # SimConfig.profile "history": the types each command ran on
    type_of = cluster.type_of()
    typed = bool(cluster.gpu_types())
    splits_types = getattr(policy, "splits_types", False)
    retunes = sia_setting.retunes_each_interval(config.calibration)
    for job in jobs:
        if job.lo > cluster.total_gpus:
            raise WorkloadError(f"job {job.name} needs {job.lo} GPUs; the cluster has {cluster.total_gpus}")
    told = jobs[0].info.mode if jobs else ""
    history = config.history if told == "online" else "none"
    result = SimResult(policy.name, workload_name, cluster.total_gpus, [], information=told, history=history)
    now = 0.0
    last_progress = 0.0
    while not all(job.done for job in jobs):
        moved = False
        for job in jobs:
            if run_interval(job, now, config.interval_s, retunes):
                moved = True
        now += config.interval_s
        active = [job for job in jobs if job.arrival_s <= now and not job.done]
        if moved or not any(job.alloc for job in active):
            last_progress = now
        if now - last_progress > config.stall_limit_s or now > config.max_time_s:
            result.stalled = True
            break
        for job in jobs:
            if job.done and job.alloc is not None:
                job.alloc = None
        for job in active:
            if job.waiting_since_s is None and job.alloc is None:
                job.waiting_since_s = job.arrival_s
        if config.profile == "before" and config.profile_report:
            for job in active:
                if job.profile_s > 0 and not job.profile_reported:
                    job.info.observe_profile(job, profile_batches(policy))
                    job.profile_reported = True
        views = [job.view() for job in active]
        previous = {job.name: job.alloc for job in active if job.alloc is not None}
        decision = policy.decide(views, cluster, now, previous)
        # Only a policy that says so may leave a job holding less than it needs.
        check_decision(decision, views, cluster, allow_partial=getattr(policy, "holds_partial", False))
        for job in active:
            new, old = decision.get(job.name), previous.get(job.name)
            if new is not None and new.gpus == 0:
                new = None
            gpu_type = ""
            if new is not None and typed:
                if splits_types:  # a synchronous job runs at the pace of its slowest GPUs
                    gpu_type = min({type_of[node] for node in new.nodes},
                                   key=lambda t: job.apps[t].one_gpu_throughput)
                else:
                    new, gpu_type = one_type(new, type_of, job)
            if new is None and old is None:
                continue
            if new is not None and new.same_gpus(old):
                if new.batch_size != (old.batch_size if old else None) and job.adaptive and new.batch_size:
                    job.alloc = new  # a new batch size needs no restart
                    job.config = job.app.batch_config(new.gpus, new.batch_size)
                continue
            job.reallocate(new, now, config.restart_penalty_s, gpu_type)
        if config.profile == "beside" and typed:
            start_profiles(active, cluster, type_of, config.profile_s)
        elif config.profile == "history" and typed:
            share_profiles(active, ran_on, config.history)
        result.timeline.append(
            Sample(
                now,
                sum(job.alloc.gpus for job in active if job.alloc is not None),
                sum(1 for job in active if job.alloc is not None),
                sum(1 for job in active if job.alloc is None),
            )
        )
        if on_progress is not None:
            on_progress(sum(job.done for job in jobs), len(jobs))
    result.jobs = [
        JobResult(
            job.name,
            job.app.name,
            job.arrival_s,
            job.first_start_s,
            job.completion_s,
            max(job.starts - 1, 0),
            job.attained_gpu_s,
            job.resizes,
        )
        for job in jobs
    ]
    result.wall_s = time.perf_counter() - wall
    return result
