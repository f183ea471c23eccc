"""Unit (stateful fake Slurm, fake clock): with ``policy = "goodput"`` the agent sizes elastic jobs on the
throughput they measured, and the agent and the simulator run one policy code path.

Two elastic jobs of 2 GPUs a node share the gpu partition: a poor
scaler (older; it ran on 1 and 2 nodes and was no faster on 2) and a good
scaler (newer; it ran on 1 node). One node's worth of GPUs is idle. The jobs'
progress files are what dlsub's library writes (start events with the
group's size, progress reports with steps and samples).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_world import ME, NOW, World, policy

from dlsub.policies.api import Allocation, ClusterView
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.perf_models.fitted_model import FittedPerformance
from dlsub.sim.engine import SimConfig, simulate
from dlsub.sim.workload import POLLUX_DIR, read_workload

POOR, GOOD = "00000bad", "0000900d"  # dlsub ids are 8 hex digits


def tags(dlsub_id: str, max_nodes: int) -> str:
    return f"dlsub:{dlsub_id};mode=ideal;ideal=gpu;gpus=2;nodes=1-{max_nodes}"


def reports(job_dir: Path, job_id: int, sizes: list[tuple[int, float]], *, batch: int = 64,
            start: dict[str, Any] | None = None, report: dict[str, Any] | None = None) -> None:
    """The library's events: at each (nodes, steps/s), a start with the group's size and 4 reports 5 s apart
    (``start`` and ``report``: more fields for each)."""
    events: list[dict[str, Any]] = []
    t, step = NOW - 60 * len(sizes), 0
    for nodes, rate in sizes:
        attempt = f"{job_id}-0"
        events.append({"event": "start", "time": t, "attempt": attempt, "world_size": 2 * nodes, "nodes": nodes,
                       **(start or {})})
        for _ in range(4):
            t += 5
            step += round(5 * rate)
            events.append({"event": "progress", "time": t, "attempt": attempt, "step": step,
                           "samples": step * batch, "total_steps": 20000, **(report or {})})
        t += 40
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))


def two_jobs(world: World) -> tuple[int, int, int, int]:
    """The poor scaler on gpu1 + a worker on gpu2; the good scaler on gpu1; gpu2 has one 2-GPU slot idle."""
    poor_array, poor_dir = world.worker_array(POOR, tags(POOR, 3), uid=ME, tasks=2, gpus_per_node=2)
    poor, _ = world.submit(POOR, uid=ME, comment=tags(POOR, 3), partition="gpu", gres="gpu:2", start_on="gpu1",
                           job_dir=poor_dir, start=NOW - 200)
    world.fake.start(world.fake.task(f"{poor_array}_0").job_id, "gpu2", int(NOW - 100))
    good_array, good_dir = world.worker_array(GOOD, tags(GOOD, 2), uid=ME, gpus_per_node=2)
    good, _ = world.submit(GOOD, uid=ME, comment=tags(GOOD, 2), partition="gpu", gres="gpu:2",
                           start_on="gpu1", job_dir=good_dir, start=NOW - 60)
    reports(poor_dir, poor, [(1, 4.0), (2, 4.04)])
    reports(good_dir, good, [(1, 4.0)])
    return poor, poor_array, good, good_array


def test_the_idle_node_goes_to_the_job_that_scales_well_and_why_shows_the_figures(tmp_path: Path) -> None:
    world = World(tmp_path, policy(policy="goodput"))
    poor, poor_array, good, good_array = two_jobs(world)
    world.agent().tick(NOW)
    assert world.fake.task(f"{good_array}_0").reason == "None", "the good scaler's worker is released"
    assert world.fake.task(f"{poor_array}_1").reason == "JobHeldUser", "the poor scaler does not grow"
    assert world.store is not None
    grows = [d for d in world.store.decisions() if d.kind == "grow"]
    assert [d.dlsub_id for d in grows] == [GOOD]
    assert "measured 1 node (2 GPUs) 256 samples/s; predicted 2 nodes" in grows[0].reason
    assert "goodput policy" in grows[0].reason


def test_a_job_that_lets_dlsub_choose_its_batch_is_told_the_batch_before_it_grows(tmp_path: Path) -> None:
    """It declared its limits (start event) and reports noisy gradients: a bigger batch pays, and the policy's
    batch for 2 nodes is in its mailbox (agent/batch.json) when its worker is released."""
    world = World(tmp_path, policy(policy="goodput"))
    array, job_dir = world.worker_array(GOOD, tags(GOOD, 2), uid=ME, gpus_per_node=2)
    main, _ = world.submit(GOOD, uid=ME, comment=tags(GOOD, 2), partition="gpu", gres="gpu:2", start_on="gpu1",
                           job_dir=job_dir, start=NOW - 60)
    (job_dir / "agent").mkdir()
    limits = {"init": 64, "max": 1024, "local_min": 8, "local_max": 64}
    reports(job_dir, main, [(1, 4.0)], start={"batch_limits": limits, "batch_size": 64, "accumulation_steps": 1},
            report={"grad_sqr": 1.0, "grad_var": 40.0})
    world.agent().tick(NOW)
    assert world.fake.task(f"{array}_0").reason == "None"
    told = json.loads((job_dir / "agent" / "batch.json").read_text())
    assert 64 < told["batch_size"] <= 1024 and told["accumulation_steps"] >= 1, told
    assert told["batch_size"] % (4 * told["accumulation_steps"]) == 0, "it splits evenly over 4 GPUs"
    assert world.store is not None
    (grow,) = [d.reason for d in world.store.decisions() if d.kind == "grow"]
    assert f"batch {told['batch_size']}" in grow, grow


def test_a_job_without_a_mailbox_grows_with_the_batch_it_has(tmp_path: Path) -> None:
    world = World(tmp_path, policy(policy="goodput"))
    array, job_dir = world.worker_array(GOOD, tags(GOOD, 2), uid=ME, gpus_per_node=2)
    main, _ = world.submit(GOOD, uid=ME, comment=tags(GOOD, 2), partition="gpu", gres="gpu:2", start_on="gpu1",
                           job_dir=job_dir, start=NOW - 60)
    reports(job_dir, main, [(1, 4.0)], start={"batch_limits": {"init": 64, "max": 1024, "local_min": 8,
                                                                "local_max": 64}},
            report={"grad_sqr": 1.0, "grad_var": 40.0})
    world.agent().tick(NOW)
    assert world.fake.task(f"{array}_0").reason == "None", "the resize goes ahead"
    assert world.store is not None
    assert any("was not told to the job" in d.reason for d in world.store.decisions())


def test_under_fifo_the_older_job_would_have_taken_it(tmp_path: Path) -> None:
    """The same cluster under fifo: the test above is not passing by accident of order."""
    world = World(tmp_path, policy(policy="fifo"))
    _, poor_array, _, good_array = two_jobs(world)
    world.agent().tick(NOW)
    assert world.fake.task(f"{poor_array}_1").reason == "None"
    assert world.fake.task(f"{good_array}_0").reason == "JobHeldUser"


def test_the_agent_and_the_simulator_call_one_policy_code_path(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both reach GoodputPolicy.decide, each with models fitted from reports (FittedPerformance), in GPUs, and
    with the jobs' Allocations on the cluster's nodes: the agent's are the testbed nodes the jobs run on."""
    calls: list[tuple[str, set[type]]] = []
    decide = GoodputPolicy.decide

    def recording(self: GoodputPolicy, jobs: Any, cluster: ClusterView, now: float, previous: Any) -> Any:
        calls.append((caller, {type(j.model) for j in jobs}))
        names = {node.name for node in cluster.nodes}
        assert all(isinstance(alloc, Allocation) and set(alloc.nodes) <= names for alloc in previous.values())
        if caller == "agent":  # each job's Allocation is the GPUs it holds now, on the testbed's nodes
            assert cluster.grow_in_place and names <= set(world.fake.nodes), names
            assert [previous[job.name].gpus for job in jobs] == [job.gpus for job in jobs]
        return decide(self, jobs, cluster, now, previous)

    monkeypatch.setattr(GoodputPolicy, "decide", recording)
    caller = "agent"
    world = World(tmp_path, policy(policy="goodput"))
    two_jobs(world)
    world.agent().tick(NOW)
    caller = "simulator"
    jobs = read_workload(POLLUX_DIR / "workloads-0.5" / "workload-1.csv")[:3]
    simulate(jobs, POLLUX_DIR / "traces", GoodputPolicy(), ClusterView.uniform(2, 4), SimConfig())
    assert {c for c, _ in calls} == {"agent", "simulator"}
    assert all(models == {FittedPerformance} for _, models in calls if models), calls[:3]


def test_absurd_reported_rates_are_not_fitted_and_the_tick_goes_on(tmp_path: Path) -> None:
    """A job's reports are its own word: rates no training has (a clock jump, a made-up file) are left out of
    its fit, and the other job is sized as before."""
    world = World(tmp_path, policy(policy="goodput"))
    _, poor_array, good, good_array = two_jobs(world)
    poor_dir = tmp_path / f"home-{ME}" / POOR
    reports(poor_dir, 1, [(1, 5e6), (2, 1e-7)])  # more lines in its file: absurd rates at both sizes
    world.agent().tick(NOW)
    assert world.fake.task(f"{good_array}_0").reason == "None"
    assert world.fake.task(f"{poor_array}_1").reason == "JobHeldUser"
