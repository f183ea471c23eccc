"""Unit: examples/train_digits.py emulates a GPU type's speed on the testbed's fake GPUs with --gpu-slowdown
TYPE=FACTOR, read against DLSUB_GPU_TYPE, and a slow network with --throttle-per-node (its argument parsing and
its step's pause, no training); and it ends cleanly when resumed
from a checkpoint at its last step (a real run, on CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import train_digits  # the example, not a package: from its folder


def parse(monkeypatch: pytest.MonkeyPatch, *argv: str) -> object:
    monkeypatch.setattr(sys, "argv", ["train_digits.py", *argv])
    return train_digits.parse_args()


@pytest.mark.parametrize(("visible", "gpu_type", "factor"), [
    ("", "", 3.0),  # no GPU: --cpu-slowdown
    ("0", "v100", 2.5),  # a GPU of a type given a factor
    ("0", "a100", 1.0),  # a type given none
    ("0", "", 1.0),  # untyped GPUs
])
def test_the_throttle_is_slowed_by_the_gpu_types_factor(monkeypatch: pytest.MonkeyPatch, visible: str,
                                                        gpu_type: str, factor: float) -> None:
    args = parse(monkeypatch, "--cpu-slowdown", "3", "--gpu-slowdown", "v100=2.5", "--gpu-slowdown", "t4=4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("DLSUB_GPU_TYPE", gpu_type)
    assert train_digits.slowdown(args) == factor  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["v100", "v100=fast", "=2", "v100=0", "v100=-1"])
def test_a_malformed_gpu_slowdown_is_refused_saying_what_to_write(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(monkeypatch, "--gpu-slowdown", bad)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-slowdown takes TYPE=FACTOR, a positive factor, e.g. --gpu-slowdown v100=2.5" in err


@pytest.mark.parametrize(("world", "per_node", "pause"), [
    (2, 2, 0.4 + 0.01 * 32),  # one node: no network to cross
    (4, 2, 0.4 + 0.01 * 32 + 0.2),  # two nodes
    (3, 2, 0.4 + 0.01 * 32 + 0.2),  # a second node half used is a second node
    (6, 2, 0.4 + 0.01 * 32 + 0.4),
])
def test_a_step_sleeps_more_for_each_node_beyond_the_first(monkeypatch: pytest.MonkeyPatch, world: int,
                                                          per_node: int, pause: float) -> None:
    """--throttle-per-node emulates a slow all-reduce: a model slower on two nodes than on one (the goodput live
    test's poor scaler)."""
    args = parse(monkeypatch, "--throttle", "0.4", "--throttle-per-sample", "0.01", "--throttle-per-node", "0.2")
    assert train_digits.step_pause(args, 32, world, per_node) == pytest.approx(pause)  # type: ignore[arg-type]


def test_resumed_from_a_checkpoint_at_its_last_step_it_finishes_without_training(tmp_path: Path) -> None:
    """A group restarted (by a resize, a move) after its last step's checkpoint trains no step: it reports and
    finishes all the same (it crashed once on the loss it never computed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLSUB_", "WORLD_SIZE", "RANK"))}
    env["PYTHONPATH"] = str(REPO)
    for attempt in ("first", "again"):
        done = subprocess.run([sys.executable, str(REPO / "examples" / "train_digits.py"), "--epochs", "1"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "done:" in done.stdout, (attempt, done.stderr)
    assert "resumed from step 22 (epoch 1, sample 0)" in done.stdout, done.stdout
