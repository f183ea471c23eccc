"""Unit tests (pure; no Slurm, no fakes needed): invariants of every policy on
synthetic clusters, and each policy's own rule."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from conftest import REPO

from dlsub.policies.api import Allocation, ClusterView, JobView, Node, PolicyError, check_decision, used_gpus
from dlsub.policies.registry import get_policy, policy_class, policy_names
from dlsub.policies.tiresias import SIXTEEN_GPU_HOURS

ALL = ["fifo", "rr", "efifo", "gang", "tiresias", "optimus", "goodput"]


class AmdahlModel:
    """Synthetic performance: a serial fraction of each step does not scale;
    bigger batches are statistically less efficient per sample."""

    def __init__(self, step_1: float, serial: float, base_batch: int = 32, noise_scale: float = 4.0) -> None:
        self.step_1, self.serial, self.base_batch, self.noise_scale = step_1, serial, base_batch, noise_scale

    def step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        n = sum(placement)
        comm = 0.02 * (len(placement) - 1)  # crossing nodes costs
        return self.step_1 * (batch_size / self.base_batch) * ((1 - self.serial) / n + self.serial) + comm

    def goodput(self, placement: tuple[int, ...], batch_size: int) -> float:
        scale = batch_size / self.base_batch
        efficiency = (self.noise_scale + 1) / (self.noise_scale / scale + 1)
        return efficiency / self.step_time(placement, batch_size)

    def best_batch(self, placement: tuple[int, ...]) -> tuple[int, float]:
        candidates = [self.base_batch * k for k in (1, 2, 4, 8)]
        return max(((b, self.goodput(placement, b)) for b in candidates), key=lambda item: item[1])


def synthetic(seed: int) -> tuple[list[JobView], ClusterView, dict[str, Allocation]]:
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i}", rng.choice([2, 4, 8])) for i in range(rng.randint(1, 6)))
    cluster = ClusterView(nodes)
    jobs = []
    for i in range(rng.randint(1, 25)):
        gpus = rng.choice([1, 1, 2, 4, 8])
        gpus = min(gpus, cluster.total_gpus)
        jobs.append(
            JobView(
                name=f"j{i}",
                arrival_s=float(rng.randint(0, 1000)),
                gpus=gpus,
                min_gpus=1,
                max_gpus=max(gpus, rng.choice([1, 4, 16])),
                batch_size=32,
                adaptive_batch=rng.random() < 0.5,
                attained_gpu_s=rng.choice([0.0, 3600.0, SIXTEEN_GPU_HOURS * 2]),
                running_since_s=None,
                waiting_since_s=float(rng.randint(0, 1000)),
                remaining=rng.uniform(100, 10_000),
                model=AmdahlModel(rng.uniform(0.05, 1.0), rng.uniform(0.0, 0.5)),
            )
        )
    return jobs, cluster, {}


def run_twice(policy_name: str, seed: int) -> tuple[list[JobView], ClusterView, dict[str, Allocation]]:
    """Decide, then decide again with the first decision in force (previous allocations)."""
    policy = get_policy(policy_name)
    jobs, cluster, _ = synthetic(seed)
    first = policy.decide(jobs, cluster, 1000.0, {})
    jobs = [
        replace(job, running_since_s=1000.0, waiting_since_s=None) if job.name in first else job for job in jobs
    ]
    second = policy.decide(jobs, cluster, 1060.0, first)
    return jobs, cluster, second


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("seed", range(40))
def test_no_node_over_capacity_and_jobs_within_bounds(name: str, seed: int) -> None:
    policy = get_policy(name)
    jobs, cluster, _ = synthetic(seed)
    elastic = getattr(policy, "elastic", False)
    if not elastic:  # rigid policies run jobs at exactly what they asked for
        jobs = [replace(job, min_gpus=None, max_gpus=None) for job in jobs]
    decision = policy.decide(jobs, cluster, 1000.0, {})
    check_decision(decision, jobs, cluster)
    used = used_gpus(decision)
    assert all(used[node.name] <= node.gpus for node in cluster.nodes)
    for job in jobs:
        if job.name in decision:
            assert job.lo <= decision[job.name].gpus <= job.hi
    # And again with the first decision in force.
    jobs2, cluster2, second = run_twice(name, seed)
    if not elastic:
        jobs2 = [replace(job, min_gpus=None, max_gpus=None) for job in jobs2]
    check_decision(second, jobs2, cluster2)


@pytest.mark.parametrize("seed", range(40))
def test_gang_is_never_partial_and_uses_as_few_nodes_as_it_can(seed: int) -> None:
    jobs, cluster, _ = synthetic(seed)
    jobs = [replace(job, min_gpus=None, max_gpus=None) for job in jobs]
    decision = get_policy("gang").decide(jobs, cluster, 0.0, {})
    free = Counter(cluster.capacity())
    for job in sorted(jobs, key=lambda j: (j.arrival_s, j.name)):  # the order gang places them
        alloc = decision.get(job.name)
        if alloc is None:
            assert job.gpus > sum(free.values()), f"{job.name} fits but was not started"
            continue
        assert alloc.gpus == job.gpus, "a gang is all or nothing"
        # The fewest nodes that had room for it at that moment.
        most_free = sorted(free.values(), reverse=True)
        fewest = next(k for k in range(1, len(most_free) + 1) if sum(most_free[:k]) >= job.gpus)
        assert len(alloc.placement) == fewest, (job, alloc, free)
        free.subtract(alloc.nodes)


def test_gang_keeps_jobs_off_each_others_nodes_when_it_can() -> None:
    cluster = ClusterView.uniform(4, 4)
    jobs = [JobView(f"j{i}", arrival_s=i, gpus=2) for i in range(4)]
    decision = get_policy("gang").decide(jobs, cluster, 0.0, {})
    assert len({alloc.nodes[0] for alloc in decision.values()}) == 4, decision


def test_gang_gives_back_a_partial_allocation_it_inherits() -> None:
    cluster = ClusterView.uniform(2, 4)
    jobs = [JobView("a", 0, gpus=4), JobView("b", 1, gpus=4), JobView("c", 2, gpus=4)]
    partial = {"a": Allocation(("n000", "n000")), "b": Allocation(("n000", "n000")), "c": Allocation(("n001",) * 4)}
    decision = get_policy("gang").decide(jobs, cluster, 0.0, partial)
    assert {name: alloc.gpus for name, alloc in decision.items()} == {"a": 4, "c": 4}


def test_worker_greedy_deadlocks_where_gang_does_not() -> None:
    """Per-worker placement: four 4-worker jobs on 8 GPUs each get 2 and none can run."""
    cluster = ClusterView.uniform(2, 4)
    jobs = [JobView(f"j{i}", arrival_s=0, gpus=4) for i in range(4)]
    greedy = get_policy("worker-greedy").decide(jobs, cluster, 0.0, {})
    assert sum(a.gpus for a in greedy.values()) == 8
    assert all(a.gpus < 4 for a in greedy.values()), "every job half placed"
    gang = get_policy("gang").decide(jobs, cluster, 0.0, {})
    assert sorted(a.gpus for a in gang.values()) == [4, 4]


@pytest.mark.parametrize("seed", range(40))
def test_fifo_keeps_arrival_order(seed: int) -> None:
    jobs, cluster, _ = synthetic(seed)
    jobs = [replace(job, min_gpus=None, max_gpus=None) for job in jobs]
    decision = get_policy("fifo").decide(jobs, cluster, 0.0, {})
    free = cluster.total_gpus - sum(a.gpus for a in decision.values())
    for job in jobs:
        if job.name not in decision:
            # A waiting job is one that did not fit once every older job was placed.
            assert job.gpus > free or _older_jobs_block(job, jobs, decision, cluster)


def _older_jobs_block(job: JobView, jobs: list[JobView], decision: dict[str, Allocation], cluster: ClusterView) -> bool:
    older = [j for j in jobs if (j.arrival_s, j.name) < (job.arrival_s, job.name) and j.name in decision]
    return sum(decision[j.name].gpus for j in older) + job.gpus > cluster.total_gpus


def test_fifo_never_preempts_and_head_of_line_goes_first() -> None:
    cluster = ClusterView.uniform(1, 4)
    running = JobView("late-but-running", arrival_s=50, gpus=2)
    head = JobView("head", arrival_s=10, gpus=4)
    small = JobView("small", arrival_s=20, gpus=2)
    previous = {"late-but-running": Allocation(("n000", "n000"))}
    decision = get_policy("fifo").decide([running, head, small], cluster, 0.0, previous)
    assert decision["late-but-running"] == previous["late-but-running"]
    assert "head" not in decision and decision["small"].gpus == 2  # small backfills, head cannot fit
    decision = get_policy("fifo").decide([head, small], ClusterView.uniform(1, 4), 0.0, {})
    assert list(decision) == ["head"]


def test_tiresias_demotes_after_sixteen_gpu_hours() -> None:
    cluster = ClusterView.uniform(1, 4)
    old = JobView("old", arrival_s=0, gpus=4, attained_gpu_s=SIXTEEN_GPU_HOURS - 1)
    new = JobView("new", arrival_s=100, gpus=4)
    policy = get_policy("tiresias")
    running = {"old": Allocation(("n000",) * 4)}
    assert list(policy.decide([old, new], cluster, 0.0, running)) == ["old"]
    demoted = replace(old, attained_gpu_s=SIXTEEN_GPU_HOURS)
    assert list(policy.decide([demoted, new], cluster, 0.0, running)) == ["new"], "demoted job is preempted"


def test_rr_rotates_after_a_slice() -> None:
    cluster = ClusterView.uniform(1, 4)
    policy = get_policy("rr")
    a = JobView("a", arrival_s=0, gpus=4, running_since_s=0.0)
    b = JobView("b", arrival_s=1, gpus=4, waiting_since_s=1.0)
    running = {"a": Allocation(("n000",) * 4)}
    assert list(policy.decide([a, b], cluster, 300.0, running)) == ["a"]
    assert list(policy.decide([a, b], cluster, 601.0, running)) == ["b"]


def test_efifo_gives_minimums_in_order_then_spare_to_the_oldest() -> None:
    cluster = ClusterView.uniform(2, 4)
    jobs = [JobView(f"j{i}", arrival_s=i, gpus=1, min_gpus=1, max_gpus=4) for i in range(3)]
    decision = get_policy("efifo").decide(jobs, cluster, 0.0, {})
    assert [decision[f"j{i}"].gpus for i in range(3)] == [4, 3, 1]


def test_optimus_gives_the_extra_gpu_where_it_saves_most() -> None:
    cluster = ClusterView.uniform(1, 3)
    scales = JobView("scales", 0, gpus=1, min_gpus=1, max_gpus=4, batch_size=32, remaining=1000.0,
                     model=AmdahlModel(1.0, 0.0))
    serial = JobView("serial", 1, gpus=1, min_gpus=1, max_gpus=4, batch_size=32, remaining=1000.0,
                     model=AmdahlModel(1.0, 0.9))
    decision = get_policy("optimus").decide([scales, serial], cluster, 0.0, {})
    assert decision["scales"].gpus == 2 and decision["serial"].gpus == 1


def test_goodput_serves_shortest_first_and_scales_what_scales() -> None:
    cluster = ClusterView.uniform(1, 4)
    short = JobView("short", 5, gpus=1, min_gpus=1, max_gpus=4, batch_size=32, adaptive_batch=True,
                    remaining=100.0, model=AmdahlModel(0.1, 0.0))
    long = JobView("long", 0, gpus=1, min_gpus=1, max_gpus=4, batch_size=32, adaptive_batch=True,
                   remaining=100_000.0, model=AmdahlModel(0.1, 0.0))
    decision = get_policy("goodput").decide([long, short], cluster, 0.0, {})
    assert decision["short"].gpus >= 2, decision
    assert decision["short"].batch_size is not None


def test_goodput_keeps_a_running_job_when_a_change_saves_too_little() -> None:
    cluster = ClusterView.uniform(1, 4)
    job = JobView("j", 0, gpus=1, min_gpus=1, max_gpus=4, batch_size=32, adaptive_batch=True,
                  remaining=10.0, model=AmdahlModel(0.1, 0.0))
    previous = {"j": Allocation(("n000",), 32)}
    decision = get_policy("goodput").decide([job], cluster, 0.0, previous)
    assert decision["j"].gpus == 1, "a restart would cost more than it saves"


def test_registry_lists_valid_names_on_error() -> None:
    with pytest.raises(PolicyError) as info:
        get_policy("sjf")
    for name in ALL:
        assert name in str(info.value)
    assert set(ALL) <= set(policy_names())


def test_each_name_is_its_policys_own_and_naming_them_imports_none() -> None:
    """Unit (no Slurm): the registry names each policy by the class's own name, and checking a name (what
    policy.toml's reading does in every `dlsub` command) imports no policy module (SciPy behind goodput)."""
    for name in policy_names():
        assert policy_class(name).name == name
    code = ("import sys; from dlsub.policies.registry import policy_names; policy_names(); "
            "print(sorted(m for m in sys.modules if m.startswith(('dlsub.policies.', 'scipy')) "
            "and m not in ('dlsub.policies.registry', 'dlsub.policies.api')))")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.strip()
    assert imported == "[]", imported


def test_check_decision_catches_overcommit_and_bounds() -> None:
    cluster = ClusterView.uniform(1, 2)
    job = JobView("j", 0, gpus=2)
    with pytest.raises(PolicyError, match="over capacity"):
        check_decision({"j": Allocation(("n000",) * 3)}, [job], cluster)
    with pytest.raises(PolicyError, match="outside"):
        check_decision({"j": Allocation(("n000",))}, [job], cluster)
    assert Counter(Allocation(("a", "b", "a")).nodes) == Counter({"a": 2, "b": 1})
