"""Shared step of the elastic policies: turn GPU counts into placements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

