"""Unit (stateful fake Slurm, fake clock): attacks on elastic resizing, found in review, as regression tests.

Each test is one user (Bob, or a hostile record) trying to make the agent
shrink, freeze, mis-charge or steal another user's elastic job.
"""
from __future__ import annotations

from pathlib import Path

from agent_world import ME, NOW, OTHER, World

from dlsub.agent.observe import Observation, observe
from dlsub.agent.reconcile import Agent
from dlsub.slurm_plugins.fake import FakeNode, FakePartition, FakeSlurm
from dlsub.slurm_plugins.models import Partition, SlurmJob

ID = "e1a571c0"



def observed(agent: Agent, slurm_jobs: list[SlurmJob], partitions: list[Partition]) -> Observation:
    """The agent's observe step alone, on the store as its next tick would read it."""
    return observe(agent.observing, agent.store.snapshot(), slurm_jobs, partitions, NOW, 1e18)

def big_cluster() -> FakeSlurm:
    gpus = [f"gpu{i}" for i in range(1, 5)]
    return FakeSlurm(
        nodes=[FakeNode("cpu1", ["cpu"]), *[FakeNode(n, ["gpu"], gpus=4) for n in gpus]],
        partitions=[FakePartition("cpu", ["cpu1"], default=True), FakePartition("gpu", gpus)],
    )


def shrinks(world: World) -> list[str]:
    assert world.store is not None
    return [d.reason for d in world.store.decisions() if d.kind == "shrink"]


def test_one_waiting_job_shrinks_elastic_job_all_the_way(tmp_path: Path) -> None:
    """F1: a leaving worker is dropped from the plan, so the next tick (still 'short') signals another."""
    world = World(tmp_path, fake=big_cluster())
    main, array, _ = world.elastic(ID, workers=3, tags=f"dlsub:{ID};mode=ideal;ideal=gpu;gpus=4;nodes=1-4")
    agent = world.agent()
    agent.tick(NOW)
    for i, node in enumerate(("gpu2", "gpu3", "gpu4")):
        world.fake.start(world.fake.task(f"{array}_{i}").job_id, node, int(NOW + 5 + i))
    # Bob: ONE pending 4-GPU job (needs one node).
    world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:4", start_on=None)
    for t in (10, 13, 16, 19):
        agent.tick(NOW + t)  # workers still checkpointing (within leave_wait_s); none has left yet
    signalled = [world.fake.task(f"{array}_{i}").signals for i in range(3)]
    assert sum(1 for s in signalled if "USR2" in s) == 1, f"one waiting 4-GPU job, but {signalled}"


def test_unrunnable_waiting_job_shrinks_and_freezes_victim(tmp_path: Path) -> None:
    """F2: a pending job that cannot use the nodes (own QOS limit) still counts as waiting."""
    world = World(tmp_path, fake=big_cluster())
    main, array, _ = world.elastic(ID, workers=1, tags=f"dlsub:{ID};mode=ideal;ideal=gpu;gpus=4;nodes=1-2")
    for n in ("gpu3", "gpu4"):
        world.fake.nodes[n].state = "down"
    agent = world.agent()
    agent.tick(NOW)
    w = world.fake.task(f"{array}_0")
    world.fake.start(w.job_id, "gpu2", int(NOW + 5))
    bad, _ = world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:1",
                          start_on=None)
    world.fake.jobs[bad].reason = "QOSMaxGRESPerUser"  # Bob's own limit: no freed node would start it
    agent.tick(NOW + 10)
    assert w.signals == [], f"victim's worker told to leave for a job that cannot run: {shrinks(world)}"


def test_worker_tag_hides_gang_gpus_from_usage(tmp_path: Path) -> None:
    """F3: a role=worker job is charged gpus_per_node x 1, whatever its node_count."""
    world = World(tmp_path, fake=big_cluster())
    job, _ = world.submit("0bad0bad", uid=OTHER, user="bob", partition="gpu", gres="gpu:4", start_on="gpu1",
                          comment="dlsub:0bad0bad;mode=ideal;gpus=4;role=worker")
    world.fake.jobs[job].node_count = 16
    world.fake.jobs[job].array_job_id, world.fake.jobs[job].array_task_id = job, 0
    agent = world.agent()
    slurm_jobs, parts = world.client.jobs(), world.client.partitions()
    seen = observed(agent, slurm_jobs, parts)
    assert seen.usage[OTHER].gpus == 64, f"16-node x 4-GPU job charged as {seen.usage[OTHER].gpus} GPUs"


def test_growth_and_a_move_claim_the_same_idle_node_in_one_tick(tmp_path: Path) -> None:
    """F4: plan() and plan_resizes() both spend the same idle GPUs; growth is carried out first."""
    world = World(tmp_path)
    # Bob's elastic 1-2 job on gpu1 with one held worker.
    tags = f"dlsub:{ID};mode=ideal;ideal=gpu;gpus=4;nodes=1-2"
    array, job_dir = world.worker_array(ID, tags, uid=OTHER, user="bob")
    world.submit(ID, uid=OTHER, user="bob", comment=tags, partition="gpu", gres="gpu:4", start_on="gpu1",
                 job_dir=job_dir)
    # Alice's job on cpu wants gpu (1 GPU), checkpointable.
    mine, my_dir = world.submit("0123abcd")
    world.progress(my_dir, mine)
    agent = world.agent()
    agent.tick(NOW)
    worker = world.fake.task(f"{array}_0")
    assert not (worker.reason == "None" and "USR2" in world.fake.jobs[mine].signals), \
        "Alice was stopped to move onto gpu2 in the same tick the agent released Bob's worker onto gpu2"
    world.fake.start(worker.job_id, "gpu2", int(NOW + 2))
    world.batch_script_moves(my_dir, mine)
    for t in (5, 10, 15, 60, 300):
        agent.tick(NOW + t)
    me = world.fake.jobs[mine]
    assert me.state == "RUNNING" or worker.signals, \
        f"Alice stopped and left {me.state}/{me.reason} on {me.options['partition']}; Bob's worker keeps gpu2"


def test_id_published_by_the_worker_array_is_hijacked_before_the_main_job_exists(tmp_path: Path) -> None:
    """F5: dlsub submits the held worker array first; its public comment names the id before the main job
    exists. Bob's main claiming it in that window is the earliest main claimant and takes the binding."""
    world = World(tmp_path)
    tags = f"dlsub:{ID};mode=ideal;ideal=gpu;gpus=4;nodes=1-2"
    array, job_dir = world.worker_array(ID, tags, uid=ME, user="alice")
    # Bob polls squeue, sees the id in the worker array's comment, and submits first (job_submit.lua records him).
    world.submit(ID, uid=OTHER, user="bob", comment=tags, partition="cpu", start_on="cpu1")
    main, _ = world.submit(ID, comment=tags, partition="gpu", gres="gpu:4", start_on="gpu1", job_dir=job_dir)
    agent = world.agent()
    agent.tick(NOW)
    assert world.store is not None
    ignored = [d for d in world.store.decisions() if d.kind == "ignored"]
    assert [d.uid for d in ignored] == [OTHER], "Bob's claim is the one ignored"
    assert world.fake.task(f"{array}_0").reason == "None", "Alice's elastic job should grow onto idle gpu2"


def test_one_bad_worker_record_does_not_stop_the_tick(tmp_path: Path) -> None:
    """F6 (robustness): a worker record whose host list expand_nodes refuses (a million nodes) is skipped;
    every tick still reads and records the other jobs."""
    world = World(tmp_path)
    mine, my_dir = world.submit("0123abcd")
    world.progress(my_dir, mine)
    world.fake.add_raw_jobs([{"job_id": 99999, "user_id": OTHER, "user_name": "bob", "job_state": "RUNNING",
                              "partition": "gpu", "nodes": "n[0-999999]", "array_job_id": 99999,
                              "array_task_id": 0, "comment": "dlsub:0bad0bad;role=worker;nodes=1-2"}])
    agent = world.agent()
    for tick in range(2):
        agent.tick(NOW + tick)
        assert world.store is not None
        row = world.store.job(ME, mine)
        assert row is not None and row.data.progress, f"tick {tick}: my job was not read past the bad record"
    assert world.store.job(OTHER, 99999) is None, "the bad record is not adopted"
