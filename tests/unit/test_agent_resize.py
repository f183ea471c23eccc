"""Unit (stateful fake Slurm, fake clock): the agent resizes elastic jobs through their worker arrays.

An elastic job here is what `dlsub --nodes 1:2 --gpus-per-node 4` submits: a
held worker array of one task (role=worker), then the main job. The tests
play Slurm's and the batch scripts' parts (a released task starts, a worker
told to leave requeues itself held, a node is lost) and check what the
agent does each tick.
"""

from __future__ import annotations

from pathlib import Path

from agent_world import ME, NOW, OTHER, World

from dlsub.agent.reconcile import Agent
from dlsub.slurm_plugins.fake import FakeJob

ID = "e1a571c0"
TAGS = f"dlsub:{ID};mode=ideal;ideal=gpu;gpus=4;nodes=1-2"


def elastic(world: World, *, uid: int = ME, dlsub_id: str = ID, tags: str = TAGS) -> tuple[int, int, Path]:
    """The worker array (held) and the main job (running on gpu1), as dlsub submits them."""
    return world.elastic(dlsub_id, tags, uid=uid, user="alice" if uid == ME else "mallory")


def released(tmp_path: Path) -> tuple[World, Agent, int, FakeJob]:
    """An elastic job after the agent's first tick: its one worker task released onto idle gpu2."""
    world = World(tmp_path)
    main, array, _ = elastic(world)
    agent = world.agent()
    agent.tick(NOW)
    return world, agent, main, world.fake.task(f"{array}_0")


def decisions(world: World, kind: str) -> list[str]:
    assert world.store is not None
    return [d.reason for d in world.store.decisions() if d.kind == kind]


def test_an_idle_node_grows_the_job_and_a_waiting_job_shrinks_it_back(tmp_path: Path) -> None:
    world, agent, main, worker = released(tmp_path)
    assert worker.reason == "None", "released: gpu2 is idle and nobody waits for it"
    assert "growing to 2 node(s)" in decisions(world, "grow")[0]
    agent.tick(NOW + 3)
    assert len(decisions(world, "grow")) == 1, "a released task still starting is not released again"

    world.fake.start(worker.job_id, "gpu2", int(NOW + 5))
    # Another user's job needs a whole GPU node.
    other, _ = world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:4",
                            start_on=None)
    agent.tick(NOW + 10)
    assert worker.signals == ["USR2"], "the worker is asked to checkpoint with its group and leave"
    assert "shrinking to 1 node(s)" in decisions(world, "shrink")[0]
    agent.tick(NOW + 13)
    assert worker.signals == ["USR2"], "not asked again while it checkpoints"
    world.fake.requeue_held(worker.job_id)  # its batch script: back to the held pool
    agent.tick(NOW + 20)
    assert world.fake.jobs[other].state == "PENDING" and worker.reason == "JobHeldUser", \
        "no growth onto the node the waiting job needs"
    assert world.fake.jobs[main].state == "RUNNING" and world.fake.jobs[main].signals == [], "the main job runs on"


def test_a_worker_that_never_starts_leaves_the_job_at_its_size(tmp_path: Path) -> None:
    world, agent, main, worker = released(tmp_path)
    worker.reason = "Resources"  # released, but Slurm never starts it
    for t in range(1, 20):
        agent.tick(NOW + 3 * t)
    assert len(decisions(world, "grow")) == 1 and not decisions(world, "shrink")
    assert world.fake.jobs[main].state == "RUNNING" and world.fake.jobs[main].signals == []


def test_a_lost_worker_node_is_not_the_main_jobs_failure(tmp_path: Path) -> None:
    world, agent, main, worker = released(tmp_path)
    world.fake.start(worker.job_id, "gpu2", int(NOW + 5))
    agent.tick(NOW + 10)
    # gpu2 dies: Slurm requeues the task (not held) and marks the node down.
    world.fake.nodes["gpu2"].state = "down"
    worker.state, worker.reason, worker.nodes, worker.restart_cnt = "PENDING", "ReqNodeNotAvail", "", 1
    world.fake.nodes["gpu2"].gpus_used = 0
    agent.tick(NOW + 40)
    assert world.fake.jobs[main].state == "RUNNING" and world.fake.jobs[main].signals == []
    assert not decisions(world, "shrink") and len(decisions(world, "grow")) == 1


def test_the_workers_of_an_ended_job_are_cancelled(tmp_path: Path) -> None:
    world, agent, main, worker = released(tmp_path)
    worker.reason = "JobHeldUser"  # back in the pool
    world.fake.set_job_state(main, "COMPLETED")
    agent.tick(NOW + 5)
    assert worker.state == "CANCELLED"
    assert decisions(world, "end-workers")


def test_another_users_worker_naming_my_job_is_never_released(tmp_path: Path) -> None:
    world = World(tmp_path)
    main, array, _ = elastic(world)
    world.fake.nodes["gpu2"].gpus_used = 4  # no room: nothing of mine grows
    # Mallory submits a "worker" array naming my dlsub id, held, hoping the agent releases it.
    _, theirs, _ = elastic(world, uid=OTHER)
    agent = world.agent()
    world.fake.nodes["gpu2"].gpus_used = 0
    agent.tick(NOW)
    mine, fake = world.fake.task(f"{array}_0"), world.fake.task(f"{theirs}_0")
    assert mine.reason == "None", "my own worker grows my job"
    assert fake.reason == "JobHeldUser" and fake.signals == [], "theirs is never acted on for my job"
