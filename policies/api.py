"""The policy interface: plain value objects in, allocations out.

A policy sees the jobs that want GPUs (:class:`JobView`), the cluster
(:class:`ClusterView`), the time, and the allocations now in force, and
returns the allocations it wants next (:class:`Allocation` per job; a job
left out gets nothing). It does no I/O and keeps no state between calls:
whatever it needs to remember (attained service, when a job last started
or began to wait) arrives in the job views, so the live agent and the
simulator can drive the same code and a decision can be replayed.

Nothing here imports Slurm, Podman or SQLite.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol


class PolicyError(ValueError):
    """A policy name or a policy's input that cannot be used."""


class PerformanceModel(Protocol):
    """What a job is known to do on a placement; optional per job.

    A placement is the GPUs used on each node, e.g. ``(4, 2)``.
    """

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        """Seconds per optimiser step at this total batch size."""
        ...

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        """Training progress per second (throughput times statistical efficiency)."""
        ...

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        """The total batch size with the highest goodput here, and that goodput."""
        ...


@dataclass(frozen=True)
class JobView:
    """One job as a policy sees it.

    ``gpus`` is what the job asked for (a rigid job runs at exactly that);
    elastic policies may give anything in ``[min_gpus, max_gpus]``.
    ``remaining`` is the work left in the units of ``model``'s goodput
    (progress), when known. ``step``: its GPU count changes in multiples of
    this above ``lo`` (a live job grows by workers of ``step`` GPUs; every
    simulated job by one GPU). ``packing``: its model is asked about
    placements of this many GPUs a node (a live job of whole nodes of a few
    GPUs each, as it asked for them); None: as many as a node has.

    On a cluster with GPU types (``Node.gpu_type``): ``type_models`` is the
    job's model on each type it has reports from (the oracle: every type),
    and ``type_rates`` its samples per second on one GPU of each type, from
    a short profile there (what Sia bootstraps its models from). A policy
    that ignores them sees one pool of GPUs; ``model`` is the job's model
    on the type it runs on now (or last ran on).
    """

    name: str
    arrival_s: float
    gpus: int = 1
    min_gpus: int | None = None
    max_gpus: int | None = None
    batch_size: int | None = None
    adaptive_batch: bool = False
    attained_gpu_s: float = 0.0
    checkpointable: bool = True
    running_since_s: float | None = None
    waiting_since_s: float | None = None
    remaining: float | None = None
    progress: float = 0.0
    restarts: int = 0  # times its GPUs changed after its first start (pollux's restart penalty)
    restart_s: float | None = None  # what one restart costs it, when known (else a policy's default)
    # What one resize in place costs it (the same kind of GPUs, grown onto more or shrunk onto fewer of the
    # ones it holds), when it costs less than a restart and a policy is told so; None: a restart.
    resize_s: float | None = None
    restarting_s: float = 0.0  # seconds left of the restart it is in now (checkpoint-restore under way)
    step: int = 1
    packing: int | None = None
    model: PerformanceModel | None = field(default=None, compare=False, repr=False)
    type_models: Mapping[str, PerformanceModel] | None = field(default=None, compare=False, repr=False)
    type_rates: Mapping[str, float] | None = field(default=None, compare=False, repr=False)

    @property
    def lo(self) -> int:
        return self.gpus if self.min_gpus is None else self.min_gpus

    @property
    def hi(self) -> int:
        return self.gpus if self.max_gpus is None else self.max_gpus

    def allowed(self, gpus: int) -> int:
        """The largest count it can run at that is at most ``gpus`` (its minimum plus whole steps), or 0."""
        if gpus < self.lo:
            return 0
        return min(self.hi, self.lo + (gpus - self.lo) // max(1, self.step) * max(1, self.step))


@dataclass(frozen=True)
class Node:
    """A node's GPUs as a policy may hand them out (a simulated node whole; live, those it may use).
    What a node has idle in Slurm this tick is an :class:`IdleNode`. ``gpu_type``: the kind of its GPUs
    ("": the cluster does not say; all one kind)."""

    name: str
    gpus: int
    cpus: int = 0
    partition: str = "gpu"
    gpu_type: str = ""


@dataclass(frozen=True)
class IdleNode:
    """What one usable node has idle this tick, as the agent read it from Slurm: the one shape the action
    rules (partition views, capacity) give a node's free resources in. CPUs and memory where known
    (None: not known, and then not checked). ``gpu_type``: the kind of its GPUs where Slurm's GRES names one
    (None: untyped)."""

    name: str
    gpus: int
    cpus: int | None = None
    memory_mb: int | None = None
    gpu_type: str | None = None

    def fits(self, gpus: int, cpus: int = 0, memory_mb: int = 0) -> bool:
        """Whether this much (per node) could start here now; a size of 0 or less is not checked."""
        return (self.gpus >= gpus and (self.cpus is None or cpus <= 0 or self.cpus >= cpus)
                and (self.memory_mb is None or memory_mb <= 0 or self.memory_mb >= memory_mb))

    def less(self, gpus: int, cpus: int = 0, memory_mb: int = 0) -> IdleNode:
        """The node once this much more is taken (what is not known stays not known)."""
        return IdleNode(self.name, self.gpus - gpus, None if self.cpus is None else self.cpus - cpus,
                        None if self.memory_mb is None else self.memory_mb - memory_mb, self.gpu_type)


@dataclass(frozen=True)
class ClusterView:
    """The GPUs the policy may hand out, node by node.

    ``grow_in_place``: a running job keeps the GPUs it holds when its count
    changes (the live agent's jobs grow by adding workers and shrink by
    sending their newest away); the simulator may re-place a job anywhere.
    """

    nodes: tuple[Node, ...]
    grow_in_place: bool = False

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int, partition: str = "gpu") -> ClusterView:
        return cls(tuple(Node(f"n{i:03d}", gpus_per_node, partition=partition) for i in range(num_nodes)))

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def capacity(self) -> dict[str, int]:
        return {node.name: node.gpus for node in self.nodes}

    def gpu_types(self) -> list[str]:
        """The GPU types the nodes name, in the order they first appear ([] on an untyped cluster)."""
        return list(dict.fromkeys(node.gpu_type for node in self.nodes if node.gpu_type))

    def type_of(self) -> dict[str, str]:
        """Each node's GPU type, by node name."""
        return {node.name: node.gpu_type for node in self.nodes}


@dataclass(frozen=True)
class Allocation:
    """The node of each of a job's GPUs (a node repeats once per GPU), and its batch size."""

    nodes: tuple[str, ...]
    batch_size: int | None = None

    @property
    def gpus(self) -> int:
        return len(self.nodes)

    @property
    def placement(self) -> tuple[int, ...]:
        """GPUs per node, in the order the nodes first appear."""
        return tuple(Counter(self.nodes).values())

    def same_gpus(self, other: Allocation | None) -> bool:
        return other is not None and Counter(self.nodes) == Counter(other.nodes)


Decision = dict[str, Allocation]
Jobs = Sequence[JobView]
Allocations = Mapping[str, Allocation]  # what is in force now, by job name


class Policy(Protocol):
    """``decide`` must be a pure function of its arguments."""

    name: ClassVar[str]

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision: ...


def used_gpus(allocations: Mapping[str, Allocation]) -> Counter[str]:
    used: Counter[str] = Counter()
    for alloc in allocations.values():
        used.update(alloc.nodes)
    return used


def check_decision(
    decision: Mapping[str, Allocation],
    jobs: Sequence[JobView],
    cluster: ClusterView,
    *,
    allow_partial: bool = False,
) -> None:
    """Raise PolicyError unless every node is within capacity and every job within its bounds."""
    capacity = cluster.capacity()
    names = {job.name for job in jobs}
    for node, count in used_gpus(decision).items():
        if node not in capacity:
            raise PolicyError(f"allocation names unknown node {node!r}")
        if count > capacity[node]:
            raise PolicyError(f"node {node} over capacity: {count} > {capacity[node]} GPUs")
    for job in jobs:
        alloc = decision.get(job.name)
        if alloc is None or alloc.gpus == 0:
            continue
        if alloc.gpus > job.hi or (alloc.gpus < job.lo and not allow_partial):
            raise PolicyError(f"job {job.name} got {alloc.gpus} GPUs, outside [{job.lo}, {job.hi}]")
    unknown = set(decision) - names
    if unknown:
        raise PolicyError(f"allocation for unknown jobs: {sorted(unknown)}")
