"""Unit tests (pure; no Slurm, no simulator run): goodput's ``pollux_placement`` option places the counts as
Pollux places them (issue 32): a job whose count no node holds is not spread onto nodes another multi-node job
already spans, and is held to one node where spreading it would not pay."""

from __future__ import annotations

from dlsub.policies.api import Allocation, ClusterView, JobView, Node
from dlsub.policies.goodput import GoodputPolicy


class LinearModel:
    """A toy: goodput ``n`` on n GPUs on one node, ``0.9 n`` across nodes, at any batch (its figures here)."""

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        return float(sum(placement)) * (1.0 if len(placement) == 1 else 0.9)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64, self.goodput(placement, 64)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        rate = self.goodput(placement, batch_size)
        return batch_size / rate if rate > 0 else float("inf")


def fixed(name: str, gpus: int) -> JobView:
    """A running job that cannot be resized (its minimum is its maximum)."""
    return JobView(name, 0.0, gpus=gpus, min_gpus=gpus, max_gpus=gpus, batch_size=64, remaining=3600.0,
                   model=LinearModel())


def decide(policy: GoodputPolicy) -> dict[str, Allocation]:
    # Three 4-GPU nodes: x spans n0 and n1 (2 + 2), y holds 2 of n2; a new job a scales linearly up to 4.
    view = ClusterView(tuple(Node(f"n{i}", 4) for i in range(3)))
    previous = {"x": Allocation(("n0", "n0", "n1", "n1"), 64), "y": Allocation(("n2", "n2"), 64)}
    a = JobView("a", 10.0, gpus=0, min_gpus=1, max_gpus=4, batch_size=64, remaining=36000.0, model=LinearModel())
    return policy.decide([fixed("x", 4), fixed("y", 2), a], view, 100.0, previous)


def test_default_spreads_the_new_job_onto_the_nodes_a_multi_node_job_spans() -> None:
    # The six free GPUs are two per node: the default gives a 4, over two or more nodes, some of x's.
    decision = decide(GoodputPolicy())
    assert decision["a"].gpus == 4
    assert set(decision["a"].nodes) & {"n0", "n1"}


def test_pollux_placement_keeps_the_new_job_off_a_spanned_node() -> None:
    decision = decide(GoodputPolicy(pollux_placement=True))
    # Spread, a could have n2's two only (n0 and n1 host x, a multi-node job): no spread at all. Two on one
    # node (2.0) beat that, and beat 4 across nodes at 0.9 each only by the rule: a is held to one node.
    assert decision["a"].gpus == 2 and len(set(decision["a"].nodes)) == 1
    assert decision["x"].nodes == ("n0", "n0", "n1", "n1") and decision["y"].nodes == ("n2", "n2")
