"""Unit (no Slurm): the training library's side of estimates: run.batch_size, should_finish(),
profiling runs that stop by themselves, and peak memory in progress reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlsub.checkpointing import run as runmod


def events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]


def test_batch_size_and_reports_carry_memory_and_steps_per_epoch(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSUB_BATCH_SIZE", "128")
    run = runmod.init(tmp_path, total_steps=300, total_epochs=10, handle_signals=False)
    assert run.batch_size == 128 and run.steps_per_epoch == 30
    run.report(step=1, epoch=0, loss=2.0)
    last = events(tmp_path)[-1]
    assert last["batch_size"] == 128 and last["steps_per_epoch"] == 30 and last["peak_rss_mb"] > 10
    monkeypatch.setenv("DLSUB_BATCH_SIZE", "twelve")
    assert run.batch_size is None


def test_should_finish_once_the_mean_recent_loss_reaches_the_target(tmp_path: Path) -> None:
    run = runmod.init(tmp_path, target_loss=0.5, handle_signals=False)
    for step, loss in enumerate([2.0, 1.0, 0.6, 0.45], 1):
        run.report(step=step, loss=loss)
        assert not run.should_finish()  # mean of the last three still above 0.5
    run.report(step=5, loss=0.3)
    run.report(step=6, loss=0.3)
    assert run.should_finish()
    assert events(tmp_path)[-1]["target_loss"] == 0.5
    assert not runmod.init(tmp_path / "b", handle_signals=False).should_finish()


def test_target_loss_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSUB_TARGET_LOSS", "0.25")
    assert runmod.init(tmp_path, handle_signals=False).target_loss == 0.25
    assert runmod.init(tmp_path, target_loss=0.1, handle_signals=False).target_loss == 0.1


def test_profiling_run_stops_cleanly_after_enough_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSUB_PROFILE_STEPS", "10")
    monkeypatch.setenv("DLSUB_PROFILE_SECONDS", "0")
    run = runmod.init(tmp_path, handle_signals=False)
    for step in range(1, 10):
        run.report(step=step, loss=1.0)
    with pytest.raises(SystemExit) as stopped:
        run.report(step=10, loss=1.0)
    assert stopped.value.code == 0
    last = events(tmp_path)[-1]
    assert last["event"] == "finished" and last["profile"] is True and last["step"] == 10
