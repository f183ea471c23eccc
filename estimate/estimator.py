"""``dlsub estimate``: profile a script through Slurm, then predict per partition and batch size.

Each profiling run is a real dlsub job (the submit path, its container and
its checks), one per (partition role, kind of GPU, batch size; see
:mod:`dlsub.estimate.gpu_kinds`), with ``DLSUB_BATCH_SIZE``
and ``DLSUB_PROFILE_STEPS``/``DLSUB_PROFILE_SECONDS`` in its environment, so
the library stops it by itself once it has measured enough. Runs that may land
on a common node go one at a time (``--dependency=singleton`` on a shared
name): profiles that share a node's cores or memory bandwidth would each
measure the other. Partitions of separate nodes profile at once
(:func:`profile_queues`; ``--one-at-a-time`` and ``--parallel`` choose one
queue, or one per partition and kind).
Profiles are cached (:mod:`dlsub.estimate.profile_cache`); Ctrl-C cancels the
runs still queued or running.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dlsub.containers.exports import Exported
from dlsub.containers.mounts import MountRequest
from dlsub.contract import (
    ATTEMPTS_FILE,
    ENV_BATCH_SIZE,
    ENV_PROFILE_SECONDS,
    ENV_PROFILE_STEPS,
    PROGRESS_FILE,
    JobState,
)
from dlsub.estimate.apply_choice import with_env
from dlsub.estimate.gpu_kinds import Target, profiled_targets
from dlsub.estimate.partition_fit import FitError, ProfileRun, fit_partition, profile_from_events
from dlsub.estimate.profile_cache import EstimateCache, profile_key
from dlsub.estimate.recommend import Horizon, Knobs, PartitionFacts, build_rows, recommend
from dlsub.job.settings import Settings
from dlsub.job.submit import SubmitError, SubmitRequest, check_script, plan_job, submit_plan
from dlsub.job.user_store import JobStore
from dlsub.job_progress import read_events
from dlsub.site_config.cost import Prices
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.models import Partition, SlurmNode

PROFILE_STEPS = 30
PROFILE_SECONDS = 2.0
PROFILE_LIMIT_MIN = 5
ROLE_ORDER = ("gpu", "dev", "cpu")
#: How the profiling runs queue: "one" (--one-at-a-time), "by-node" (the default), "each" (--parallel).
ProfileQueues = Literal["one", "by-node", "each"]


@dataclass(frozen=True)
class EstimateRequest:
    script: Path
    args: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    horizon: Horizon
    workdir: Path
    gpus: int = 0
    nodes: int = 1
    cpus: int | None = None
    mem_mb: int | None = None
    image: str | None = None
    partition: str | None = None
    batch_arg: str = "--batch-size"
    use_cache: bool = True
    queues: ProfileQueues = "by-node"
    profile_steps: int = PROFILE_STEPS
    profile_seconds: float = PROFILE_SECONDS
    # The user's --mount/--mount-rw paths (the site's shared mounts come from the policy), as for submit.
    mounts: tuple[MountRequest, ...] = ()
    # --gpu-type: profile and predict only these kinds of GPU (partitions without GPUs stay); empty: every kind.
    gpu_types: frozenset[str] = frozenset()
    # --export and --venv, as for submit: the profiling runs see the environment the job will.
    exports: Exported = Exported()
    venv: str | None = None
    # The site's image per partition (policy.toml [containers] partition_images; none when the user names an
    # image): each partition's runs use its own, as the job's attempts there will.
    partition_images: tuple[tuple[str, str], ...] = ()

    def image_on(self, partition: str, image: str) -> str:
        """The image a run on ``partition`` uses: the site's for that partition, else ``image``."""
        return dict(self.partition_images).get(partition, image)

    def environment(self) -> str:
        """What of the user's environment the runs see, for the profiles' cache key ("": none of it)."""
        if not self.exports.env and not self.exports.python_path and self.venv is None:
            return ""
        return json.dumps({"env": self.exports.env, "python_path": self.exports.python_path, "venv": self.venv})


def batch_args(args: tuple[str, ...], batch_arg: str, batch_size: int) -> tuple[str, ...]:
    """The script's arguments with the batch size appended (``--batch-arg none``: as they are)."""
    return args if batch_arg == "none" else (*args, batch_arg, str(batch_size))


def normalize_batch_arg(name: str) -> str:
    name = name.strip()
    if name == "none":
        return name
    if not name or any(c.isspace() for c in name):
        raise SubmitError(f"--batch-arg {name!r}: give the script's flag name (e.g. --batch-size) or 'none'")
    return name if name.startswith("-") else f"--{name}"


def role_of(policy: AgentPolicy, partition: Partition) -> str:
    return policy.role_of(partition.name) or ("gpu" if partition.max_gpus_per_node else "cpu")


def profiled_partitions(policy: AgentPolicy, partitions: list[Partition], wanted: str | None) -> dict[str, str]:
    """{partition: the partition whose profile stands for it}: one profile per role the user may use."""
    up = [p for p in partitions if p.up and p.nodes]
    if wanted is not None:
        chosen = [p for p in up if p.name == wanted]
        if not chosen:
            names = ", ".join(p.name for p in partitions)
            raise SubmitError(f"partition {wanted!r} is unknown or down; this cluster has: {names}")
        return {wanted: wanted}
    if policy.partitions:
        up = [p for p in up if p.name in policy.partitions]
    by_role: dict[str, str] = {}
    mapping: dict[str, str] = {}
    for p in sorted(up, key=lambda p: (ROLE_ORDER.index(role_of(policy, p)) if role_of(policy, p) in ROLE_ORDER
                                       else 9, p.name)):
        mapping[p.name] = by_role.setdefault(role_of(policy, p), p.name)
    if not mapping:
        raise SubmitError("no partition is up to profile on; check `sinfo`")
    return mapping


@dataclass
class _Run:
    key: str
    target: Target
    batch_size: int
    dlsub_id: str
    slurm_job_id: int
    job_dir: Path


@dataclass
class Estimator:
    settings: Settings
    client: SlurmClient
    store: JobStore
    policy: AgentPolicy
    say: Callable[[str], None] = lambda _msg: None
    clock: Callable[[], float] = time.time
    poll_s: float = 1.0
    cache: EstimateCache = field(init=False)

    def __post_init__(self) -> None:
        self.cache = EstimateCache(self.settings.home)

    def run(self, req: EstimateRequest) -> dict[str, Any]:
        started = time.monotonic()
        script = check_script(req.script)
        if not req.batch_sizes or any(b < 1 for b in req.batch_sizes):
            raise SubmitError("--batch-sizes: give positive integers, e.g. --batch-sizes 32,64,128")
        image = req.image or self.settings.image
        self.client.ping()
        partitions = {p.name: p for p in self.client.partitions()}
        by_role = profiled_partitions(self.policy, list(partitions.values()), req.partition)
        prices = self.policy.prices()
        stand_in = profiled_targets(by_role, partitions, {n: role_of(self.policy, partitions[n]) for n in by_role},
                                    prices.partition_gpu_type, req.gpus, req.gpu_types)
        script_text = script.read_bytes()
        rule = f"steps={req.profile_steps};seconds={req.profile_seconds}"
        environment = req.environment()
        if self.policy.containers.environment:  # the site's variables change what a run measures (its threads)
            environment = json.dumps({"user": environment, "site": self.policy.containers.environment})
        estimate_id = uuid.uuid4().hex[:8]

        profiles: dict[str, list[ProfileRun]] = {}
        todo: list[tuple[str, Target, int]] = []
        for target in sorted(set(stand_in.values()), key=lambda t: t.order):
            gpus = req.gpus if partitions[target.partition].max_gpus_per_node else 0
            for bs in req.batch_sizes:
                key = profile_key(script_text, batch_args(req.args, req.batch_arg, bs),
                                  req.image_on(target.partition, image), target.partition, bs,
                                  gpus=gpus, nodes=req.nodes, rule=rule, gpu_type=target.gpu_type or "",
                                  environment=environment)
                cached = self.cache.get(key) if req.use_cache else None
                if cached is not None and cached.gpu_type == target.gpu_type:
                    profiles.setdefault(target.key, []).append(cached)
                else:
                    todo.append((key, target, bs))
        failed: dict[str, str] = {}
        fresh: dict[str, list[ProfileRun]] = {}
        if todo:
            self._profile(req, estimate_id, script, image, partitions, todo, _Outcome(profiles, failed, fresh))

        fits = {k: fit_partition(ps) for k, ps in profiles.items() if ps}
        now = self.clock()
        facts: dict[str, PartitionFacts] = {}
        for target in stand_in:
            p = partitions[target.partition]
            nodes = target_nodes(target, p)  # a kind's own: their memory and GPUs decide whether the row fits
            start = self.client.start_estimate(p.name, cpus=req.cpus or self.settings.cpus,
                                               mem_mb=req.mem_mb or self.settings.mem_mb,
                                               gpus_per_node=req.gpus if p.max_gpus_per_node else 0, nodes=req.nodes,
                                               gpu_type=target.gres_type)
            role = self.policy.partitions.get(p.name)
            facts[target.key] = PartitionFacts(
                p.name, role_of(self.policy, p), None if p.max_time_min is None else p.max_time_min * 60.0,
                max((n.real_memory_mb for n in nodes), default=0), max((n.gpus for n in nodes), default=0),
                role.cost_per_node_hour if role else 0.0, None if start is None else max(0.0, start - now),
                target.gpu_type, ("gres" if target.pinned else "policy") if target.gpu_type else "",
                prices.gpu_hour.get(target.gpu_type) if target.gpu_type else None)
        by_key = {t.key: fits[src.key] for t, src in stand_in.items() if src.key in fits}
        knobs = Knobs(gpus=req.gpus, nodes=req.nodes, restart_s=self.policy.moves.restart_cost_s,
                      grace_s=float(self.settings.signal_grace_s),
                      max_continuations=(self.policy.time_limits.max_continuations
                                         if self.policy.time_limits.continue_jobs else 0),
                      min_saving_s=self.policy.moves.min_saving_s)
        rows = build_rows(by_key, facts, req.batch_sizes, req.horizon, knobs,
                          {t.key: failed[src.key] for t, src in stand_in.items() if src.key in failed})
        payload = {
            "id": estimate_id, "created": now, "script": str(script), "args": list(req.args),
            "batch_arg": req.batch_arg, "image": image, "gpus": req.gpus, "nodes": req.nodes,
            "horizon": {"epochs": req.horizon.epochs, "target_loss": req.horizon.target_loss},
            "rows": rows, "recommendation": recommend(rows, knobs),
            "profiles": {k: [x.to_json() for x in ps] for k, ps in profiles.items()},
            "profiled_now": len(todo), "from_cache": len(set(stand_in.values())) * len(req.batch_sizes) - len(todo),
            "elapsed_s": round(time.monotonic() - started, 2),
        }
        if any(t.gpu_type is not None for t in stand_in):  # untyped estimates keep the fields they had
            payload["gpu_types"] = sorted({t.gpu_type for t in stand_in if t.gpu_type is not None})
            payload["profiling"] = profiling_costs(stand_in, todo, fresh, req, prices)
        self.cache.save_estimate(estimate_id, payload)
        return payload

    # ------------------------------------------------------------------ profiling runs
    def _profile(self, req: EstimateRequest, estimate_id: str, script: Path, image: str,
                 partitions: dict[str, Partition], todo: list[tuple[str, Target, int]], out: _Outcome) -> None:
        runs: dict[int, _Run] = {}
        env = {ENV_PROFILE_STEPS: str(req.profile_steps), ENV_PROFILE_SECONDS: f"{req.profile_seconds:g}"}
        queues = profile_queues({t for _, t, _ in todo}, partitions, req.queues)
        how = {"one": "one at a time", "each": "per partition in parallel"}.get(
            req.queues, f"in {len(set(queues.values()))} queue(s) at once: runs that may share a node, one at a time")
        self.say(f"profiling {len(todo)} run(s) through Slurm, {how} (Ctrl-C cancels them)")
        prices = self.policy.prices()
        for target in sorted({t for _, t, _ in todo if t.gpu_type is not None}, key=lambda t: t.order):
            self.say(profiling_notice(target, sum(1 for _, t, _ in todo if t == target),
                                      _limit_min(partitions[target.partition]), req, prices))
        try:
            for key, target, bs in todo:
                part = target.partition
                p = partitions[part]
                name = f"dlsub-profile-{estimate_id}" + (f"-{queues[target]}" if queues[target] else "")
                request = SubmitRequest(
                    script=script, args=batch_args(req.args, req.batch_arg, bs),
                    gpus_per_node=req.gpus if p.max_gpus_per_node else 0, nodes=req.nodes, cpus=req.cpus,
                    mem_mb=req.mem_mb, time_limit_min=_limit_min(p), partition=part, image=image, name=name,
                    workdir=req.workdir, mode="ideal", max_continuations=0,
                    mounts=(*self.policy.containers.mount_requests(), *req.mounts),
                    runtime=self.policy.containers.runtime or None, gpu_type=target.gres_type,
                    site_paths=self.policy.site, exports=req.exports, site_env=self.policy.containers.environment,
                    venv=req.venv,
                    partition_images=req.partition_images)
                plan = with_env(plan_job(request, self.settings, self.client, check_images=not runs),
                                {**env, ENV_BATCH_SIZE: str(bs)})
                submitted = submit_plan(plan, self.settings, self.client, self.store,
                                        agent_user=self.policy.agent_user,
                                        sbatch_args=("--dependency=singleton",))
                record = submitted.record
                assert record.slurm_job_id is not None
                runs[record.slurm_job_id] = _Run(key, target, bs, record.id, record.slurm_job_id, Path(record.job_dir))
            self._wait(runs, out)
        except KeyboardInterrupt:
            left = list(runs.values())
            for r in left:
                self.client.cancel(r.slurm_job_id)
            self.say(f"interrupted: cancelled {len(left)} profiling job(s)")
            raise

    def _wait(self, runs: dict[int, _Run], out: _Outcome) -> None:
        deadline = time.monotonic() + 60 * (PROFILE_LIMIT_MIN + 2) * max(1, len(runs))
        while runs:
            if time.monotonic() > deadline:
                for r in runs.values():
                    self.client.cancel(r.slurm_job_id)
                    out.failed.setdefault(r.target.key, f"profiling job {r.dlsub_id} did not finish in time")
                return
            seen = {j.job_id: j for j in self.client.jobs(job_ids=list(runs))}
            for sid in list(runs):
                job = seen.get(sid)
                state = JobState.from_slurm(job.state) if job is not None else JobState.COMPLETED
                if not state.terminal:
                    continue
                r = runs.pop(sid)
                self._collect(r, state, out)
            if runs:
                time.sleep(self.poll_s)

    def _collect(self, r: _Run, state: JobState, out: _Outcome) -> None:
        progress = read_events(r.job_dir / PROGRESS_FILE)
        attempts = read_events(r.job_dir / ATTEMPTS_FILE)
        where = r.target.label
        try:
            if state != JobState.COMPLETED:
                raise FitError(f"it ended {state.value}")
            profile = on_its_kind(profile_from_events(r.target.partition, r.batch_size, progress, attempts), r.target)
        except FitError as exc:
            out.failed.setdefault(r.target.key, f"profiling at batch size {r.batch_size} failed: {exc}; "
                                                f"see `dlsub logs {r.dlsub_id}`")
            self.say(f"profile {where} batch {r.batch_size}: failed ({exc}); `dlsub logs {r.dlsub_id}`")
            return
        self.cache.put(r.key, profile)
        out.profiles.setdefault(r.target.key, []).append(profile)
        out.fresh.setdefault(r.target.key, []).append(profile)
        self.say(f"profiled {where} batch {r.batch_size}: {profile.step_s * 1000:.1f} ms/step, "
                 f"{profile.memory_mb:.0f} MB peak, start-up {profile.startup_s:.1f} s")


@dataclass
class _Outcome:
    """What the profiling runs leave: profiles per target key (cached and new), failures, and the new ones."""

    profiles: dict[str, list[ProfileRun]]
    failed: dict[str, str]
    fresh: dict[str, list[ProfileRun]]


def target_nodes(target: Target, partition: Partition) -> list[SlurmNode]:
    """The nodes a run for ``target`` may land on: a pinned kind's own (its GRES type), else the partition's."""
    return [n for n in partition.nodes if not target.pinned or n.gpu_type == target.gpu_type] or list(partition.nodes)


def profile_queues(targets: set[Target], partitions: dict[str, Partition], how: ProfileQueues) -> dict[Target, str]:
    """The queue of each target's profiling runs: runs of one queue go one at a time (``--dependency=singleton``
    on the job name it suffixes; "" for the bare name). "one": a single queue. "each": one per partition and kind.
    "by-node": targets whose runs may land on a common node share a queue, transitively (gpu and gpu-dev on the
    same nodes), so that no two profiles measure each other, and partitions of separate nodes profile at once."""
    ordered = sorted(targets, key=lambda t: t.order)
    if how == "one":
        return dict.fromkeys(ordered, "")
    if how == "each":
        return {t: t.key.replace("/", "-") for t in ordered}
    groups: list[tuple[set[str], list[Target]]] = []  # (node names, targets whose runs may land there)
    for target in ordered:
        names = {n.name for n in target_nodes(target, partitions[target.partition])}
        touching = [g for g in groups if g[0] & names]
        groups = [g for g in groups if not g[0] & names]
        groups.append((names.union(*(g[0] for g in touching)), [*(t for g in touching for t in g[1]), target]))
    # A queue is named after its first target: the same names an estimate's runs had with one queue per target.
    return {t: min(members, key=lambda m: m.order).key.replace("/", "-") for _, members in groups for t in members}


def _limit_min(p: Partition) -> int:
    return PROFILE_LIMIT_MIN if p.max_time_min is None else min(PROFILE_LIMIT_MIN, p.max_time_min)


def on_its_kind(profile: ProfileRun, target: Target) -> ProfileRun:
    """The profile, labelled with the target's kind of GPU; FitError when it ran on another kind (one kind's
    profile never predicts another's). A start record that names no kind (the GRES is untyped, or the
    attempt was started by an older dlsub) is taken at Slurm's word: the job asked for that kind. An untyped
    target's profile is untyped, whatever GPUs its node has (it asked for none, or for any kind)."""
    if target.gpu_type is None:
        return dataclasses.replace(profile, gpu_type=None)
    if profile.gpu_type not in (None, target.gpu_type):
        raise FitError(f"it ran on {profile.gpu_type} GPUs, not {target.gpu_type}")
    return dataclasses.replace(profile, gpu_type=target.gpu_type)


def _gpus(req: EstimateRequest) -> int:
    return req.gpus * req.nodes


def profiling_notice(target: Target, runs: int, limit_min: int, req: EstimateRequest, prices: Prices) -> str:
    """What profiling one kind of GPU costs before it runs: short real jobs, bounded by their time limit."""
    most_s = runs * limit_min * 60.0
    hourly = prices.hourly(target.partition, req.nodes, _gpus(req), target.gpu_type or "")
    return (f"profiling on {target.label}: {runs} short real job(s) of {req.nodes} node(s) x {req.gpus} "
            f"{target.gpu_type} GPU(s), each stopping after {req.profile_steps} steps and {req.profile_seconds:g} s "
            f"of training (time limit {limit_min} min): at most {most_s / 3600.0 * _gpus(req):.3f} GPU-hours, "
            f"cost at most {most_s / 3600.0 * hourly:.3f}")


def profiling_costs(stand_in: dict[Target, Target], todo: list[tuple[str, Target, int]],
                    fresh: dict[str, list[ProfileRun]], req: EstimateRequest, prices: Prices) -> list[dict[str, Any]]:
    """What profiling each kind of GPU cost this estimate: its runs' time (start-up, steps, end) at the
    kind's price; nothing for profiles taken from the cache."""
    out: list[dict[str, Any]] = []
    for target in sorted({t for t in stand_in.values() if t.gpu_type is not None}, key=lambda t: t.order):
        ran = fresh.get(target.key, [])
        seconds = sum(p.run_s for p in ran)
        hourly = prices.hourly(target.partition, req.nodes, _gpus(req), target.gpu_type or "")
        out.append({"partition": target.partition, "gpu_type": target.gpu_type,
                    "runs": sum(1 for _, t, _ in todo if t == target), "measured": len(ran),
                    "from_cache": len(req.batch_sizes) - sum(1 for _, t, _ in todo if t == target),
                    "seconds": round(seconds, 1), "gpu_hours": round(seconds / 3600.0 * _gpus(req), 4),
                    "cost": round(seconds / 3600.0 * hourly, 4),
                    "stands_for": [t.label for t, src in stand_in.items() if src == target]})
    return out


def fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
