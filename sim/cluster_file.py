"""``--cluster FILE``: the simulated cluster, in TOML.

Either uniform::

    nodes = 16
    gpus_per_node = 4

or node groups, each a partition, optionally of one GPU type (a type
names the ``placements-<type>.csv`` traces its GPUs run at; see
``--traces``)::

    [[group]]
    partition = "gpu"
    nodes = 8
    gpus_per_node = 4
    gpu_type = "aws"

Either every group names a GPU type or none does.

Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlsub.policies.api import ClusterView, Node
from dlsub.strict import read_toml, unknown_keys

TOP_KEYS = {"nodes", "gpus_per_node", "cpus_per_node", "group"}
GROUP_KEYS = {"partition", "nodes", "gpus_per_node", "cpus_per_node", "gpu_type"}
DEFAULT_NODES, DEFAULT_GPUS = 16, 4


class ClusterFileError(ValueError):
    pass


def _positive(where: str, table: dict[str, Any], key: str, default: int | None) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "cpus_per_node" else 1):
        raise ClusterFileError(f"{where}: {key} must be a positive integer, not {value!r}")
    return value


def _check_keys(where: str, table: dict[str, Any], valid: set[str]) -> None:
    message = unknown_keys(where, table, valid)
    if message:
        raise ClusterFileError(message)


def default_cluster() -> ClusterView:
    return ClusterView.uniform(DEFAULT_NODES, DEFAULT_GPUS)


def load_cluster(path: Path) -> ClusterView:
    data = read_toml(path, "cluster file", ClusterFileError)
    _check_keys(str(path), data, TOP_KEYS)
    groups = data.get("group")
    if groups is None:
        groups = [{k: v for k, v in data.items() if k != "group"}]
    elif set(data) - {"group"}:
        raise ClusterFileError(f"{path}: use either top-level nodes/gpus_per_node or [[group]] tables, not both")
    nodes: list[Node] = []
    for i, group in enumerate(groups):
        where = f"{path}: group {i + 1}"
        _check_keys(where, group, GROUP_KEYS)
        count = _positive(where, group, "nodes", DEFAULT_NODES)
        gpus = _positive(where, group, "gpus_per_node", DEFAULT_GPUS)
        cpus = _positive(where, group, "cpus_per_node", 0)
        partition = str(group.get("partition", "gpu"))
        gpu_type = group.get("gpu_type", "")
        if not isinstance(gpu_type, str) or ("gpu_type" in group and not gpu_type.strip()) or "/" in gpu_type:
            raise ClusterFileError(f"{where}: gpu_type must be a GPU type's name (as in placements-<type>.csv), "
                                   f"not {gpu_type!r}")
        start = len(nodes)
        nodes.extend(Node(f"{partition}{start + j:03d}", gpus, cpus, partition, gpu_type) for j in range(count))
    typed = {bool(node.gpu_type) for node in nodes}
    if len(typed) > 1:
        raise ClusterFileError(f"{path}: some groups name a gpu_type and some do not; name one for every group "
                               "(or for none, a cluster of one kind of GPU)")
    return ClusterView(tuple(nodes))
