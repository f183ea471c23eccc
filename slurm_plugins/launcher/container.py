"""This node's container of the attempt: set up, run through the batch script's ``podman run`` line, waited for,
its exit status read (from its launcher's record where Podman lost it), and removed when the launcher ends."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlsub import contract
from dlsub.slurm_plugins.launcher.gpus import GpuSetup, gpu_setup
from dlsub.slurm_plugins.launcher.host import RuntimeDirRefused, runtime_dir
from dlsub.slurm_plugins.launcher.podman_state import reset_if_left_by_a_killed_attempt
from dlsub.slurm_plugins.launcher.policy import recorded_status
from dlsub.slurm_plugins.launcher.records import read_head, remove, say
from dlsub.slurm_plugins.launcher.signals import Forwarder


def container_name(dlsub_id: str, env: MutableMapping[str, str], node_index: str) -> str:
    """One container per node and attempt: ``dlsub-<id>-<slurm job>-<restart>-<role><node>``."""
    return (f"dlsub-{dlsub_id}-{env['SLURM_JOB_ID']}-{env.get('SLURM_RESTART_COUNT') or '0'}-"
            f"{env.get(contract.ENV_ROLE) or contract.ROLE_TRAINER}{node_index}")


class Podman:
    """The two Podman calls the launcher makes besides the container's own run, quietly, with the job's
    environment (its runtime directory)."""

    def __init__(self, env: MutableMapping[str, str]) -> None:
        self.env = env

    def _quiet(self, argv: Sequence[str]) -> None:
        try:
            subprocess.run(["podman", *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=dict(self.env), check=False)
        except OSError:
            pass

    def kill(self, signal_name: str, container: str) -> None:
        self._quiet(["kill", "--signal", signal_name, container])

    def remove(self, container: str) -> None:
        self._quiet(["rm", "-f", "-t", "5", "--ignore", container])


@dataclass(frozen=True)
class ContainerRun:
    """What one node's container needs that only the node knows."""

    script: Path  # the batch script, whose `container` part runs `podman run`
    name: str
    exit_record: Path
    library_dir: Path
    #: torchrun's rendezvous settings (the c10d store lives with the main job's first node).
    rdzv_conf: str


def library_present(library_dir: Path, node: str) -> bool:
    """Without the package the launcher cannot start in the container: say why here, not as Python's import
    error."""
    if os.access(library_dir / "checkpointing" / "launch.py", os.R_OK):
        return True
    say(f"dlsub: error: dlsub's package {library_dir}, which the container mounts, is not on node {node}; the "
        "site installs dlsub on a shared software path, or at this same path on every node (`dlsub doctor` on a "
        "node checks it)")
    return False


def podman_argv(run: ContainerRun, gpus: GpuSetup) -> list[str]:
    """The batch script's ``container`` part, with this node's values (slurm_plugins/batch.sh)."""
    return ["bash", str(run.script), "container", str(gpus.nproc), run.rdzv_conf, gpus.cuda_devices,
            *gpus.device_args]


def run_container(run: ContainerRun, env: MutableMapping[str, str], forwarder: Forwarder, node: str,
                  on_started: Callable[[], None], uid: int | None = None) -> int:
    """Run this node's container and wait for it; its exit status (1 when it could not start).
    ``on_started``: called once the container may be running (the launcher then removes it when it ends).
    Raises :class:`RuntimeDirRefused` when Podman has no private runtime directory."""
    xdg = runtime_dir(env, os.getuid() if uid is None else uid)
    if xdg is not None:
        env["XDG_RUNTIME_DIR"] = xdg
    gpus = gpu_setup(env)
    if not library_present(run.library_dir, node):
        return 1
    reset = reset_if_left_by_a_killed_attempt(env)
    if reset:
        say(f"dlsub: on {node}: {reset}")
    on_started()
    remove(run.exit_record)
    argv = podman_argv(run, gpus)
    rc = forwarder.run(lambda: subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=dict(env)), run.name)
    status = recorded_status(rc, read_head(run.exit_record, 8))
    if status is not None:
        say(f"dlsub: podman lost the container's exit status (it said {rc}); its launcher recorded {status}")
        rc = status
    remove(run.exit_record)
    return rc


__all__ = ["ContainerRun", "Podman", "RuntimeDirRefused", "container_name", "library_present", "run_container"]
