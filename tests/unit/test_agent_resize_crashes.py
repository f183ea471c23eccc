"""Unit (stateful fake Slurm, fake clock): the agent dies at each step of a resize and a new one recovers.

A failpoint (dlsub.agent.failpoints) raises here instead of SIGKILLing the
process, as ``tests/integration/test_resize_crashes.py`` does live; the
exception is not an ``Exception``, so nothing in the tick can catch it, and
the tick's writes stop where a kill -9 would stop them. A new Agent on the
same database then ticks, as a restarted agent would. From every point: no
worker is released twice, no worker told to leave is forgotten or told
again within the wait, and the decision is recorded once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_world import NOW, OTHER, World
from test_agent_resize import decisions, elastic

from dlsub.agent import failpoints
from dlsub.agent.decide import leave_wait_s
from dlsub.agent.records import ResizePhase


class Crash(BaseException):
    """kill -9 at a failpoint, as a unit test can have it."""


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> object:
    """``crash_at(point)``: the next time a tick passes ``point``, it dies there."""
    armed: list[str] = []

    def reach(point: str) -> None:
        if armed and point == armed[0]:
            armed.clear()
            raise Crash(point)

    monkeypatch.setattr(failpoints, "reach", reach)
    return armed.append


def releases(world: World, handle: str) -> int:
    return sum(1 for c in world.fake.calls if c[:2] == ["scontrol", "release"] and c[-1] == handle)


def grow_dying_at(tmp_path: Path, crash_at: object, point: str) -> tuple[World, str, int]:
    """An elastic job whose first grow the agent dies in, at ``point``: the world, the worker, the main job."""
    world = World(tmp_path)
    main, array, _ = elastic(world)
    handle = f"{array}_0"
    crash_at(point)  # type: ignore[operator]
    with pytest.raises(Crash):
        world.agent().tick(NOW)
    return world, handle, main


@pytest.mark.parametrize("point", ["grow-planned", "grow-released", "grow-recorded"])
def test_a_grow_killed_at_each_step_releases_the_worker_once(tmp_path: Path, crash_at: object, point: str) -> None:
    world, handle, _ = grow_dying_at(tmp_path, crash_at, point)
    worker = world.fake.task(handle)
    assert world.store is not None
    if point == "grow-planned":
        assert worker.reason == "JobHeldUser", "died before the release"
        planned = world.store.resizes()[handle]
        assert planned.phase == ResizePhase.PLANNED and planned.node, "the grow was written ahead, with its node"
        world.fake.task(handle).options.pop("nodelist", None)  # as if the pin had not been made before the crash
    else:
        assert worker.reason == "None"
    agent = world.agent()  # restarted
    agent.tick(NOW + 3)
    agent.tick(NOW + 6)
    assert worker.reason == "None", "the grow is carried out (or kept) after the restart"
    if point == "grow-planned":
        assert worker.options.get("nodelist") == planned.node, "resumed on the node it was planned for"
    assert releases(world, handle) == 1, "never released twice"
    assert len(decisions(world, "grow")) == 1, "one grow decision, written ahead once"
    assert world.store.resizes() == {}, "nothing left in flight"


def shrink_dying_at(tmp_path: Path, crash_at: object, point: str) -> tuple[World, str]:
    """A grown elastic job whose worker the agent dies sending away, at ``point`` (another user waits)."""
    world = World(tmp_path)
    _, array, _ = elastic(world)
    handle = f"{array}_0"
    agent = world.agent()
    agent.tick(NOW)
    world.fake.start(world.fake.task(handle).job_id, "gpu2", int(NOW + 5))
    world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:4", start_on=None)
    crash_at(point)  # type: ignore[operator]
    with pytest.raises(Crash):
        agent.tick(NOW + 10)
    return world, handle


@pytest.mark.parametrize("point", ["shrink-planned", "shrink-signal-sent", "shrink-signalled"])
def test_a_shrink_killed_at_each_step_is_not_forgotten_nor_sent_twice(tmp_path: Path, crash_at: object,
                                                                       point: str) -> None:
    world, handle = shrink_dying_at(tmp_path, crash_at, point)
    worker = world.fake.task(handle)
    assert worker.signals == ([] if point == "shrink-planned" else ["USR2"])
    agent = world.agent()  # restarted
    agent.tick(NOW + 13)
    assert world.store is not None and world.store.resizes()[handle].phase == ResizePhase.LEAVING
    assert world.store.resizes()[handle].since == NOW + 10, "leaving since it was planned, as the store keeps it"
    assert worker.signals == ([] if point == "shrink-planned" else ["USR2"]), "not told again within the wait"
    assert len(decisions(world, "shrink")) == 1
    # It never leaves (its signal was lost, or its checkpoint hangs): after the wait it is told (again).
    agent.tick(NOW + 10 + leave_wait_s(world.policy) + 1)
    assert worker.signals == (["USR2"] if point == "shrink-planned" else ["USR2", "USR2"])
    assert len(decisions(world, "shrink")) == 2


def test_a_worker_told_to_leave_is_remembered_by_a_restarted_agent(tmp_path: Path) -> None:
    """No failpoint: an agent restarted while a worker checkpoints to leave does not tell it again."""
    world = World(tmp_path)
    _, array, _ = elastic(world)
    handle = f"{array}_0"
    world.agent().tick(NOW)
    worker = world.fake.task(handle)
    world.fake.start(worker.job_id, "gpu2", int(NOW + 5))
    world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:4", start_on=None)
    world.agent().tick(NOW + 10)
    assert worker.signals == ["USR2"]
    for t in (13, 20, 35):  # within the wait (the world's checkpoint grace, 30 s)
        world.agent().tick(NOW + t)  # a new agent each tick
    assert worker.signals == ["USR2"], "not told again while it checkpoints with its group"
    world.fake.requeue_held(worker.job_id)
    world.agent().tick(NOW + 10 + leave_wait_s(world.policy) + 1)
    assert world.store is not None and world.store.resizes() == {}, "forgotten once the wait is over"
    assert worker.signals == ["USR2"] and worker.reason == "JobHeldUser"


def test_a_grow_written_ahead_for_a_job_that_has_ended_is_dropped(tmp_path: Path, crash_at: object) -> None:
    world, handle, main = grow_dying_at(tmp_path, crash_at, "grow-planned")
    world.fake.set_job_state(main, "COMPLETED")
    world.agent().tick(NOW + 3)
    assert releases(world, handle) == 0, "a job that ended is not grown"
    assert world.store is not None and world.store.resizes() == {}
