"""Unit tests (no Slurm): a failpoint SIGKILLs the process only at the point the environment names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import NO_HANG_S

from dlsub.agent import failpoints

PROGRAM = "from dlsub.agent import failpoints; failpoints.reach('move-planned'); print('passed')"


def run(point: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if point is not None:
        env[failpoints.ENV] = point
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=NO_HANG_S)


def test_the_named_point_kills_with_sigkill() -> None:
    assert run("move-planned").returncode == -signal.SIGKILL


def test_other_points_and_no_point_change_nothing() -> None:
    for point in (None, "move-released", ""):
        result = run(point)
        assert result.returncode == 0 and result.stdout.strip() == "passed", (point, result)


def test_every_move_point_is_named_once() -> None:
    assert len(set(failpoints.MOVE_POINTS)) == len(failpoints.MOVE_POINTS) == 6


def test_every_resize_point_is_named_once_and_none_is_a_move_point() -> None:
    assert len(set(failpoints.RESIZE_POINTS)) == len(failpoints.RESIZE_POINTS) == 6
    assert not set(failpoints.RESIZE_POINTS) & set(failpoints.MOVE_POINTS)


def test_the_action_table_names_every_kind_and_every_failpoint() -> None:
    """One table (dlsub.agent.act.STEPS) holds each action kind's step, its failpoints included."""
    from dlsub.agent.act import STEPS
    from dlsub.policies.actions.kinds import ActionKind

    assert set(STEPS) == set(ActionKind)
    named = {p for step in STEPS.values() for p in (step.before, step.sent, step.after) if p}
    assert named == set(failpoints.MOVE_POINTS) | set(failpoints.RESIZE_POINTS)
