"""A job's shape from the submit options: GPUs per node, and a fixed or elastic number of nodes.

``--nodes N`` or ``--nodes MIN:MAX`` (elastic); ``--gpus-per-node G``; or
``--gpus`` as a total split evenly over the nodes (``--gpus 4 --nodes 2`` is
two per node), or ``--gpus MIN:MAX`` as an elastic range of whole nodes of
``G`` GPUs each (``G`` from ``--gpus-per-node``, else MIN: one node holds
MIN GPUs and each node added brings as many). Pure: text in, a shape or a
:class:`ShapeError` that says what to write instead.
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
    max_nodes: int | None = None  # an elastic job's maximum (None: fixed)

    @property
    def elastic(self) -> bool:
        return self.max_nodes is not None


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


def resolve_shape(nodes: str | int | None, gpus: str | int | None, gpus_per_node: int | None) -> Shape:
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
        per_node = gpus_per_node or total
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
