"""Unit (stateful fake Slurm, fake clock): the tick is one pipeline of values (agent/reconcile.py).

observe(store snapshot, Slurm) -> Observation, decide(Observation, memory) -> Plan, prepare(Plan) -> Writes,
act(Plan) -> Outcome: each step is run here by hand, as the tick runs it, on a move (signal, retarget and
release, finish), a note, and an elastic job's grow and shrink, and none of them may change what it was given.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
from agent_world import ME, NOW, OTHER, World

from dlsub.agent.act import MOVE_STEPS, RESIZE_STEPS, STEPS, act, prepare
from dlsub.agent.decide import Plan, decide
from dlsub.agent.observe import Observation, observe
from dlsub.agent.reconcile import Agent
from dlsub.agent.store_rows import StoreSnapshot
from dlsub.policies.actions.kinds import BOOKKEEPING, ActionKind


def run_by_hand(agent: Agent, now: float) -> list[str]:
    """One tick, step by step as Agent.tick runs them; asserts that no step changes its inputs. Returns the
    kinds of what was decided and done."""
    snapshot = agent.store.snapshot()
    snapshot_before = copy.deepcopy(snapshot)
    obs = observe(agent.observing, snapshot, agent.client.jobs(), agent.client.partitions(), now, 1e18)
    obs_before = copy.deepcopy(obs)
    plan = decide(obs, agent.memory, agent.deciding, now)
    plan_before = copy.deepcopy(plan)
    ahead = prepare(plan, obs, now)
    ahead_before = copy.deepcopy(ahead)
    agent.store.write(ahead)
    outcome = act(agent.client, obs, plan, ahead, now)
    agent.store.write(outcome.writes)
    assert snapshot == snapshot_before, "observing changed the store's rows as the tick read them"
    assert obs == obs_before, "deciding, preparing or acting changed the observation"
    assert plan == plan_before, "preparing or acting changed the plan"
    assert ahead == ahead_before, "acting changed the write-ahead"
    return [a.kind for a in (*plan.resumed, *plan.resizes, *plan.actions())]


def test_no_step_of_a_move_changes_what_it_was_given(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    waiting, waiting_dir = w.submit("0456abcd")
    w.progress(waiting_dir, waiting, checkpoint=False)  # no checkpoint yet: a note, the job's row updated
    agent = w.agent()
    assert sorted(run_by_hand(agent, NOW)) == ["note", "signal-move"]
    w.batch_script_moves(job_dir, job_id)
    assert run_by_hand(agent, NOW + 5)[:2] == ["retarget", "release"]
    w.fake.start(job_id, "gpu1", int(NOW + 6))
    assert "finish-move" in run_by_hand(agent, NOW + 10)
    assert [d.kind for d in w.store.decisions("0123abcd")] == ["move", "move-done"]
    assert [d.kind for d in w.store.decisions("0456abcd")] == ["wait"], "the note recorded once"


def test_no_step_of_a_grow_and_a_shrink_changes_what_it_was_given(tmp_path: Path) -> None:
    world = World(tmp_path)
    main, array, _ = world.elastic("e1a571c0", "dlsub:e1a571c0;mode=ideal;ideal=gpu;gpus=4;nodes=1-2", uid=ME,
                                   user="alice")
    agent = world.agent()
    assert run_by_hand(agent, NOW) == ["grow"]
    worker = world.fake.task(f"{array}_0")
    world.fake.start(worker.job_id, "gpu2", int(NOW + 5))
    world.submit("0bad0bad", uid=OTHER, user="bob", comment="", partition="gpu", gres="gpu:4", start_on=None)
    assert run_by_hand(agent, NOW + 10) == ["shrink"]
    assert worker.signals == ["USR2"]
    assert world.store is not None and set(world.store.resizes()) == {f"{array}_0"}, "its leaving recorded"


def test_the_steps_values_are_frozen() -> None:
    for value in (Observation, Plan, StoreSnapshot):
        assert dataclasses.fields(value) and value.__dataclass_params__.frozen, value  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Plan().moves = ()  # type: ignore[misc]


def test_what_changes_nothing_in_slurm_is_what_act_has_no_call_for() -> None:
    """decide keeps one Slurm change per job and tick by kinds.BOOKKEEPING; act carries out exactly the rest."""
    assert {kind for kind, step in STEPS.items() if step.call is None} == set(BOOKKEEPING)
    assert set(MOVE_STEPS) | set(RESIZE_STEPS) == set(ActionKind) and not set(MOVE_STEPS) & set(RESIZE_STEPS)
