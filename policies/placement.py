"""Where a job's GPUs go, once a policy has decided how many it gets.

Helpers shared by the policies; pure functions over free-GPU counts.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence

from dlsub.policies.api import Allocation, ClusterView, used_gpus


def free_gpus(cluster: ClusterView, allocations: Mapping[str, Allocation]) -> Counter[str]:
    """Free GPUs per node, in the cluster's node order (ties resolve to the first node)."""
    used = used_gpus(allocations)
    return Counter({node.name: node.gpus - used[node.name] for node in cluster.nodes})


def spread(free: Counter[str], count: int) -> tuple[str, ...] | None:
    """Take ``count`` GPUs, each time from the node with the most free (as Tiresias did).

    Updates ``free``; returns None, leaving ``free`` alone, when there are too few.
    """
    if count <= 0 or sum(free.values()) < count:
        return None
    nodes: list[str] = []
    while len(nodes) < count:
        node, available = max(free.items(), key=lambda item: item[1])
        take = min(available, count - len(nodes))
        nodes.extend([node] * take)
        free[node] -= take
    return tuple(nodes)


def pack(
    free: Counter[str],
    count: int,
    *,
    capacity: Mapping[str, int] | None = None,
) -> tuple[str, ...] | None:
    """Take ``count`` GPUs on as few nodes as possible.

    One node when one has room: the tightest fit or, given the nodes'
    ``capacity``, an empty node before a shared one so that jobs stay off
    each other's nodes. Otherwise nodes with the most free GPUs first.
    Updates ``free``; returns None, leaving it alone, when there are too few.
    """
    if count <= 0 or sum(free.values()) < count:
        return None
    fitting = [node for node, available in free.items() if available >= count]
    if fitting:
        if capacity is None:
            node = min(fitting, key=free.__getitem__)  # the tightest fit
        else:
            node = min(fitting, key=lambda node: (free[node] < capacity[node], free[node]))
        free[node] -= count
        return (node,) * count
    nodes: list[str] = []
    for node, available in sorted(free.items(), key=lambda item: -item[1]):
        if len(nodes) == count:
            break
        take = min(available, count - len(nodes))
        nodes.extend([node] * take)
        free[node] -= take
    return tuple(nodes)


def packed_placement(count: int, gpus_per_node: int) -> tuple[int, ...]:
    """The placement of ``count`` GPUs packed on whole nodes: 10 on 4-GPU nodes is (4, 4, 2)."""
    full, rest = divmod(count, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def grown(free: Counter[str], own: tuple[str, ...], count: int, step: int) -> tuple[str, ...] | None:
    """Where a running job that grows in place (live) gets to ``count`` GPUs: it keeps the first ``count``
    of ``own``, and adds ``step`` GPUs at a time on one node, the first of its own with them free, else the
    node with the most free (as the agent grows it). Updates ``free``; None where no node holds a step."""
    nodes = list(own[:count])
    for node in own[count:]:
        free[node] += 1
    while count - len(nodes) >= step:
        mine = [node for node in Counter(nodes) if free[node] >= step]
        roomy = mine or [node for node, available in free.items() if available >= step]
        if not roomy:
            return None
        node = roomy[0] if mine else max(roomy, key=free.__getitem__)
        nodes.extend([node] * step)
        free[node] -= step
    return tuple(nodes)


class FreeIndex:
    """Free GPUs per node (``free``, kept up to date by :meth:`change`), indexed by how many, so that
    :meth:`pack` answers what :func:`pack` would over every node in ``order`` without looking at every node
    of a large cluster: a policy that asks where each of thousands of steps would go (goodput's
    ``place_aware``) on 2,500 nodes."""

    def __init__(self, free: Counter[str], order: Sequence[str]) -> None:
        self.free = free
        self.names = list(order)
        self.index = {node: i for i, node in enumerate(self.names)}
        self.buckets: defaultdict[int, list[int]] = defaultdict(list)  # free GPUs -> node indices, sorted
        for i, node in enumerate(self.names):
            if free[node] > 0:
                self.buckets[free[node]].append(i)
        self.total = sum(free.values())

    def change(self, node: str, delta: int) -> None:
        """``delta`` more GPUs free on ``node``."""
        before, i = self.free[node], self.index[node]
        if before > 0:
            bucket = self.buckets[before]
            del bucket[bisect.bisect_left(bucket, i)]
        self.free[node] = before + delta
        if before + delta > 0:
            bisect.insort(self.buckets[before + delta], i)
        self.total += delta

    def _by_room(self, room: int, own: Counter[str]) -> Iterator[int]:
        """Indices of the nodes with ``room`` GPUs free to a job holding ``own``, in the cluster's order."""
        others = (i for i in self.buckets.get(room, ()) if self.names[i] not in own)
        mine = sorted(self.index[node] for node in own if self.free[node] + own[node] == room)
        return heapq.merge(mine, others) if mine else others

    def pack(self, count: int, own: tuple[str, ...] = ()) -> tuple[str, ...] | None:
        """:func:`pack` of ``count`` GPUs over ``free`` with the GPUs of ``own`` (a job's nodes, one entry a
        GPU) counted free too; changes nothing."""
        mine = Counter(own)
        if count <= 0 or self.total + len(own) < count:
            return None
        top = max((room for room, bucket in self.buckets.items() if bucket), default=0)
        top = max([top, *(self.free[node] + mine[node] for node in mine)])
        for room in range(count, top + 1):  # one node: the tightest fit, first in the cluster's order
            first = next(self._by_room(room, mine), None)
            if first is not None:
                return (self.names[first],) * count
        nodes: list[str] = []
        for room in range(top, 0, -1):  # else the nodes with the most free first
            for i in self._by_room(room, mine):
                nodes.extend([self.names[i]] * min(room, count - len(nodes)))
                if len(nodes) == count:
                    return tuple(nodes)
        return None

    def take(self, count: int, capacity: int) -> tuple[str, ...] | None:
        """:func:`pack` of ``count`` GPUs with ``capacity`` GPUs on every node (an empty node before a shared
        one), and taken off ``free``; None, changing nothing, when there are too few."""
        empty = self.buckets.get(capacity)
        nodes = (self.names[empty[0]],) * count if empty and 0 < count <= capacity else self.pack(count)
        for node, taken in Counter(nodes or ()).items():
            self.change(node, -taken)
        return nodes
