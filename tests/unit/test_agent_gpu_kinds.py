"""Unit tests with the stateful fake Slurm (its one ``_run`` seam) and a fake clock: the agent across GPU kinds
(issue 33, item 4). The fake's gpu1 names its GPUs ``gpu:a100:4`` and gpu2 ``gpu:v100:4``, as the testbed's
GRES do; the jobs' progress files are what dlsub's library writes (start events naming ``gpu_type``, as the
batch script reads it from the node's GRES, then progress reports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agent_world import ME, NOW, World

from dlsub.agent.agent_store import Writes
from dlsub.agent.observe import observe
from dlsub.contract import gpu_type_in_gres

A, B = "0000a100", "0000b100"  # dlsub ids are 8 hex digits


def typed(world: World) -> World:
    """The fake's GPU nodes of two kinds, as the testbed's gpu partition has them."""
    world.fake.nodes["gpu1"].gpu_type = "a100"
    world.fake.nodes["gpu2"].gpu_type = "v100"
    return world


def tags(dlsub_id: str, max_gpus: int = 4) -> str:
    """An elastic job of 1 to ``max_gpus`` GPUs in steps of one (``--gpus 1:N``)."""
    return f"dlsub:{dlsub_id};mode=ideal;ideal=gpu;gpus=1;nodes=1-{max_gpus};step=1"


def reports(job_dir: Path, job_id: int, runs: list[tuple[str, int, float]], *, batch: int = 64,
            end: float = NOW) -> None:
    """The library's events: for each (kind, GPUs, steps/s), a start on that kind with the group's size and 4
    reports 5 s apart; the last run's last report at ``end``."""
    events: list[dict[str, Any]] = []
    t, step = end - 60 * len(runs) + 40, 0
    for kind, gpus, rate in runs:
        events.append({"event": "start", "time": t - 20, "attempt": f"{job_id}-0", "world_size": gpus,
                       "nodes": 1, "gpu_type": kind})
        for _ in range(4):
            step += round(5 * rate)
            events.append({"event": "progress", "time": t, "attempt": f"{job_id}-0", "step": step,
                           "samples": step * batch, "total_steps": 200000})
            t += 5
        t += 40
    path = job_dir / "progress.jsonl"
    with open(path, "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    os.chown(path, job_dir.stat().st_uid, job_dir.stat().st_gid)


def elastic(world: World, dlsub_id: str, node: str, *, uid: int = ME, user: str = "alice",
            workers: int = 3, start: float = NOW - 3600) -> tuple[int, int, Path]:
    """An elastic job elastic in GPUs: its held worker array of 1-GPU tasks, then its 1-GPU main job on
    ``node``. Returns (main job, worker array, job directory)."""
    array, job_dir = world.worker_array(dlsub_id, tags(dlsub_id, workers + 1), uid=uid, user=user, tasks=workers,
                                        gpus_per_node=1)
    main, _ = world.submit(dlsub_id, uid=uid, user=user, comment=tags(dlsub_id, workers + 1), partition="gpu",
                           gres="gpu:1", start_on=node, job_dir=job_dir, start=start)
    if uid != os.getuid():  # the agent reads a job directory only when it is its user's
        if os.getuid() != 0:
            pytest.skip("giving a job directory to another uid needs root")
        for path in (job_dir.parent, job_dir, *job_dir.iterdir()):
            os.chown(path, uid, uid)
    return main, array, job_dir


@pytest.mark.parametrize(("gres", "kind"), [
    ("gpu:a100:4", "a100"), ("gpu:a100:4(S:0-1)", "a100"), ("gres/gpu:v100=2", "v100"),
    ("gres:gpu:t4:1", "t4"), ("gpu:4", None), ("", None), (None, None),
    ("gpu:a100:2,gpu:v100:2", None), ("gpu:a100:2,gpu:2", None), ("gpu:a;b:2", None),
])
def test_the_one_kind_a_gres_names(gres: str | None, kind: str | None) -> None:
    """Unit, pure: one kind named, or None (untyped, several kinds, or a name no GPU type has)."""
    assert gpu_type_in_gres(gres) == kind


def test_sinfo_gives_each_node_its_kind_and_untyped_stays_none(tmp_path: Path) -> None:
    """Unit with the fake Slurm: typed GRES give the node's kind; the untyped fake (today's) gives None."""
    world = World(tmp_path)
    plain = {n.name: n.gpu_type for p in world.client.partitions() for n in p.nodes}
    assert plain == {"cpu1": None, "cpu2": None, "gpu1": None, "gpu2": None}
    typed(world)
    nodes = {n.name: n for p in world.client.partitions() for n in p.nodes}
    assert (nodes["gpu1"].gpu_type, nodes["gpu2"].gpu_type, nodes["cpu1"].gpu_type) == ("a100", "v100", None)
    assert nodes["gpu1"].gpus == 4


def test_observation_has_node_kinds_and_each_jobs_throughput_per_kind(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the observation names each typed node's kind, each elastic job's kind (its main
    job's node's), and what each job measured on each kind it ran on, apart (Alice's job ran on v100, then
    a100; Bob's only on v100). One squeue and one sinfo: no Slurm call per job."""
    world = typed(World(tmp_path))
    main_a, _, dir_a = elastic(world, A, "gpu1")
    main_b, _, dir_b = elastic(world, B, "gpu2", uid=ME + 4242, user="bob")
    reports(dir_a, main_a, [("v100", 1, 2.0), ("a100", 1, 6.0)])
    reports(dir_b, main_b, [("v100", 1, 3.0)])
    agent = world.agent()
    jobs, partitions = world.client.jobs(), world.client.partitions()
    calls = len(world.fake.calls)
    seen = observe(agent.observing, NOW, jobs, partitions, Writes(), 1e18)
    assert world.fake.calls[calls:] == [], "observing reads no more of Slurm than the tick's squeue and sinfo"
    assert seen.node_types == {"gpu1": "a100", "gpu2": "v100"}
    kinds = {j.dlsub_id: j.gpu_type for j in seen.elastic}
    assert kinds == {A: "a100", B: "v100"}
    rooms = {r.name: {n.name: n.gpu_type for n in r.nodes} for r in seen.rooms}
    assert rooms["gpu"] == {"gpu1": "a100", "gpu2": "v100"}
    by_kind = seen.elastic_progress[A].measured_by_type
    assert set(by_kind) == {"a100", "v100"}
    assert by_kind["a100"][(1, 1)][0] == pytest.approx(6.0, rel=0.05)
    assert by_kind["v100"][(1, 1)][0] == pytest.approx(2.0, rel=0.05)
    assert by_kind["a100"][(1, 1)][1] == pytest.approx(6.0 * 64, rel=0.05), "samples/s, from the reports"
    assert set(seen.elastic_progress[B].measured_by_type) == {"v100"}


def test_untyped_nodes_and_reports_leave_no_kinds(tmp_path: Path) -> None:
    """Unit with the fake Slurm: today's untyped cluster: no node kinds, no job kind, nothing per kind."""
    world = World(tmp_path)
    main, _, job_dir = elastic(world, A, "gpu1")
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": "start", "time": NOW - 60, "attempt": f"{main}-0", "world_size": 1}) + "\n")
        for i in range(4):
            f.write(json.dumps({"event": "progress", "time": NOW - 40 + 5 * i, "attempt": f"{main}-0",
                                "step": 10 * i, "samples": 640 * i}) + "\n")
    seen = observe(world.agent().observing, NOW, world.client.jobs(), world.client.partitions(), Writes(), 1e18)
    assert seen.node_types == {}
    assert [j.gpu_type for j in seen.elastic] == [None]
    assert seen.elastic_progress[A].measured_by_type == {}
    assert seen.elastic_progress[A].measured, "what it measured untyped is still measured"
