"""Unit tests (pure; no Slurm, no simulator run): goodput's ``place_aware`` values a spare GPU at the placement
the job would really get where GPUs are free, not at a packed one (issue 32), and the placement helper it uses
for jobs that grow in place."""

from __future__ import annotations

import random
from collections import Counter

from test_tight_placement import CrossNodeModel, cluster

from dlsub.policies.api import Allocation, ClusterView, JobView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.speedup import RemainingTime
from dlsub.policies.placement import FreeIndex, grown, pack


def fixed(i: int) -> JobView:
    return JobView(f"r{i}", 0.0, gpus=2, min_gpus=2, max_gpus=2, batch_size=64, model=CrossNodeModel(1.0))


def test_time_on_a_packed_placement_is_time_and_a_spread_one_is_the_models() -> None:
    job = JobView("j", 0.0, gpus=1, min_gpus=1, max_gpus=8, batch_size=64, adaptive_batch=True,
                  model=CrossNodeModel(0.5), remaining=1000.0)
    curve = RemainingTime(job, 4, adapt_batch=True)
    assert curve.time_on((4,)) == curve.time(4) == 250.0
    assert curve.time_on((4, 2)) == curve.time(6)  # packed on 4-GPU nodes: as time() judges it
    assert curve.time_on((2, 2)) == 1000.0 / (4 * 0.5)  # 4 GPUs on two nodes, each worth half
    assert curve.time_on((1, 2, 1)) == curve.time_on((2, 1, 1))


def test_a_job_is_not_grown_over_nodes_where_the_spread_gpus_give_less_than_one_node() -> None:
    """Three 4-GPU nodes, each with two GPUs held by a running job of fixed size; a job of unknown length
    whose GPUs across nodes give 0.2 of one on a node. Valued packed, 4 GPUs look worth more than 2, and it
    is given 4 over two nodes (0.8 of a GPU in all); valued where the GPUs are, it keeps to one node's 2."""
    nodes = cluster(4, 4, 4)
    previous = {f"r{i}": Allocation((f"n{i}", f"n{i}")) for i in range(3)}
    wide = JobView("w", 5.0, gpus=1, min_gpus=1, max_gpus=6, batch_size=64, adaptive_batch=True,
                   model=CrossNodeModel(0.2))
    jobs = [fixed(0), fixed(1), fixed(2), wide]
    off = GoodputPolicy(place_aware=False).decide(jobs, nodes, 10.0, previous)
    on = GoodputPolicy().decide(jobs, nodes, 10.0, previous)  # on by default
    assert len(set(off["w"].nodes)) > 1 and off["w"].gpus > 2
    assert on["w"].gpus == 2 and len(set(on["w"].nodes)) == 1
    assert all(on[name].nodes == previous[name].nodes for name in previous)


def test_a_job_that_gains_across_nodes_still_spreads() -> None:
    nodes = cluster(4, 4, 4)
    previous = {f"r{i}": Allocation((f"n{i}", f"n{i}")) for i in range(3)}
    wide = JobView("w", 5.0, gpus=1, min_gpus=1, max_gpus=6, batch_size=64, adaptive_batch=True,
                   model=CrossNodeModel(0.9))
    on = GoodputPolicy(place_aware=True).decide([fixed(0), fixed(1), fixed(2), wide], nodes, 10.0, previous)
    assert on["w"].gpus == 6 and sum(alloc.gpus for alloc in on.values()) == 12


def test_the_spare_gpus_go_to_the_job_they_serve_on_one_node() -> None:
    """Two jobs of unknown length that scale alike on one node; one node has two GPUs free beside a's, none
    beside b's: they go to a, where they do not spread it."""
    nodes = cluster(4, 4)
    previous = {"a": Allocation(("n0", "n0")), "b": Allocation(("n1", "n1")), "r": Allocation(("n1", "n1"))}
    r = JobView("r", 0.0, gpus=2, min_gpus=2, max_gpus=2, batch_size=64, model=CrossNodeModel(1.0))
    a, b = (JobView(name, 1.0, gpus=1, min_gpus=1, max_gpus=4, batch_size=64, adaptive_batch=True,
                    model=CrossNodeModel(0.3), progress=0.0) for name in "ab")
    on = GoodputPolicy(place_aware=True).decide([r, a, b], nodes, 10.0, previous)
    assert on["a"].gpus == 4 and set(on["a"].nodes) == {"n0"}
    assert on["b"].gpus == 2


def test_live_a_job_grows_on_its_own_nodes_first_a_step_at_a_time() -> None:
    free = Counter({"n0": 1, "n1": 4, "n2": 2})
    assert grown(free.copy(), ("n0", "n0"), 3, 1) == ("n0", "n0", "n0")
    assert grown(free.copy(), ("n0", "n0"), 4, 1) == ("n0", "n0", "n0", "n1")
    assert grown(free.copy(), ("n0", "n0"), 4, 2) == ("n0", "n0", "n1", "n1")
    assert grown(free.copy(), ("n0", "n0", "n2"), 2, 1) == ("n0", "n0")  # a shrink keeps the oldest
    assert grown(Counter({"n0": 1}), ("n0",), 3, 2) is None  # no node holds a step


def test_on_a_cluster_that_grows_in_place_the_placement_is_the_usual_one() -> None:
    """Live (``grow_in_place``) the counts may differ, but the placement of the counts is place_counts'."""
    nodes = ClusterView(cluster(4, 4, 4).nodes, grow_in_place=True)
    previous = {f"r{i}": Allocation((f"n{i}", f"n{i}")) for i in range(3)} | {"w": Allocation(("n0", "n0"))}
    wide = JobView("w", 5.0, gpus=1, min_gpus=1, max_gpus=6, batch_size=64, adaptive_batch=True,
                   model=CrossNodeModel(0.2), running_since_s=5.0)
    on = GoodputPolicy(place_aware=True).decide([fixed(0), fixed(1), fixed(2), wide], nodes, 10.0, previous)
    assert on["w"].nodes == ("n0", "n0")
    assert all(on[f"r{i}"].nodes == previous[f"r{i}"].nodes for i in range(3))


def test_the_free_index_places_as_pack_does_over_every_node() -> None:
    """FreeIndex.pack (goodput's placements on a large cluster) against pack over a full copy, with a job's
    own GPUs counted free, on seeded random clusters; and after changes it keeps both in step."""
    rnd = random.Random(7)
    for _ in range(300):
        names = [f"n{i}" for i in range(rnd.randint(1, 12))]
        free = Counter({node: rnd.randint(0, 4) for node in names})
        index = FreeIndex(free, names)
        for _ in range(3):
            node = rnd.choice(names)
            delta = rnd.randint(-free[node], 4 - free[node])
            if delta:
                index.change(node, delta)
        own = tuple(rnd.choice(names) for _ in range(rnd.randint(0, 3)))
        count = rnd.randint(1, 10)
        room = free.copy()
        room.update(Counter(own))
        assert index.pack(count, own) == pack(room, count)
        assert index.total == sum(free.values())


def test_the_free_index_takes_as_pack_does_with_every_node_of_one_capacity() -> None:
    """FreeIndex.take (sia's placements on a large cluster) against pack with every node's capacity the same,
    over a run of takes on seeded random clusters: the same nodes, the same free GPUs left."""
    rnd = random.Random(11)
    for _ in range(300):
        capacity = rnd.choice([2, 4, 8])
        names = [f"n{i}" for i in range(rnd.randint(1, 12))]
        free = Counter({node: rnd.choice([capacity, rnd.randint(0, capacity)]) for node in names})
        reference = free.copy()
        index = FreeIndex(free, names)
        for _ in range(6):
            count = rnd.randint(0, 2 * capacity + 1)
            assert index.take(count, capacity) == pack(reference, count,
                                                       capacity={node: capacity for node in names})
            assert free == reference and index.total == sum(free.values())
