"""What the launcher is told: the job's settings from the batch script's ``exec`` line, and Slurm's view of
this step from its environment. Both read once, into frozen values."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dlsub import contract


class Role(StrEnum):
    """How the batch script runs: the job's batch step (``main``), one node of its gang (``node``, srun's
    task), or a task of an elastic job's worker array (``worker``)."""

    MAIN = "main"
    NODE = "node"
    WORKER = "worker"


@dataclass(frozen=True)
class LaunchConfig:
    """The job's settings, as ``slurm_plugins/sbatch.py`` rendered them into the batch script."""

    role: Role
    #: This batch script: ``bash SCRIPT container ...`` runs its ``podman run`` line.
    script: Path
    dlsub_id: str
    job_dir: Path
    #: The installed dlsub package the container mounts (the submitting dlsub's).
    library_dir: Path
    #: torchrun forms its group through a c10d rendezvous on the main job's first node (several nodes, or an
    #: elastic range); False: --standalone.
    gang: bool = False
    #: A heterogeneous job: GPU trainers (component 0) and a CPU component (1).
    het: bool = False
    #: The main job's held worker array (elastic jobs), ended with the job.
    worker_array: int | None = None
    #: Resume-requeues this job may make (the site's time_limits.max_continuations; 0: continuation is off);
    #: requeues for a move do not count.
    max_continuations: int = 20
    #: The site's interface for gloo and NCCL ("": the one holding this node's own address).
    socket_ifname: str = ""
    #: The GPUs per node a job started on none asked for (immediate mode on CPUs; 0: otherwise): an attempt
    #: without GPUs that dies of torch's no-GPU error is sent back to wait for them, once.
    gpus_wanted: int = 0

    @property
    def job_script(self) -> Path:
        """The main job's script in the job directory, which srun runs on each node of a gang."""
        return self.job_dir / contract.BATCH_SCRIPT

    @property
    def attempts_file(self) -> Path:
        return self.job_dir / contract.ATTEMPTS_FILE

    @property
    def markers_dir(self) -> Path:
        return self.job_dir / contract.MARKERS_DIR

    @property
    def requeue_count_file(self) -> Path:
        return self.markers_dir / contract.REQUEUE_COUNT_FILE

    @property
    def needs_gpu_sent_file(self) -> Path:
        return self.markers_dir / contract.NEEDS_GPU_SENT_FILE

    @property
    def rendezvous_file(self) -> Path:
        return self.markers_dir / contract.RENDEZVOUS_FILE


def parse_args(argv: Sequence[str]) -> LaunchConfig:
    """The launcher's command line (the batch script's ``exec`` line); argparse's usage error otherwise."""
    parser = argparse.ArgumentParser(prog="python -m dlsub.slurm_plugins.launcher",
                                     description="dlsub's batch launcher (run by the batch script)")
    parser.add_argument("role", choices=[r.value for r in Role])
    parser.add_argument("--script", required=True, type=Path)
    parser.add_argument("--dlsub-id", required=True)
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--library-dir", required=True, type=Path)
    parser.add_argument("--gang", type=int, choices=(0, 1), default=0)
    parser.add_argument("--het", type=int, choices=(0, 1), default=0)
    parser.add_argument("--worker-array", default="")
    parser.add_argument("--max-continuations", type=int, default=20)
    parser.add_argument("--socket-ifname", default="")
    parser.add_argument("--gpus-wanted", type=int, default=0)
    args = parser.parse_args(list(argv))
    if args.worker_array and not args.worker_array.isdigit():
        parser.error(f"--worker-array {args.worker_array!r} is not a Slurm job id")
    return LaunchConfig(Role(args.role), args.script.absolute(), args.dlsub_id, args.job_dir, args.library_dir,
                        bool(args.gang), bool(args.het), int(args.worker_array) if args.worker_array else None,
                        args.max_continuations, args.socket_ifname, max(0, args.gpus_wanted))


def short_hostname() -> str:
    """``hostname -s``."""
    return socket.gethostname().split(".", 1)[0]


@dataclass(frozen=True)
class SlurmStep:
    """Slurm's view of this step, from the variables it sets (text as Slurm gave it: it goes into names and
    records as it is)."""

    job_id: str
    restart: str = "0"
    #: This node's index in the job (SLURM_NODEID): the c10d store lives with node 0 of the main job.
    node_index: str = "0"
    #: This node's name in Slurm (SLURMD_NODENAME), else the host's short name.
    node_name: str = ""
    partition: str = ""
    nodelist: str = ""
    nnodes: str = "1"
    #: ``<array job id>_<task id>`` of a worker task (its own handle: the array's id would name them all).
    array_task: str = ""
    #: A heterogeneous job's two parts, as Slurm host lists.
    het_nodelists: tuple[str, str] = ("", "")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmStep:
        array_job, array_index = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        return cls(
            job_id=env["SLURM_JOB_ID"],
            restart=env.get("SLURM_RESTART_COUNT") or "0",
            node_index=env.get("SLURM_NODEID") or "0",
            node_name=env.get("SLURMD_NODENAME") or short_hostname(),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            nodelist=env.get("SLURM_JOB_NODELIST", ""),
            nnodes=env.get("SLURM_NNODES") or "1",
            array_task=f"{array_job}_{array_index}" if array_job and array_index else "",
            het_nodelists=(env.get("SLURM_JOB_NODELIST_HET_GROUP_0", ""),
                           env.get("SLURM_JOB_NODELIST_HET_GROUP_1", "")),
        )

    @property
    def attempt(self) -> str:
        """``<slurm job id>-<restart count>``: the gang's attempt (resume markers are the group's)."""
        return f"{self.job_id}-{self.restart}"

    @property
    def node_count(self) -> int:
        return int(self.nnodes) if self.nnodes.isdigit() else 1
