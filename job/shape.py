"""A job's shape from the submit options: GPUs per node, and a fixed or elastic number of nodes.

``--nodes N`` or ``--nodes MIN:MAX`` (elastic in whole nodes); ``--gpus-per-node G``;
or ``--gpus`` as a total split evenly over the nodes (``--gpus 4 --nodes 2`` is
two per node). ``--gpus MIN:MAX`` alone is elastic in GPUs: the main job holds
MIN GPUs of one node and each worker adds ``--gpus-step K`` GPUs (default 1),
on that node or another; with ``--gpus-per-node G`` it is a range of whole
nodes of G GPUs instead. Pure: text in, a shape or a :class:`ShapeError` that
says what to write instead.

An elastic job is a main job and workers that join its rendezvous: a shape
counts them as *members* (``nodes`` to ``max_members``); each worker is one task
of ``worker_gpus`` GPUs on one node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COUNT = re.compile(r"^\s*(\d{1,4})\s*(?::\s*(\d{1,4})\s*)?$")


class ShapeError(ValueError):
    """Options that do not describe a job's shape; the message says what to write."""


@dataclass(frozen=True)
class Shape:
    gpus_per_node: int
    nodes: int  # the fixed number, or an elastic job's minimum
    max_members: int | None = None  # an elastic job's most members: the main job's nodes and its workers
    worker_gpus: int = 0  # GPUs of each worker (0: a whole node's, ``gpus_per_node``)

    @property
    def elastic(self) -> bool:
        return self.max_members is not None

    @property
    def gpus_per_worker(self) -> int:
        return self.worker_gpus or self.gpus_per_node


def parse_count(option: str, text: str | int | None) -> tuple[int, int | None] | None:
    """``"N"`` as (N, None), ``"MIN:MAX"`` as (MIN, MAX); None when not given."""
    if text is None:
        return None
    if isinstance(text, int):
        return text, None
    m = _COUNT.match(text)
    if not m:
        raise ShapeError(f"{option} {text!r}: give a number (2) or an elastic range MIN:MAX (1:4)")
    low, high = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    if high is not None and high <= low:
        raise ShapeError(f"{option} {text}: an elastic range MIN:MAX needs MIN < MAX; "
                         f"for a fixed size give one number")
    return low, high


def resolve_shape(nodes: str | int | None, gpus: str | int | None, gpus_per_node: int | None,
                  gpus_step: int | None = None) -> Shape:
    if gpus_step is not None and (gpus_step < 1 or not _in_gpu_steps(nodes, gpus, gpus_per_node)):
        raise ShapeError(f"--gpus-step {gpus_step}: give a step of 1 or more GPUs, with an elastic --gpus MIN:MAX "
                         "(and no --nodes or --gpus-per-node, which make it grow by whole nodes)")
    node_count = parse_count("--nodes", nodes) or (1, None)
    gpu_count = parse_count("--gpus", gpus)
    if node_count[0] < 1:
        raise ShapeError(f"--nodes must be 1 or more, not {node_count[0]}")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise ShapeError(f"--gpus-per-node must be 0 or more, not {gpus_per_node}")
    if gpu_count is None:
        return Shape(gpus_per_node or 0, *node_count)
    total, total_max = gpu_count
    if total_max is not None:
        if node_count[1] is not None or node_count[0] != 1:
            raise ShapeError("give the elastic range once: --gpus MIN:MAX or --nodes MIN:MAX, not both")
        if gpus_per_node is None:
            return _gpu_steps(total, total_max, gpus_step or 1)
        per_node = gpus_per_node
        if per_node < 1 or total % per_node or total_max % per_node:
            raise ShapeError(f"--gpus {total}:{total_max}: grows and shrinks by whole nodes of {per_node} GPUs, "
                             f"so MIN and MAX must be multiples of {per_node} (or set --gpus-per-node)")
        return Shape(per_node, total // per_node, total_max // per_node)
    if gpus_per_node is not None and total != gpus_per_node * node_count[0]:
        raise ShapeError(f"--gpus {total} (a total) disagrees with --gpus-per-node {gpus_per_node} on "
                         f"{node_count[0]} node(s); give one of them")
    if total % node_count[0]:
        raise ShapeError(f"--gpus {total} does not split evenly over {node_count[0]} nodes; "
                         f"use --gpus-per-node, or a multiple of {node_count[0]}")
    return Shape(total // node_count[0], *node_count)


def _in_gpu_steps(nodes: str | int | None, gpus: str | int | None, gpus_per_node: int | None) -> bool:
    """Whether the options ask for a job elastic in GPUs (``--gpus MIN:MAX`` alone)."""
    count = parse_count("--gpus", gpus)
    return count is not None and count[1] is not None and nodes is None and gpus_per_node is None


def _gpu_steps(low: int, high: int, step: int) -> Shape:
    """``--gpus LOW:HIGH --gpus-step STEP``: a main job of LOW GPUs on one node and (HIGH - LOW) / STEP
    workers of STEP GPUs each."""
    if low < 1:
        raise ShapeError(f"--gpus {low}:{high}: an elastic job starts on 1 GPU or more; give MIN >= 1")
    if (high - low) % step:
        raise ShapeError(f"--gpus {low}:{high} grows by --gpus-step {step} GPU(s) at a time, so MAX - MIN must be "
                         f"a multiple of {step}; try --gpus {low}:{low + step * max(1, (high - low) // step)}")
    return Shape(low, 1, 1 + (high - low) // step, worker_gpus=step)
