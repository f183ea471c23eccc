"""Unit: partition choice (pure), on clusters built from value objects."""

from __future__ import annotations

import dataclasses

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


# ---------------------------------------------------------------- a site's two GPU partitions of different models
def two_models(a100_used: int = 0, l40s_used: int = 0, **l40s: object) -> list[Partition]:
    """An A100 partition and an L40S one (their own nodes, typed GRES), and the CPU partition."""
    a100 = tuple(SlurmNode(f"a{i}", "idle", ("gpu-a100",), 4, 0, 8000, 0, 4, a100_used, gpu_type="a100")
                 for i in (1, 2))
    l40 = tuple(SlurmNode(f"l{i}", "idle", ("gpu-l40s",), 4, 0, 8000, 0, 4, l40s_used, gpu_type="l40s")
                for i in (1, 2))
    return [Partition("cpu", (node("cpu1", ("cpu",)),), None, 60, default=True),
            Partition("gpu-a100", a100, None, 60), Partition("gpu-l40s", l40, None, 60, **l40s)]  # type: ignore[arg-type]


def test_a_gpu_type_chooses_the_partition_of_that_model() -> None:
    """--gpu-type l40s goes to the L40S partition though the A100 one is idle too (and first by name); with the
    L40S partition full it waits there (ideal mode) or starts on CPUs to move there (immediate mode), never on
    the A100s, which sbatch would refuse for gres:gpu:l40s."""
    assert choose_partition(two_models(), req(gpus_per_node=1, gpu_type="l40s")).partition == "gpu-l40s"
    assert choose_partition(two_models(), req(gpus_per_node=1, gpu_type="a100")).partition == "gpu-a100"
    full = two_models(l40s_used=4)
    waiting = choose_partition(full, req(gpus_per_node=1, gpu_type="l40s"))
    assert (waiting.partition, waiting.starts_now) == ("gpu-l40s", False)
    started = choose_partition(full, req(gpus_per_node=1, gpu_type="l40s", immediate=True))
    assert (started.partition, started.ideal_partition) == ("cpu", "gpu-l40s")
    untyped = choose_partition(two_models(a100_used=4), req(gpus_per_node=1))
    assert untyped.partition == "gpu-l40s" and untyped.starts_now, "without a type, whichever model is free"


def test_a_gpu_type_no_partition_has_says_which_have_what() -> None:
    with pytest.raises(PlanningError, match=r"gpu-a100 has no node with 1 h100 GPU\(s\) \(GPU types there: a100\); "
                       r"gpu-l40s has no node with 1 h100 GPU\(s\) \(GPU types there: l40s\)"):
        choose_partition(two_models(), req(gpus_per_node=1, gpu_type="h100"))


def test_a_partition_the_users_groups_or_account_may_not_use_is_never_chosen() -> None:
    """AllowGroups, AllowAccounts and DenyAccounts as Slurm applies them: a partition that would refuse the job
    is passed over for one that takes it, and where none does the error says why for each."""
    parts = two_models(allow_groups=("l40s-users",))
    mine = req(gpus_per_node=1, gpu_type="l40s", groups=frozenset({"alice", "lab"}))
    with pytest.raises(PlanningError, match=r"gpu-l40s is for the groups l40s-users only \(its user is in none"):
        choose_partition(parts, mine)
    allowed = dataclasses.replace(mine, groups=frozenset({"alice", "l40s-users"}))
    assert choose_partition(parts, allowed).partition == "gpu-l40s"
    busy_a100 = two_models(a100_used=4, allow_groups=("l40s-users",))
    any_kind = req(gpus_per_node=1, groups=frozenset({"alice"}))
    assert choose_partition(busy_a100, any_kind).partition == "gpu-a100", "waits where it may run, not there"
    accounts = two_models(a100_used=4, allow_accounts=("physics",))
    assert choose_partition(accounts, dataclasses.replace(any_kind, account="physics")).partition == "gpu-l40s"
    assert choose_partition(accounts, dataclasses.replace(any_kind, account="chem")).partition == "gpu-a100"
    denied = two_models(a100_used=4, deny_accounts=("chem",))
    assert choose_partition(denied, dataclasses.replace(any_kind, account="chem")).partition == "gpu-a100"
    assert choose_partition(two_models(a100_used=4, allow_groups=("l40s-users",)),
                            req(gpus_per_node=1)).partition == "gpu-l40s", "who asks unknown: not checked"
