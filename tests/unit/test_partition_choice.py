"""Unit: partition choice (pure), on clusters built from value objects."""

from __future__ import annotations

import pytest

from dlsub.job.partition_choice import PlanningError, Request, choose_partition
from dlsub.slurm_plugins.models import Partition, SlurmNode


def node(name: str, parts: tuple[str, ...], gpus: int = 0, gpus_used: int = 0, alloc_cpus: int = 0,
         state: str = "idle") -> SlurmNode:
    return SlurmNode(name, state, parts, 4, alloc_cpus, 8000, 0, gpus, gpus_used)


def cluster(gpu_used: int = 0) -> list[Partition]:
    cpu = (node("cpu1", ("cpu",)), node("cpu2", ("cpu",)))
    gpu = (node("gpu1", ("gpu", "gpu-dev"), 4, gpu_used), node("gpu2", ("gpu", "gpu-dev"), 4, gpu_used))
    return [
        Partition("cpu", cpu, None, 60, default=True),
        Partition("gpu", gpu, None, 60),
        Partition("gpu-dev", gpu, 10, 10),
    ]


def req(**kw: object) -> Request:
    base = dict(gpus_per_node=0, cpus=2, mem_mb=1000, time_limit_min=None)
    base.update(kw)
    return Request(**base)  # type: ignore[arg-type]


def test_cpu_job_goes_to_cpu_partition() -> None:
    choice = choose_partition(cluster(), req())
    assert choice.partition == "cpu" and choice.starts_now


def test_gpu_job_prefers_long_queue_over_dev_queue() -> None:
    assert choose_partition(cluster(), req(gpus_per_node=2)).partition == "gpu"


def test_gpu_job_longer_than_dev_maxtime_never_goes_to_dev() -> None:
    choice = choose_partition(cluster(gpu_used=4), req(gpus_per_node=1, time_limit_min=30))
    assert choice.partition == "gpu" and not choice.starts_now


def test_too_many_gpus_names_the_maximum() -> None:
    with pytest.raises(PlanningError, match=r"most one node offers is 4 \(partition gpu, gpu-dev\)"):
        choose_partition(cluster(), req(gpus_per_node=5))


def test_unknown_partition_lists_valid_ones() -> None:
    with pytest.raises(PlanningError, match="unknown partition 'gpu-big'.*cpu, gpu, gpu-dev"):
        choose_partition(cluster(), req(partition="gpu-big"))


def test_explicit_partition_too_short_for_time() -> None:
    with pytest.raises(PlanningError, match="gpu-dev allows at most 00:10:00"):
        choose_partition(cluster(), req(gpus_per_node=1, partition="gpu-dev", time_limit_min=60))


def test_gpus_on_cpu_partition_rejected() -> None:
    with pytest.raises(PlanningError, match="cpu has at most 0 GPUs per node"):
        choose_partition(cluster(), req(gpus_per_node=1, partition="cpu"))


def test_down_nodes_do_not_count_as_free() -> None:
    parts = cluster()
    down = tuple(SlurmNode(n.name, "down", n.partitions, 4, 0, 8000, 0, 0, 0) for n in parts[0].nodes)
    parts[0] = Partition("cpu", down, None, 60, default=True)
    choice = choose_partition(parts, req())
    assert choice.partition == "gpu" and choice.starts_now  # only GPU nodes are up
