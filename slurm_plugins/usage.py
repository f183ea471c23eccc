"""Slurm's accounting records of allocations, as ``dlsub usage`` and budgets read them (pure)."""

from __future__ import annotations

from dataclasses import dataclass

#: ``sacct --format`` for :meth:`UsageRecord.from_sacct`.
SACCT_FORMAT = "JobIDRaw,User,Account,Partition,ElapsedRaw,NNodes"


@dataclass(frozen=True)
class UsageRecord:
    """One allocation in Slurm's accounting (``sacct -X -D``: requeued runs are records of their own)."""

    job_id: int
    user: str
    account: str
    partition: str
    elapsed_s: float
    nodes: int

    @classmethod
    def from_sacct(cls, line: str) -> UsageRecord | None:
        """``JobIDRaw|User|Account|Partition|ElapsedRaw|NNodes``; None for anything else."""
        parts = line.strip().split("|")
        if len(parts) != 6 or not parts[0].isdigit() or not parts[4].isdigit():
            return None
        nodes = int(parts[5]) if parts[5].isdigit() else 1
        return cls(int(parts[0]), parts[1], parts[2], parts[3], float(parts[4]), max(1, nodes))
