"""Unit tests (the stateful fake Slurm, a fake clock, the training library in this process): the training loops
the README and the user guide print, read from them at test time, are moved by the agent from cpu to a GPU before
their first checkpoint and resume there past step 0; near their time limit they are continued in a new attempt.

The printed text runs as it is, with one thing put in: the training step the README leaves to its reader
(``...``) becomes ``train_step()``, the call the guide's loop makes. That step takes 0.3 s of the fake clock.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_world import NOW, World
from conftest import REPO

from dlsub.checkpointing import run as run_module
from dlsub.contract import RESUME_EXIT_CODE

#: (document, the heading the loop follows, "" for the first loop of the page)
LOOPS = {"README": ("README.md", ""), "guide": ("docs/user-guide.md", "## Writing the training script")}
STEP_S = 0.3
PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]+)\.\.\.(?P<comment>[ \t]*#.*)?$", re.M)


def printed_loop(name: str) -> str:
    """The loop as the document prints it: its first ``python`` block after the heading that sets up a run."""
    doc, heading = LOOPS[name]
    text = (REPO / doc).read_text()
    if heading:
        assert heading in text, (doc, heading)
        text = text.split(heading, 1)[1]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "checkpointing.init(" in b]
    assert blocks, f"no training loop in {doc}"
    return blocks[0]


def runnable(loop: str) -> str:
    """The printed loop with the reader's training step (a line ``...``, if it has one) as ``train_step()``."""
    return PLACEHOLDER.sub(lambda m: f"{m['indent']}train_step(){m['comment'] or ''}", loop)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Steps:
    """The user's training step: ``STEP_S`` of the fake clock each, and ``act`` once, in step ``at``."""

    def __init__(self, clock: Clock, at: int = 0, act: Callable[[], None] | None = None) -> None:
        self.clock, self.at, self.act, self.done = clock, at, act, 0

    def __call__(self) -> float:
        self.done += 1
        self.clock.sleep(STEP_S)
        if self.done == self.at and self.act is not None:
            self.act()
        return 0.5


@pytest.fixture
def own_signals() -> Iterator[None]:
    """``checkpointing.init()`` installs its handlers in this process: give the test runner its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def attempt_env(monkeypatch: pytest.MonkeyPatch, job_dir: Path, job_id: int, restart: int) -> None:
    """What the batch script gives the training of one attempt (one process, no torchrun)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                 "DLSUB_ATTEMPT", "DLSUB_ROLE", "DLSUB_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DLSUB_JOB_DIR", str(job_dir))
    monkeypatch.setenv("SLURM_JOB_ID", str(job_id))
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))


def run_printed(code: str, steps: Steps) -> int:
    """Run the loop to its end (0) or to its exit for resume (its exit code)."""
    try:
        exec(compile(code, "<printed loop>", "exec"), {"__name__": "__main__", "train_step": steps})
    except SystemExit as exited:
        return int(exited.code or 0)
    return 0


def events(job_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", list(LOOPS))
def test_the_printed_loop_compiles_as_printed_with_no_other_gap(name: str) -> None:
    """Copyable: apart from the one training step the README leaves to its reader, nothing is left out."""
    code = runnable(printed_loop(name))
    compile(code, name, "exec")
    assert "..." not in code and "run.should_stop()" in code, code


@pytest.mark.parametrize("name", list(LOOPS))
def test_the_printed_loop_is_moved_to_a_gpu_before_its_first_checkpoint_and_resumes_there(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signals: None) -> None:
    code = runnable(printed_loop(name))
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")  # immediate, started on cpu, wants one GPU of gpu (free)
    clock = Clock(NOW - 60)
    monkeypatch.setattr(run_module, "time", SimpleNamespace(time=clock.time, monotonic=clock.time, sleep=clock.sleep))
    agent = w.agent()
    decided: list[Any] = []

    def on_cpu() -> None:
        assert not [e for e in events(job_dir) if e["event"] == "checkpoint"]
        decided.extend(agent.tick(clock.t))
        # The batch script's part: the move's USR2 reaches the training as USR1.
        assert w.fake.jobs[job_id].signals == ["USR2"], decided
        os.kill(os.getpid(), signal.SIGUSR1)

    attempt_env(monkeypatch, job_dir, job_id, 0)
    first = Steps(clock, at=150, act=on_cpu)
    assert run_printed(code, first) == RESUME_EXIT_CODE
    assert [a.kind for a in decided] == ["signal-move"], decided
    assert "moving to gpu" in decided[0].reason and "assuming about as long again" in decided[0].reason, decided
    w.batch_script_moves(job_dir, job_id)
    assert [a.kind for a in agent.tick(clock.t + 5)] == ["retarget", "release"]
    w.fake.start(job_id, "gpu1", int(clock.t + 10))
    assert [a.kind for a in agent.tick(clock.t + 10)] == ["finish-move"]

    attempt_env(monkeypatch, job_dir, job_id, 1)
    second = Steps(clock)
    assert run_printed(code, second) == 0
    assert (first.done, second.done) == (150, 850), "resumed where it stopped, not from step 0"
    seen = events(job_dir)
    assert [e["step"] for e in seen if e["event"] == "checkpoint"] == [150]
    assert [e["step"] for e in seen if e["event"] == "restore"] == [150]
    assert seen[-1]["event"] == "finished"
    # Its progress, reported or counted by the library: the agent knew how far it was and how long it ran.
    steps = [e["step"] for e in seen if e["event"] == "progress"]
    assert steps and steps == sorted(steps) and steps[-1] >= 1000 - run_module.COUNTED_REPORT_S / STEP_S - 1, steps


@pytest.mark.parametrize("name", list(LOOPS))
def test_the_printed_loop_is_continued_past_its_time_limit_before_its_first_checkpoint(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signals: None) -> None:
    code = runnable(printed_loop(name))
    w = World(tmp_path)
    w.busy_gpus()  # nowhere to move: only its time limit is near
    job_id, job_dir = w.submit("0123abcd")
    end_time = w.fake.jobs[job_id].end_time
    clock = Clock(NOW - 60)
    monkeypatch.setattr(run_module, "time", SimpleNamespace(time=clock.time, monotonic=clock.time, sleep=clock.sleep))
    agent = w.agent()
    decided: list[Any] = []

    def near_its_limit() -> None:
        decided.extend(agent.tick(end_time - 20))
        os.kill(os.getpid(), signal.SIGUSR1)  # the agent's continue request, as the batch script passes it on

    attempt_env(monkeypatch, job_dir, job_id, 0)
    assert run_printed(code, Steps(clock, at=40, act=near_its_limit)) == RESUME_EXIT_CODE
    assert [a.kind for a in decided] == ["signal-continue"], decided
    w.batch_script_requeues(job_dir, job_id)
    attempt_env(monkeypatch, job_dir, job_id, 1)
    second = Steps(clock)
    assert run_printed(code, second) == 0 and second.done == 960
    assert [e["step"] for e in events(job_dir) if e["event"] == "restore"] == [40]


def test_a_loop_that_never_asks_should_stop_is_still_not_moved_before_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signals: None) -> None:
    """Reporting progress is not saving when asked: only polling should_stop() (or a checkpoint) says so."""
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    attempt_env(monkeypatch, job_dir, job_id, 0)
    clock = Clock(NOW - 60)
    monkeypatch.setattr(run_module, "time", SimpleNamespace(time=clock.time, monotonic=clock.time, sleep=clock.sleep))
    run = run_module.init()
    for step in range(100):
        clock.sleep(STEP_S)
        run.report(step=step + 1, loss=0.5)
    actions = w.agent().tick(clock.t)
    assert [a.kind for a in actions] == ["note"], actions
    assert "has not written a checkpoint yet, nor asked run.should_stop()" in actions[0].reason
