"""Unit tests: elastic jobs placed across a site's GPU partitions of one model each (issue 50 item 3;
``policies/actions/partition_per_model.py``). The pure rule on its own, and the agent on the fake Slurm (one
``_run`` seam), whose gpu partition is cut to gpu1 (a100) beside a partition gpu-v100 of gpu2 (v100), as the
live test and the admin guide's "A partition per model" have it."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

import pytest
from agent_world import ME, NOW, OTHER, World, policy
from test_agent_gpu_kinds import APP, decisions, earlier_runs, elastic, tags

from dlsub.policies.actions.partition_per_model import model_partitions, rewait
from dlsub.policies.actions.partition_view import PartitionView
from dlsub.policies.api import IdleNode
from dlsub.slurm_plugins.fake import FakePartition
from dlsub.slurm_plugins.fake import testbed_cluster as fresh_fake_cluster

SECOND = "gpu-v100"


def room(name: str, kinds: dict[str, str], role: str | None = "gpu", waiting: int = 0) -> PartitionView:
    return PartitionView(name, tuple(IdleNode(n, 4, gpu_type=k) for n, k in kinds.items()), waiting_gpus=waiting,
                         waiting_per_node=1 if waiting else 0, role=role)


def test_the_gpu_partitions_of_one_model_each_are_one_room_of_their_kinds() -> None:
    """Pure: two GPU partitions of one kind each are one room, what waits in each counted against its kind;
    a dev partition over both, a partition of two kinds, and a second partition of a kind already found are
    left out; one kind alone, or a node in two of them, is no such site."""
    site = model_partitions([room("gpu", {"gpu1": "a100"}, waiting=2), room(SECOND, {"gpu2": "v100"}),
                             room("gpu-dev", {"gpu1": "a100", "gpu2": "v100"}, role="dev"),
                             room("mixed", {"gpu3": "a100", "gpu4": "t4"}),
                             room("cpu", {"cpu1": ""}, role="cpu")])
    assert site is not None
    assert dict(site.partition_of) == {"a100": "gpu", "v100": SECOND}
    assert [n.name for n in site.room.nodes] == ["gpu1", "gpu2"]
    assert site.room.waiting_by_kind == (("a100", 2),) and site.room.waiting_gpus == 2
    assert model_partitions([room("gpu", {"gpu1": "a100"}), room("gpu-dev", {"gpu2": "v100"}, role="dev")]) is None
    assert model_partitions([room("gpu", {"gpu1": "a100"}), room("b", {"gpu1": "v100"})]) is None
    twice = model_partitions([room("a", {"gpu1": "a100"}), room("b", {"gpu2": "a100"}), room("c", {"gpu3": "v100"})])
    assert twice is None, "a100 in two partitions is two queues, not a choice of model; v100 alone is one kind"
    assert model_partitions([room("gpu", {"gpu1": "a100"}), room("b", {"gpu2": ""})]) is None


def partition_per_model(world: World, allow_groups: str = "ALL") -> World:
    """The fake's gpu partition cut to gpu1 (a100), and gpu-v100 made of gpu2 (v100)."""
    fake = world.fake
    fake.nodes["gpu1"].gpu_type, fake.nodes["gpu2"].gpu_type = "a100", "v100"
    fake.partitions["gpu"].nodes = ["gpu1"]
    fake.partitions[SECOND] = FakePartition(SECOND, ["gpu2"], allow_groups=allow_groups)
    fake.nodes["gpu2"].partitions = [SECOND, "gpu-dev"]
    return world


def across_partitions() -> object:
    return policy(policy="goodput", goodput={"across_gpu_types": True},
                  partitions={"gpu": {"role": "gpu"}, SECOND: {"role": "gpu"}, "gpu-dev": {"role": "dev"},
                              "cpu": {"role": "cpu", "speed": 0.1}})


def running_on_v100(world: World) -> int:
    """Alice's elastic job of the command APP running on gpu-v100, which measured it 4x as fast on v100 as on
    a100 (it ran on both)."""
    main, _ = earlier_runs(world)
    job = world.fake.jobs[main]
    job.options["partition"] = SECOND
    return main


def waiting_on_gpu(world: World, dlsub_id: str, extra: str = "", user: str = "alice") -> int:
    """An elastic job of the command APP (``--gpus 1:2``) waiting on gpu for a GPU."""
    array, job_dir = world.worker_array(dlsub_id, tags(dlsub_id, 2), tasks=1, gpus_per_node=1, user=user)
    main, _ = world.submit(dlsub_id, comment=f"{tags(dlsub_id, 2)};app={APP}{extra}", partition="gpu",
                           gres="gpu:1", start_on=None, job_dir=job_dir, user=user)
    world.fake.jobs[main].reason = "Resources"
    return main


def test_a_waiting_elastic_job_is_placed_on_the_partition_of_the_model_fastest_for_it(tmp_path: Path) -> None:
    """Unit with the fake Slurm: Alice's job waits on gpu (a100); her earlier run of the same command measured
    it 4x as fast on v100: the agent points it at gpu-v100 as gres:gpu:v100:1, and `dlsub why` says which
    partition and why. A second tick leaves it there."""
    world = partition_per_model(World(tmp_path, across_partitions()))  # type: ignore[arg-type]
    running_on_v100(world)
    main = waiting_on_gpu(world, "0000f0a1")
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    job = world.fake.jobs[main]
    assert (job.options["partition"], job.options.get("gres")) == (SECOND, "gpu:v100:1")
    (why,) = decisions(world, "0000f0a1", "place")
    assert why.startswith("waiting for v100 (goodput policy across GPU kinds)"), why
    assert why.endswith("; on partition gpu-v100, the site's partition of v100 (it waited on gpu)"), why
    agent.tick(NOW + 10)
    assert len(decisions(world, "0000f0a1", "place")) == 1


def test_a_job_whose_user_named_its_partition_or_kind_stays_and_so_does_one_slurm_would_refuse(
        tmp_path: Path) -> None:
    """Unit with the fake Slurm: the same job with ``pin=partition`` (its user's -p) stays on gpu; so does one
    whose user is in none of gpu-v100's AllowGroups (Slurm would refuse it there)."""
    world = partition_per_model(World(tmp_path / "pin", across_partitions()))  # type: ignore[arg-type]
    running_on_v100(world)
    pinned = waiting_on_gpu(world, "0000f0a1", ";pin=partition")
    world.agent().tick(NOW)
    assert world.fake.jobs[pinned].options["partition"] == "gpu"
    assert decisions(world, "0000f0a1", "place") == []

    me = pwd.getpwuid(ME).pw_name
    mine = set(os.getgrouplist(me, pwd.getpwuid(ME).pw_gid))
    others = next((g.gr_name for g in grp.getgrall() if g.gr_gid not in mine), None)
    if others is None:
        pytest.skip(f"no group {me} is not in")
    world = partition_per_model(World(tmp_path / "barred", across_partitions()), allow_groups=others)  # type: ignore[arg-type]
    running_on_v100(world)
    barred = waiting_on_gpu(world, "0000f0a2", user=me)
    world.agent().tick(NOW)
    world.agent().tick(NOW + 5)
    assert world.fake.jobs[barred].options["partition"] == "gpu"
    assert decisions(world, "0000f0a2", "place") == []


def test_a_placed_job_grows_with_its_worker_pointed_at_its_partition(tmp_path: Path) -> None:
    """Unit with the fake Slurm: an elastic job whose main job runs on gpu-v100 while its held worker array is
    on gpu (where it was submitted, before the agent placed it) grows there: the worker is pointed at
    gpu-v100 and gpu2, then released. Another user's job is not touched."""
    world = partition_per_model(World(tmp_path, across_partitions()))  # type: ignore[arg-type]
    main, array, job_dir = elastic(world, "0000a0a1", "gpu2", workers=1)
    world.fake.jobs[main].options["partition"] = SECOND
    from test_agent_gpu_kinds import reports
    reports(job_dir, main, [("v100", 1, 8.0)], start={"application": APP})
    other, _ = world.submit("0000b0b0", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:1",
                            start_on="gpu1")
    agent = world.agent()
    for t in range(0, 30, 5):
        agent.tick(NOW + t)
    task = world.fake.task(f"{array}_0")
    assert (task.options["partition"], task.options.get("nodelist"), task.reason) == (SECOND, "gpu2", "None")
    assert world.fake.jobs[other].state == "RUNNING" and world.fake.jobs[other].options["partition"] == "gpu"
    assert ME != OTHER


def running_on_a100(world: World, dlsub_id: str, extra: str = "") -> tuple[int, Path]:
    """Alice's elastic job (``--gpus 1:4``) running on gpu (gpu1, a100) at 2 steps/s, which ran on v100 before
    at 8 steps/s, and has checkpointed."""
    from test_agent_gpu_kinds import checkpointed, reports

    array, job_dir = world.worker_array(dlsub_id, tags(dlsub_id), tasks=3, gpus_per_node=1)
    main, _ = world.submit(dlsub_id, comment=tags(dlsub_id) + extra, partition="gpu", gres="gpu:1",
                           start_on="gpu1", job_dir=job_dir, start=NOW - 600)
    reports(job_dir, main, [("v100", 1, 8.0), ("a100", 1, 2.0)])
    checkpointed(job_dir, main)
    return main, job_dir


def test_a_running_elastic_job_is_moved_to_the_partition_of_the_model_faster_for_it(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the job is 4x as fast on v100 and gpu-v100 is idle: the agent writes the move
    ahead with gpu-v100 as its target, asks the job to checkpoint, points it at gpu-v100 as
    gres:gpu:v100:1 once it is requeued, and finishes the move once it runs there; `dlsub why` says which
    partition."""
    world = partition_per_model(World(tmp_path, across_partitions()))  # type: ignore[arg-type]
    main, job_dir = running_on_a100(world, "0000a0a1")
    agent = world.agent()
    agent.tick(NOW)
    assert world.fake.jobs[main].signals == ["USR2"]
    assert world.store is not None
    (row,) = world.store.moves()
    assert (row["target_partition"], row["target_gpus"], row["target_gpu_type"]) == (SECOND, 1, "v100")
    (why,) = decisions(world, "0000a0a1", "move")
    assert why.startswith("moving to v100 (goodput policy across GPU kinds): measured") and why.endswith(
        "; on partition gpu-v100, the site's partition of v100"), why
    world.batch_script_moves(job_dir, main)
    agent.tick(NOW + 5)
    updates = [c for c in world.fake.calls if c[:2] == ["scontrol", "update"] and f"jobid={main}" in c]
    assert updates == [["scontrol", "update", f"jobid={main}", f"Partition={SECOND}", "TresPerNode=gres:gpu:v100:1"]]
    world.fake.start(main, "gpu2", int(NOW + 130))
    agent.tick(NOW + 130)
    assert world.store.moves() == []


def test_a_running_job_whose_user_named_its_partition_is_not_moved_and_why_says_so(tmp_path: Path) -> None:
    """Unit with the fake Slurm: the same job, its user having named gpu (``pin=partition``): it stays, and the
    note says why, with the figures."""
    world = partition_per_model(World(tmp_path, across_partitions()))  # type: ignore[arg-type]
    main, _ = running_on_a100(world, "0000a0a1", ";pin=partition")
    world.agent().tick(NOW)
    assert world.fake.jobs[main].signals == [] and world.store is not None and world.store.moves() == []
    notes = decisions(world, "0000a0a1")
    assert any(n.startswith("stays on gpu: measured") and n.endswith("; its user named its partition at submit")
               for n in notes), notes


def test_a_placed_jobs_waiting_gpus_are_counted_where_it_now_waits() -> None:
    """Pure: the rooms after a placement from gpu to gpu-v100 (Slurm's queue, read before, has it on gpu)."""
    from dlsub.policies.actions.kinds import ActionKind
    from dlsub.policies.actions.move_views import Action
    from dlsub.policies.actions.resize_rules import ElasticJob

    job = ElasticJob("0000f0a1", 9, ME, "alice", "PENDING", False, "gpu", 1, 1, 2, NOW, (8,), waiting=True)
    rooms = (room("gpu", {"gpu1": "a100"}, waiting=1), room(SECOND, {"gpu2": "v100"}))
    placed = [Action(ActionKind.PLACE, job.dlsub_id, 9, "test", partition=SECOND, gpus=1, gpu_type="v100")]
    gpu, v100 = rewait(rooms, placed, {job.dlsub_id: job})
    assert (gpu.waiting_gpus, v100.waiting_gpus, v100.waiting_by_kind) == (0, 1, (("v100", 1),))


def test_the_fake_cluster_is_untouched_by_these_tests() -> None:
    """Unit: the shared testbed cluster of the fake still has one gpu partition over both nodes (the tests above
    cut their own copy)."""
    assert fresh_fake_cluster().partitions["gpu"].nodes == ["gpu1", "gpu2"]
