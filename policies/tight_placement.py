"""A job placed afresh keeps to one node unless spreading it pays (issue 32).

A policy that sizes jobs on packed placements (``goodput``) then places them
where GPUs are free; as the cluster fills, the free GPUs are scattered and a
job of four GPUs gets them on three nodes, where each step synchronises
across the network. On generated workloads at 2.0x load (seed 1)
goodput's yolov3 jobs ran 2.7 GPUs on 1.58 nodes, 0.84 of one GPU's goodput
per GPU, against pollux's 1.8 on 1.06 at 0.91: 15.9 GPU-hours a job against
11.9. Pollux's placement search never spreads a job where the GPUs on one
node serve it as well (``place_pollux``); this is that rule for goodput,
with goodput's own measure of a GPU's worth: the GPUs a spread placement
adds over the most of its count that one node holds must each add at least
``floor`` of what a GPU gives on that one node, else the job runs on the one
node and the GPUs it leaves go to the jobs that got none, in the policy's
order.

Only jobs placed afresh (new, or resized where jobs move, as in the
simulator) are judged. Live, a running job grows in place, a worker at a
time on its own nodes first (``ClusterView.grow_in_place``), so this never
changes a live job's placement.

Pure: counts and views in, a decision out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, JobView
from dlsub.policies.perf_models.speedup import fixed_batch, goodput_at
from dlsub.policies.placement import free_gpus, pack, packed_placement


def rate_on(job: JobView, placement: tuple[int, ...]) -> float:
    """The job's goodput on ``placement`` as its model rates it: at its best batch there when the policy
    chooses its batch, else at its own."""
    model = job.model
    if model is None or not placement:
        return 0.0
    return goodput_at(model, placement, fixed_batch(job))


def worth_spreading(job: JobView, spread: tuple[int, ...], one_node: int, floor: float) -> bool:
    """Whether the GPUs ``spread`` (GPUs per node) adds over ``one_node`` GPUs on one node each add at least
    ``floor`` of a GPU's goodput there. A job without a model is always worth it: nothing says otherwise."""
    extra = sum(spread) - one_node
    if job.model is None or extra <= 0:
        return True
    tight = rate_on(job, (one_node,))
    if tight <= 0:
        return True
    return rate_on(job, spread) - tight >= floor * extra * tight / one_node


def tighten(decision: Decision, order: Sequence[JobView], cluster: ClusterView, previous: Allocations,
            floor: float, batch_at: Callable[[str, int], int | None], per_node: int) -> tuple[Decision, list[str]]:
    """``decision`` with each job placed afresh over more nodes than its count packs onto held to the most of
    its count one node holds, where spreading is not worth ``floor`` (:func:`worth_spreading`); GPUs freed
    that way go to the jobs in ``order`` (the policy's) that got none, where one node holds a job's minimum.
    ``batch_at(name, gpus)``: the batch a job is given on that many GPUs. Returns the decision and the
    names of the jobs held to one node."""
    if cluster.grow_in_place:
        return decision, []
    by_name = {job.name: job for job in order}
    out = dict(decision)

    def spread_wider(name: str, alloc: Allocation) -> bool:
        """Placed afresh over more nodes than its count packs onto."""
        packing = min(per_node, by_name[name].packing or per_node)
        return ((name not in previous or previous[name].nodes != alloc.nodes)
                and len(alloc.placement) > len(packed_placement(alloc.gpus, packing)))

    spread_out = sorted((name for name, alloc in decision.items() if name in by_name and spread_wider(name, alloc)),
                        key=lambda name: (-decision[name].gpus, by_name[name].arrival_s, name))
    held: list[str] = []
    for name in spread_out:
        job, alloc = by_name[name], out.pop(name)
        free = free_gpus(cluster, out)
        most = job.allowed(min(alloc.gpus, max(free.values(), default=0)))
        if most <= 0 or worth_spreading(job, alloc.placement, most, floor):
            out[name] = alloc
            continue
        nodes = pack(free, most)
        assert nodes is not None  # most fits on the fullest node
        out[name] = Allocation(nodes, batch_at(name, most))
        held.append(name)
    if held:
        _backfill(out, order, cluster, batch_at)
    return out, held


def _backfill(decision: dict[str, Allocation], order: Sequence[JobView], cluster: ClusterView,
              batch_at: Callable[[str, int], int | None]) -> None:
    """Give each job in ``order`` that has no GPUs its minimum where one node's free GPUs hold it (into
    ``decision``)."""
    free = free_gpus(cluster, decision)
    for job in order:
        lo = max(job.lo, 1)
        if job.name in decision or lo > max(free.values(), default=0):
            continue  # only on one node: spread, it would be what this rule keeps jobs from
        nodes = pack(free, lo)
        if nodes is not None:
            decision[job.name] = Allocation(nodes, batch_at(job.name, lo))
