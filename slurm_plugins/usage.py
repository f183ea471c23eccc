"""Slurm's accounting records of allocations, as ``dlsub usage`` and budgets read them (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlsub.contract import GPU_TYPE_PATTERN

#: ``sacct --format`` for :meth:`UsageRecord.from_sacct`.
SACCT_FORMAT = "JobIDRaw,User,Account,Partition,ElapsedRaw,NNodes,AllocTRES"

# AllocTRES's GPUs: "gres/gpu=2" (how many), "gres/gpu:a100=2" (of a type, where the site's
# AccountingStorageTRES lists its types).
_GPUS = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_TYPED_GPUS = re.compile(rf"(?:^|,)gres/gpu:({GPU_TYPE_PATTERN})=(\d+)(?:,|$)")


def gpus_of(tres: str) -> tuple[int, str]:
    """(GPUs, their type) in an AllocTRES string; the type is "" unless exactly one type is named."""
    counted = _GPUS.search(tres)
    typed = {name: int(n) for name, n in _TYPED_GPUS.findall(tres)}
    gpus = int(counted.group(1)) if counted else sum(typed.values())
    return gpus, next(iter(typed)) if len(typed) == 1 else ""


@dataclass(frozen=True)
class UsageRecord:
    """One allocation in Slurm's accounting (``sacct -X -D``: requeued runs are records of their own)."""

    job_id: int
    user: str
    account: str
    partition: str
    elapsed_s: float
    nodes: int
    gpus: int = 0
    gpu_type: str = ""

    @classmethod
    def from_sacct(cls, line: str) -> UsageRecord | None:
        """``JobIDRaw|User|Account|Partition|ElapsedRaw|NNodes|AllocTRES`` (AllocTRES may be left out);
        None for anything else."""
        parts = line.strip().split("|")
        if len(parts) not in (6, 7) or not parts[0].isdigit() or not parts[4].isdigit():
            return None
        nodes = int(parts[5]) if parts[5].isdigit() else 1
        gpus, gpu_type = gpus_of(parts[6]) if len(parts) == 7 else (0, "")
        return cls(int(parts[0]), parts[1], parts[2], parts[3], float(parts[4]), max(1, nodes), gpus, gpu_type)
