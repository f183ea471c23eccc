"""Turn a ``dlsub submit`` request into a planned, rendered and submitted Slurm job.

Checks everything that can be checked before anything is written, so a bad
request submits nothing and leaves no job directory behind.
"""

from __future__ import annotations

import getpass
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import dlsub
from dlsub.agent.config import Settings
from dlsub.agent.planner import Choice, Request, choose_partition
from dlsub.agent.user_store import JobRecord, JobStore
from dlsub.containers.podman import ContainerSpec, check_image, check_mount_path
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.sbatch import BatchSpec, render_sbatch, safe_job_name

BATCH_SCRIPT = "job.sbatch"


class SubmitError(ValueError):
    """A request that cannot be submitted; the message says what to change."""


@dataclass(frozen=True)
class SubmitRequest:
    script: Path
    args: tuple[str, ...]
    gpus: int
    nodes: int
    cpus: int | None
    mem_mb: int | None
    time_limit_min: int | None
    partition: str | None
    image: str | None
    name: str | None
    workdir: Path
    mode: str = "ideal"  # "immediate": start on what is free now, move to GPUs later


@dataclass(frozen=True)
class Plan:
    dlsub_id: str
    choice: Choice
    batch: BatchSpec
    script_text: str


def library_dir() -> Path:
    """The installed ``dlsub`` package, mounted into containers for ``from dlsub import checkpointing``."""
    return Path(dlsub.__file__).resolve().parent


def check_script(script: Path) -> Path:
    if not script.exists():
        raise SubmitError(f"script {str(script)!r} does not exist; give the path of your training script")
    if not script.is_file():
        raise SubmitError(f"{str(script)!r} is not a file; give the path of your training script")
    if not os.access(script, os.R_OK):
        raise SubmitError(f"script {str(script)!r} is not readable; check its permissions (chmod u+r)")
    return script.resolve()


def plan_job(req: SubmitRequest, settings: Settings, client: SlurmClient, *, check_images: bool = True) -> Plan:
    script = check_script(req.script)
    if req.gpus < 0:
        raise SubmitError(f"--gpus must be 0 or more, not {req.gpus}")
    if req.nodes != 1:
        raise SubmitError(f"--nodes {req.nodes}: multi-node jobs are not supported yet; use --nodes 1 (up to one node's GPUs)")
    image = req.image or settings.image
    cpus = req.cpus or settings.cpus
    mem_mb = req.mem_mb or settings.mem_mb
    for path in (script.parent, req.workdir, settings.jobs_dir):
        try:
            check_mount_path(path)
        except ValueError as exc:
            raise SubmitError(str(exc)) from exc

    client.ping()
    choice = choose_partition(
        client.partitions(),
        Request(gpus_per_node=req.gpus, cpus=cpus, mem_mb=mem_mb, time_limit_min=req.time_limit_min,
                nodes=req.nodes, partition=req.partition, immediate=req.mode == "immediate"),
    )
    if check_images:
        check_image(image)

    dlsub_id = uuid.uuid4().hex[:8]
    job_dir = settings.jobs_dir / dlsub_id
    container = ContainerSpec(
        image=image,
        script=script,
        script_args=req.args,
        job_dir=job_dir,
        workdir=req.workdir,
        library_dir=library_dir(),
        nproc_per_node=None,  # one per GPU of each attempt (they may differ after a move)
        runtime=settings.runtime,
        grace_s=max(5, settings.signal_grace_s // 2),
    )
    batch = BatchSpec(
        dlsub_id=dlsub_id,
        job_name=req.name or safe_job_name(script.stem),
        partition=choice.partition,
        container=container,
        nodes=req.nodes,
        gpus_per_node=req.gpus if choice.gpus_now is None else choice.gpus_now,
        cpus_per_task=cpus,
        mem_mb=mem_mb,
        time_limit_min=req.time_limit_min,
        signal_grace_s=settings.signal_grace_s,
        dlsub_version=dlsub.__version__,
        tags=(("mode", req.mode), ("ideal", choice.ideal_partition or choice.partition), ("gpus", str(req.gpus))),
    )
    return Plan(dlsub_id, choice, batch, render_sbatch(batch))


def let_the_agent_traverse(directory: Path) -> None:
    """Add o+x (not o+r) to a directory of ours that lacks it: one made before dlsub made them 0711."""
    try:
        info = directory.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o001 == 0:
            directory.chmod((info.st_mode & 0o7777) | 0o001)
    except OSError:
        pass


def submit_plan(plan: Plan, settings: Settings, client: SlurmClient, store: JobStore) -> JobRecord:
    """Write the job directory, sbatch it, record it; undo the directory if sbatch fails."""
    spec = plan.batch
    job_dir = spec.container.job_dir
    # 0711: the agent (another account) may open the progress and attempt
    # records it is told the names of, but cannot list or read the rest.
    job_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    for directory in (settings.home, job_dir.parent):
        let_the_agent_traverse(directory)
    job_dir.mkdir(mode=0o711)
    try:
        script_path = job_dir / BATCH_SCRIPT
        script_path.write_text(plan.script_text)
        record = JobRecord(
            id=plan.dlsub_id,
            name=spec.job_name,
            user=getpass.getuser(),
            script=str(spec.container.script),
            args=list(spec.container.script_args),
            job_dir=str(job_dir),
            partition=spec.partition,
            gpus_per_node=int(dict(spec.tags).get("gpus", spec.gpus_per_node)),
            nodes=spec.nodes,
            cpus=spec.cpus_per_task,
            mem_mb=spec.mem_mb,
            time_limit_min=spec.time_limit_min,
            image=spec.container.image,
        )
        store.add(record)
        try:
            # sbatch runs in the user's current directory: that is SLURM_SUBMIT_DIR.
            slurm_job_id = client.submit(script_path)
        except BaseException:
            store.remove(record.id)
            raise
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    store.update(record.id, slurm_job_id=slurm_job_id)
    record.slurm_job_id = slurm_job_id
    return record
