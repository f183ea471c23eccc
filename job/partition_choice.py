"""Pick the partition a new job should go to (pure: value objects in, a choice out).

Rules, in order:
1. A partition must be up, exist, take the user (its AllowGroups, and its
   AllowAccounts and DenyAccounts where the account is known), have nodes with
   enough GPUs (of the kind asked for, ``--gpu-type``), CPUs and memory for the
   request, and a MaxTime at least the requested time.
2. Among those, prefer one where the job can start now (enough idle GPUs,
   CPUs and memory on some node).
3. Jobs without GPUs prefer partitions without GPUs (don't hold GPU nodes
   with CPU work); GPU jobs prefer longer MaxTime (a dev queue is the last
   resort, or the choice when only it is free now).
4. Then Slurm's default partition, then name, for a stable answer.
5. In immediate mode, a GPU job that cannot start now anywhere with GPUs
   starts now on a partition without GPUs instead (its processes on CPUs);
   the choice names the ideal partition, which the agent moves it to when
   GPUs free up.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlsub.slurm_plugins.models import Partition, SlurmNode
from dlsub.slurm_plugins.timespec import format_minutes


@dataclass(frozen=True)
class Request:
    gpus_per_node: int
    cpus: int
    mem_mb: int
    time_limit_min: int | None
    nodes: int = 1
    partition: str | None = None  # the user's explicit choice
    immediate: bool = False
    gpu_type: str | None = None  # the kind of GPU asked for (--gpu-type); None: any
    # Who asks: the user's groups and the job's account (None: not known, and then not checked; Slurm checks).
    groups: frozenset[str] | None = None
    account: str | None = None


@dataclass(frozen=True)
class Choice:
    partition: str
    starts_now: bool
    reason: str
    ideal_partition: str | None = None  # set when placed elsewhere for now (immediate mode)
    gpus_now: int | None = None  # GPUs it gets where it starts, when not what it asked for


class PlanningError(ValueError):
    """The request cannot run anywhere; the message says why and what to change."""


def _kind_fits(node: SlurmNode, req: Request) -> bool:
    return not req.gpu_type or req.gpus_per_node <= 0 or node.gpu_type == req.gpu_type


def _node_fits(node: SlurmNode, req: Request) -> bool:
    return (node.gpus >= req.gpus_per_node and node.cpus >= req.cpus and node.real_memory_mb >= req.mem_mb
            and _kind_fits(node, req))


def _node_free(node: SlurmNode, req: Request) -> bool:
    return (node.idle_gpus >= req.gpus_per_node and node.idle_cpus >= req.cpus and node.free_memory_mb >= req.mem_mb
            and _kind_fits(node, req))


def _why_not(p: Partition, req: Request) -> str | None:
    if not p.up:
        return f"{p.name} is {p.state}"
    refused = p.refuses(req.groups, req.account)
    if refused:
        return refused
    if req.time_limit_min is not None and p.max_time_min is not None and req.time_limit_min > p.max_time_min:
        return f"{p.name} allows at most {format_minutes(p.max_time_min)}"
    fitting = [n for n in p.nodes if _node_fits(n, req)]
    if len(fitting) < req.nodes:
        if p.max_gpus_per_node < req.gpus_per_node:
            return f"{p.name} has at most {p.max_gpus_per_node} GPUs per node"
        if fitting and req.nodes > 1:
            return f"{p.name} has {len(fitting)} node(s) that fit it, and it needs {req.nodes} nodes"
        if req.gpu_type and req.gpus_per_node > 0 and p.max_gpus_per_node >= req.gpus_per_node:
            kinds = ", ".join(sorted({n.gpu_type for n in p.nodes if n.gpu_type})) or "none named"
            return (f"{p.name} has no node with {req.gpus_per_node} {req.gpu_type} GPU(s) (GPU types there: "
                    f"{kinds})")
        return f"{p.name} has no node with {req.cpus} CPUs and {req.mem_mb} MB"
    return None


def choose_partition(partitions: list[Partition], req: Request) -> Choice:
    if req.gpus_per_node < 0:
        raise PlanningError(f"--gpus must be 0 or more, not {req.gpus_per_node}")
    names = [p.name for p in partitions]
    if req.partition is not None:
        if req.partition not in names:
            raise PlanningError(f"unknown partition {req.partition!r}; this cluster has: {', '.join(names)}")
        candidates = [p for p in partitions if p.name == req.partition]
    else:
        candidates = partitions

    most_gpus = max((p.max_gpus_per_node for p in partitions if p.up), default=0)
    if req.gpus_per_node > most_gpus:
        widest = [p.name for p in partitions if p.up and p.max_gpus_per_node == most_gpus and most_gpus]
        where = f" (partition {', '.join(widest)})" if widest else ""
        raise PlanningError(
            f"--gpus {req.gpus_per_node}: no node of this cluster has that many; the most one node offers is "
            f"{most_gpus}{where}. Ask for --gpus {most_gpus} or fewer."
        )

    fits: list[Partition] = []
    rejected: list[str] = []
    for p in candidates:
        why = _why_not(p, req)
        if why:
            rejected.append(why)
        else:
            fits.append(p)
    if not fits:
        raise PlanningError("no partition can run this job: " + "; ".join(str(r) for r in rejected))

    def free_nodes(p: Partition) -> int:
        return sum(1 for n in p.nodes if _node_free(n, req))

    def rank(p: Partition) -> tuple[int, int, int, int, str]:
        starts_now = free_nodes(p) >= req.nodes
        gpu_mismatch = int(req.gpus_per_node == 0 and p.max_gpus_per_node > 0)
        max_time = p.max_time_min if p.max_time_min is not None else 10**9
        return (0 if starts_now else 1, gpu_mismatch, -max_time, 0 if p.default else 1, p.name)

    best = min(fits, key=rank)
    starts_now = free_nodes(best) >= req.nodes
    if req.immediate and not starts_now and req.gpus_per_node > 0 and req.partition is None:
        fallback = _start_without_gpus(partitions, req)
        if fallback is not None:
            return Choice(
                fallback.name, True,
                f"immediate mode: no GPUs free now ({best.name} would queue); starting on {fallback.name} "
                f"without GPUs, to move to {best.name} when {req.gpus_per_node} GPU(s) free up",
                ideal_partition=best.name, gpus_now=0,
            )
    idle = free_nodes(best)
    parts = [
        f"{idle} of {len(best.nodes)} nodes free for it now"
        if starts_now
        else "no node is free for it now; it will queue"
    ]
    if req.partition is None:
        others = [f"{r}" for r in rejected]
        busy = [p.name for p in fits if p is not best and free_nodes(p) < req.nodes]
        if busy and starts_now:
            others.append(f"{', '.join(busy)} busy")
        if others:
            parts.append("; ".join(others))
    else:
        parts.insert(0, "as asked")
    return Choice(best.name, starts_now, ", ".join(parts))


def _start_without_gpus(partitions: list[Partition], req: Request) -> Partition | None:
    """A partition without GPUs where the job, run on CPUs, can start now."""
    cpu_req = Request(0, req.cpus, req.mem_mb, req.time_limit_min, req.nodes, groups=req.groups, account=req.account)
    ready = [
        p for p in partitions
        if p.max_gpus_per_node == 0 and _why_not(p, cpu_req) is None
        and sum(1 for n in p.nodes if _node_free(n, cpu_req)) >= req.nodes
    ]
    return min(ready, key=lambda p: (0 if p.default else 1, p.name), default=None)
