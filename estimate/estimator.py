"""``dlsub estimate``: profile a script through Slurm, then predict per partition and batch size.

Each profiling run is a real dlsub job (the submit path, its container and
its checks), one per (partition role, batch size), with ``DLSUB_BATCH_SIZE``
and ``DLSUB_PROFILE_STEPS``/``DLSUB_PROFILE_SECONDS`` in its environment, so
the library stops it by itself once it has measured enough. By default they
run one at a time (``--dependency=singleton`` on a shared name): profiles
that share a node's cores or memory bandwidth would each measure the other.
Profiles are cached (:mod:`dlsub.estimate.profile_cache`); Ctrl-C cancels the
runs still queued or running.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from dlsub.estimate.partition_fit import FitError, ProfileRun, fit_partition, profile_from_events
from dlsub.estimate.profile_cache import EstimateCache, profile_key
from dlsub.estimate.recommend import Horizon, Knobs, PartitionFacts, build_rows, recommend
from dlsub.job.settings import Settings
from dlsub.job.submit import SubmitError, SubmitRequest, check_script, plan_job, submit_plan
from dlsub.job.user_store import JobStore
from dlsub.job_progress import read_events
from dlsub.site_config.policy_file import AgentPolicy
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.models import Partition

PROFILE_STEPS = 30
PROFILE_SECONDS = 2.0
PROFILE_LIMIT_MIN = 5
ROLE_ORDER = ("gpu", "dev", "cpu")


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
    one_at_a_time: bool = True
    profile_steps: int = PROFILE_STEPS
    profile_seconds: float = PROFILE_SECONDS
    # The user's --mount/--mount-rw paths (the site's shared mounts come from the policy), as for submit.
    mounts: tuple[MountRequest, ...] = ()


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
    partition: str
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
        stand_in = profiled_partitions(self.policy, list(partitions.values()), req.partition)
        script_text = script.read_bytes()
        rule = f"steps={req.profile_steps};seconds={req.profile_seconds}"
        estimate_id = uuid.uuid4().hex[:8]

        profiles: dict[str, list[ProfileRun]] = {}
        todo: list[tuple[str, str, int]] = []
        for part in sorted(set(stand_in.values())):
            gpus = req.gpus if partitions[part].max_gpus_per_node else 0
            for bs in req.batch_sizes:
                key = profile_key(script_text, batch_args(req.args, req.batch_arg, bs), image, part, bs,
                                  gpus=gpus, nodes=req.nodes, rule=rule)
                cached = self.cache.get(key) if req.use_cache else None
                if cached is not None:
                    profiles.setdefault(part, []).append(cached)
                else:
                    todo.append((key, part, bs))
        failed: dict[str, str] = {}
        if todo:
            self._profile(req, estimate_id, script, image, partitions, todo, profiles, failed)

        fits = {p: fit_partition(ps) for p, ps in profiles.items() if ps}
        now = self.clock()
        facts: dict[str, PartitionFacts] = {}
        for name in stand_in:
            p = partitions[name]
            start = self.client.start_estimate(name, cpus=req.cpus or self.settings.cpus,
                                               mem_mb=req.mem_mb or self.settings.mem_mb,
                                               gpus_per_node=req.gpus if p.max_gpus_per_node else 0, nodes=req.nodes)
            role = self.policy.partitions.get(name)
            facts[name] = PartitionFacts(
                name, role_of(self.policy, p), None if p.max_time_min is None else p.max_time_min * 60.0,
                max((n.real_memory_mb for n in p.nodes), default=0), p.max_gpus_per_node,
                role.cost_per_node_hour if role else 0.0, None if start is None else max(0.0, start - now))
        by_name = {name: fits[src] for name, src in stand_in.items() if src in fits}
        knobs = Knobs(gpus=req.gpus, nodes=req.nodes, restart_s=self.policy.moves.restart_cost_s,
                      grace_s=float(self.settings.signal_grace_s),
                      max_continuations=(self.policy.time_limits.max_continuations
                                         if self.policy.time_limits.continue_jobs else 0),
                      min_saving_s=self.policy.moves.min_saving_s)
        rows = build_rows(by_name, facts, req.batch_sizes, req.horizon, knobs,
                          {name: failed[src] for name, src in stand_in.items() if src in failed})
        payload = {
            "id": estimate_id, "created": now, "script": str(script), "args": list(req.args),
            "batch_arg": req.batch_arg, "image": image, "gpus": req.gpus, "nodes": req.nodes,
            "horizon": {"epochs": req.horizon.epochs, "target_loss": req.horizon.target_loss},
            "rows": rows, "recommendation": recommend(rows, knobs),
            "profiles": {p: [x.to_json() for x in ps] for p, ps in profiles.items()},
            "profiled_now": len(todo), "from_cache": len(set(stand_in.values())) * len(req.batch_sizes) - len(todo),
            "elapsed_s": round(time.monotonic() - started, 2),
        }
        self.cache.save_estimate(estimate_id, payload)
        return payload

    # ------------------------------------------------------------------ profiling runs
    def _profile(self, req: EstimateRequest, estimate_id: str, script: Path, image: str,
                 partitions: dict[str, Partition], todo: list[tuple[str, str, int]],
                 profiles: dict[str, list[ProfileRun]], failed: dict[str, str]) -> None:
        runs: dict[int, _Run] = {}
        env = {ENV_PROFILE_STEPS: str(req.profile_steps), ENV_PROFILE_SECONDS: f"{req.profile_seconds:g}"}
        how = "one at a time" if req.one_at_a_time else "per partition in parallel"
        self.say(f"profiling {len(todo)} run(s) through Slurm, {how} (Ctrl-C cancels them)")
        try:
            for key, part, bs in todo:
                p = partitions[part]
                limit = PROFILE_LIMIT_MIN if p.max_time_min is None else min(PROFILE_LIMIT_MIN, p.max_time_min)
                name = f"dlsub-profile-{estimate_id}" + ("" if req.one_at_a_time else f"-{part}")
                request = SubmitRequest(
                    script=script, args=batch_args(req.args, req.batch_arg, bs),
                    gpus_per_node=req.gpus if p.max_gpus_per_node else 0, nodes=req.nodes, cpus=req.cpus,
                    mem_mb=req.mem_mb, time_limit_min=limit, partition=part, image=image, name=name,
                    workdir=req.workdir, mode="ideal", max_continuations=0,
                    mounts=(*self.policy.containers.mount_requests(), *req.mounts),
                    runtime=self.policy.containers.runtime or None)
                plan = with_env(plan_job(request, self.settings, self.client, check_images=not runs),
                                {**env, ENV_BATCH_SIZE: str(bs)})
                submitted = submit_plan(plan, self.settings, self.client, self.store,
                                        agent_user=self.policy.agent_user,
                                        sbatch_args=("--dependency=singleton",))
                record = submitted.record
                assert record.slurm_job_id is not None
                runs[record.slurm_job_id] = _Run(key, part, bs, record.id, record.slurm_job_id, Path(record.job_dir))
            self._wait(runs, profiles, failed)
        except KeyboardInterrupt:
            left = list(runs.values())
            for r in left:
                self.client.cancel(r.slurm_job_id)
            self.say(f"interrupted: cancelled {len(left)} profiling job(s)")
            raise

    def _wait(self, runs: dict[int, _Run], profiles: dict[str, list[ProfileRun]], failed: dict[str, str]) -> None:
        deadline = time.monotonic() + 60 * (PROFILE_LIMIT_MIN + 2) * max(1, len(runs))
        while runs:
            if time.monotonic() > deadline:
                for r in runs.values():
                    self.client.cancel(r.slurm_job_id)
                    failed.setdefault(r.partition, f"profiling job {r.dlsub_id} did not finish in time")
                return
            seen = {j.job_id: j for j in self.client.jobs(job_ids=list(runs))}
            for sid in list(runs):
                job = seen.get(sid)
                state = JobState.from_slurm(job.state) if job is not None else JobState.COMPLETED
                if not state.terminal:
                    continue
                r = runs.pop(sid)
                self._collect(r, state, profiles, failed)
            if runs:
                time.sleep(self.poll_s)

    def _collect(self, r: _Run, state: JobState, profiles: dict[str, list[ProfileRun]],
                 failed: dict[str, str]) -> None:
        progress = read_events(r.job_dir / PROGRESS_FILE)
        attempts = read_events(r.job_dir / ATTEMPTS_FILE)
        try:
            if state != JobState.COMPLETED:
                raise FitError(f"it ended {state.value}")
            profile = profile_from_events(r.partition, r.batch_size, progress, attempts)
        except FitError as exc:
            failed.setdefault(r.partition, f"profiling at batch size {r.batch_size} failed: {exc}; "
                                           f"see `dlsub logs {r.dlsub_id}`")
            self.say(f"profile {r.partition} batch {r.batch_size}: failed ({exc}); `dlsub logs {r.dlsub_id}`")
            return
        self.cache.put(r.key, profile)
        profiles.setdefault(r.partition, []).append(profile)
        self.say(f"profiled {r.partition} batch {r.batch_size}: {profile.step_s * 1000:.1f} ms/step, "
                 f"{profile.memory_mb:.0f} MB peak, start-up {profile.startup_s:.1f} s")


def fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
