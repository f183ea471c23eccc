"""Unit tests (pure; no Slurm, no simulator run): a job placed afresh is held to one node unless spreading it
over more nodes pays (dlsub.policies.tight_placement, goodput's ``tight_placement``), and the GPUs it leaves go
to the jobs that got none."""

from __future__ import annotations

from dlsub.policies.api import Allocation, ClusterView, JobView, Node
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.tight_placement import tighten, worth_spreading


class CrossNodeModel:
    """Goodput ``per_gpu`` a GPU, each GPU beyond the first node's worth only ``across`` of one on it (a
    step that synchronises across nodes is slower): a toy, its figures stated here."""

    def __init__(self, across: float, per_gpu: float = 1.0) -> None:
        self.across, self.per_gpu = across, per_gpu

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        if not placement:
            return 0.0
        if len(placement) == 1:
            return self.per_gpu * placement[0]
        return self.per_gpu * sum(placement) * self.across

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        return 64 * max(sum(placement), 1), self.goodput(placement, 0)

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        rate = self.goodput(placement, batch_size)
        return batch_size / rate if rate > 0 else float("inf")


def job(name: str, across: float | None, lo: int = 1, hi: int = 8, arrival: float = 0.0) -> JobView:
    model = None if across is None else CrossNodeModel(across)
    return JobView(name, arrival, gpus=lo, min_gpus=lo, max_gpus=hi, batch_size=64, adaptive_batch=True,
                   model=model)


def cluster(*free: int) -> ClusterView:
    return ClusterView(tuple(Node(f"n{i}", gpus) for i, gpus in enumerate(free)))


def test_worth_spreading_weighs_each_gpu_added_against_the_floor() -> None:
    # On (2, 2) a GPU gives 0.5 of one on a node: 4 x 0.5 = 2.0 against 2.0 on (2,): the two extra add nothing.
    assert not worth_spreading(job("j", 0.5), (2, 2), 2, 0.25)
    # 0.8: 3.2 against 2.0, each extra GPU adds 0.6 of one on a node, above 0.25, below 0.75.
    assert worth_spreading(job("j", 0.8), (2, 2), 2, 0.25)
    assert not worth_spreading(job("j", 0.8), (2, 2), 2, 0.75)
    # No model, or nothing added: nothing says not to.
    assert worth_spreading(job("j", None), (2, 2), 2, 0.25)
    assert worth_spreading(job("j", 0.1), (2,), 2, 0.25)


def test_a_job_spread_where_it_does_not_pay_is_held_to_one_node_and_the_rest_go_to_a_waiting_job() -> None:
    view = cluster(4, 4)
    a, b = job("a", 0.5), job("b", 0.9, arrival=1.0)
    # Another job holds 2 GPUs on each node; a was spread over both nodes' other two.
    decision = {"other": Allocation(("n0", "n0", "n1", "n1")), "a": Allocation(("n0", "n0", "n1", "n1"))}
    order = [a, b]
    out, held = tighten(decision, order, view, {}, 0.25, lambda name, n: 64 * n, per_node=4)
    assert held == ["a"]
    assert out["a"].gpus == 2 and len(set(out["a"].nodes)) == 1 and out["a"].batch_size == 128
    # b had none: it gets its minimum on the node a left.
    assert out["b"].gpus == 1 and out["b"].nodes[0] != out["a"].nodes[0]
    assert out["other"] == decision["other"]


def test_a_job_that_gains_from_spreading_keeps_its_nodes() -> None:
    decision = {"other": Allocation(("n0", "n0", "n1", "n1")), "a": Allocation(("n0", "n0", "n1", "n1"))}
    out, held = tighten(decision, [job("a", 0.9)], cluster(4, 4), {}, 0.25, lambda name, n: 64 * n, per_node=4)
    assert held == [] and out == decision


def test_only_jobs_placed_afresh_are_judged() -> None:
    alloc = Allocation(("n0", "n0", "n1", "n1"))
    decision = {"other": Allocation(("n0", "n0", "n1", "n1")), "a": alloc}
    # a ran on these GPUs already: moving it would cost a restart for nothing the count did not weigh.
    out, held = tighten(decision, [job("a", 0.5)], cluster(4, 4), {"a": alloc}, 0.25, lambda name, n: 64 * n, 4)
    assert held == [] and out == decision
    # Where jobs grow in place (the live agent's partitions), nothing is re-placed.
    live = ClusterView(cluster(4, 4).nodes, grow_in_place=True)
    out, held = tighten(decision, [job("a", 0.5)], live, {}, 0.25, lambda name, n: 64 * n, 4)
    assert held == [] and out == decision


def test_a_job_packed_as_judged_is_left_alone() -> None:
    # 6 GPUs on 4-GPU nodes: (4, 2) is its packed placement, however slow across nodes.
    decision = {"a": Allocation(("n0",) * 4 + ("n1",) * 2)}
    out, held = tighten(decision, [job("a", 0.1)], cluster(4, 4), {}, 0.25, lambda name, n: 64 * n, 4)
    assert held == [] and out == decision


def test_goodput_holds_a_job_to_one_node_only_with_tight_placement_which_is_off_by_default() -> None:
    """Through the policy: three 4-GPU nodes, each with two GPUs held by a running job of fixed size; a new
    job of known length, sized on a packed placement at 4 GPUs, whose GPUs across nodes give 0.2 of one on a
    node: without the rule it is spread over two nodes' free pairs."""
    nodes = cluster(4, 4, 4)
    running = [JobView(f"r{i}", 0.0, gpus=2, min_gpus=2, max_gpus=2, batch_size=64, model=CrossNodeModel(1.0))
               for i in range(3)]
    previous = {f"r{i}": Allocation((f"n{i}", f"n{i}")) for i in range(3)}
    wide = JobView("w", 5.0, gpus=1, min_gpus=1, max_gpus=6, batch_size=64, adaptive_batch=True,
                   model=CrossNodeModel(0.2), remaining=1000.0)
    on = GoodputPolicy(tight_placement=True).decide([*running, wide], nodes, 10.0, previous)
    off = GoodputPolicy().decide([*running, wide], nodes, 10.0, previous)
    assert len(set(off["w"].nodes)) > 1
    assert len(set(on["w"].nodes)) == 1 and on["w"].gpus == 2
    assert all(on[name].nodes == off[name].nodes == previous[name].nodes for name in previous)
