"""Shared step of the elastic policies: turn GPU counts into placements."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from dlsub.policies.api import Allocation, ClusterView, Decision, JobView
from dlsub.policies.placement import free_gpus, pack


def place_counts(
    counts: Mapping[str, int],
    jobs: Sequence[JobView],
    cluster: ClusterView,
    previous: Mapping[str, Allocation],
    batch_sizes: Mapping[str, int | None] | None = None,
) -> Decision:
    """Give each job ``counts[name]`` GPUs: its current ones when the count
    is unchanged, else packed on few nodes, largest jobs placed first.

    The counts must fit the cluster in total; a job that cannot be packed
    is spread over the nodes with free GPUs instead, so every count is met.
    On a cluster whose jobs grow in place (``cluster.grow_in_place``, the
    live agent's) a running job keeps what it holds: see :func:`_in_place`.
    """
    by_name = {job.name: job for job in jobs}

    def batch_of(name: str) -> int | None:
        if batch_sizes is not None and name in batch_sizes:
            return batch_sizes[name]
        return by_name[name].batch_size

    decision: Decision = {}
    for name, count in counts.items():
        alloc = previous.get(name)
        if count > 0 and alloc is not None and alloc.gpus == count:
            decision[name] = Allocation(alloc.nodes, batch_of(name))
    if cluster.grow_in_place:
        _in_place(decision, counts, by_name, cluster, previous, batch_of)
    free = free_gpus(cluster, decision)
    pending = sorted(
        (name for name, count in counts.items() if count > 0 and name not in decision),
        key=lambda name: (-counts[name], by_name[name].arrival_s, name),
    )
    for name in pending:
        nodes = pack(free, counts[name])
        if nodes is None:
            raise ValueError(f"GPU counts exceed the cluster: {dict(counts)}")
        decision[name] = Allocation(nodes, batch_of(name))
        for node in set(nodes):
            if not free[node]:
                del free[node]  # full: no later job need look at it (1,000 jobs on 256 nodes)
    return decision


def _in_place(decision: Decision, counts: Mapping[str, int], jobs: Mapping[str, JobView], cluster: ClusterView,
              previous: Mapping[str, Allocation], batch_of: Callable[[str], int | None]) -> None:
    """Resize the running jobs without moving them (into ``decision``): live, a job grows by adding a worker
    of ``step`` GPUs on one node and shrinks by sending its newest worker away.

    A job that shrinks keeps the first GPUs of its allocation (the oldest members: main job, then workers
    by start). A job that grows keeps all it holds and adds ``step`` GPUs at a time, each on a node it
    already runs on when one has them free, else on the node with the most free (fewer nodes per job, as
    Pollux places); steps that no node can hold whole are not given, so it may get fewer than its count.
    """
    resized = [name for name, count in counts.items()
               if count > 0 and name in previous and name not in decision]
    for name in resized:
        decision[name] = Allocation(previous[name].nodes[:counts[name]], batch_of(name))
    free = free_gpus(cluster, decision)
    for name in sorted(resized, key=lambda name: (jobs[name].arrival_s, name)):
        nodes = list(decision[name].nodes)
        step = max(1, jobs[name].step)
        while counts[name] - len(nodes) >= step:
            node = _node_for_step(free, Counter(nodes), step)
            if node is None:
                break
            nodes.extend([node] * step)
            free[node] -= step
        decision[name] = Allocation(tuple(nodes), batch_of(name))


def _node_for_step(free: Counter[str], own: Counter[str], step: int) -> str | None:
    """Where ``step`` more GPUs of a job go: the first of its own nodes with them free, else the node with the
    most free (the cluster's order breaks ties)."""
    for node in own:
        if free[node] >= step:
            return node
    roomy = [node for node, available in free.items() if available >= step]
    return max(roomy, key=free.__getitem__) if roomy else None
