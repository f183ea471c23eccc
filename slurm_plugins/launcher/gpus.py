"""This node's GPUs: which ones Slurm gave the step, their type, and how Podman is asked for them.

Slurm's ids for this node's GPUs are global on the node: SLURM_STEP_GPUS in an
srun step (a gang's node), SLURM_JOB_GPUS in the batch step.
CUDA_VISIBLE_DEVICES holds the same ids, unless Slurm constrains devices
(task/cgroup with ConstrainDevices=yes), where it counts 0..n-1 within the job.
A CDI spec names a node's GPUs by that global index (``nvidia-ctk cdi generate``'s
default, nvidia.com/gpu=N), so the devices asked of Podman come from Slurm's
ids, never from CUDA_VISIBLE_DEVICES (under the constraint "0" is another
job's GPU); in the container they are its only GPUs, numbered from 0. Without
a CDI spec CUDA_VISIBLE_DEVICES goes in as Slurm set it.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dlsub import contract

_IDS = re.compile(r"[0-9]+(,[0-9]+)*")
_GRES_GPU = re.compile(rf"gpu:({contract.GPU_TYPE_PATTERN}):[0-9]+")


def split_list(text: str) -> list[str]:
    """A comma-separated list as bash's ``IFS=, read -ra`` splits it: one line, a last empty field dropped."""
    line = text.split("\n", 1)[0]
    if not line:
        return []
    fields = line.split(",")
    if fields[-1] == "":
        fields.pop()
    return fields


def slurm_gpu_ids(env: Mapping[str, str]) -> str:
    """Slurm's global ids of this step's GPUs ("2,3"); CUDA_VISIBLE_DEVICES where Slurm sets no other."""
    ids = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    return ids if _IDS.fullmatch(ids) else env.get("CUDA_VISIBLE_DEVICES", "")


def gpu_types_in_gres(gres: str) -> str:
    """The types Slurm's GRES gives this node's GPUs (``gpu:a100:4(S:0)`` -> ``a100``), each once, in order and
    comma-separated; "" for untyped GPUs or none. Only names contract.GPU_TYPE_PATTERN allows pass (the
    attempt's start record keeps it, and the agent keys what it learns by it)."""
    types: list[str] = []
    for item in split_list(gres):
        match = _GRES_GPU.fullmatch(item.split("(", 1)[0])
        if match and match.group(1) not in types:
            types.append(match.group(1))
    return ",".join(types)


def gres_of(show_node: str) -> str:
    """The ``Gres=`` value in ``scontrol -o show node``'s output ("" when none)."""
    for word in show_node.replace(" ", "\n").splitlines():
        if word.startswith("Gres="):
            return word[len("Gres="):]
    return ""


def node_has_cdi_gpus(spec_dirs: Sequence[str] = contract.CDI_SPEC_DIRS, kind: str = contract.CDI_GPU_KIND) -> bool:
    """Whether a CDI spec of this node (``*.yaml``, ``*.json`` in ``spec_dirs``) names GPUs of ``kind``."""
    needle = kind.encode()
    for spec_dir in spec_dirs:
        for pattern in ("*.yaml", "*.json"):
            for path in sorted(glob.glob(os.path.join(glob.escape(spec_dir), pattern))):
                try:
                    with open(path, "rb") as f:
                        if needle in f.read():
                            return True
                except OSError:
                    continue
    return False


@dataclass(frozen=True)
class GpuSetup:
    """What the container gets of this node's GPUs."""

    #: One training process per GPU Slurm gave this node, one on a CPU node.
    nproc: int = 1
    #: Podman's ``--device`` arguments (CDI devices by Slurm's global ids).
    device_args: tuple[str, ...] = ()
    #: CUDA_VISIBLE_DEVICES inside the container.
    cuda_devices: str = ""


def gpu_setup(env: Mapping[str, str], has_cdi: Callable[[], bool] = node_has_cdi_gpus) -> GpuSetup:
    """The container's GPUs from Slurm's variables; ``has_cdi`` says whether the node has a CDI spec for them
    (asked only where Slurm gave GPUs)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if not visible:
        return GpuSetup(cuda_devices=visible)
    nproc = len(split_list(visible))
    if not has_cdi():
        return GpuSetup(nproc, (), visible)
    ids = split_list(slurm_gpu_ids(env))
    devices = tuple(arg for gpu in ids for arg in ("--device", f"{contract.CDI_GPU_KIND}={gpu}"))
    return GpuSetup(nproc, devices, ",".join(str(i) for i in range(len(ids))))
