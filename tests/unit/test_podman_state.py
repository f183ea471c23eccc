"""Unit (real files and processes, a stand-in `podman` on PATH that records its calls): a user's Podman on a node
left unusable by a killed attempt is found from its runtime directory alone and reset; nothing else is touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dlsub.slurm_plugins.launcher.podman_state import (
    CONTAINERS_RUN,
    PAUSE_PID,
    dead_containers,
    reset_if_left_by_a_killed_attempt,
)

DEAD_ID = "5aad3ad9c23d796d66f78cf4bb0bc6e5aa0982901278b389222842ebbc326e0c"
OTHER_DEAD_ID = "77" * 32


def a_dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def container(runtime: Path, cid: str, conmon_pid: int | None) -> None:
    userdata = runtime / CONTAINERS_RUN / cid / "userdata"
    userdata.mkdir(parents=True)
    if conmon_pid is not None:
        (userdata / "conmon.pid").write_text(f"{conmon_pid}\n")


def pause(runtime: Path, pid: int) -> None:
    (runtime / PAUSE_PID).parent.mkdir(parents=True, exist_ok=True)
    (runtime / PAUSE_PID).write_text(f"{pid}\n")


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in podman: records each call's arguments, one line each; `ps` lists DEAD_ID as dlsub's."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    script = bin_dir / "podman"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                      f'case "$1" in ps) echo {DEAD_ID} ;; esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_a_killed_attempts_state_is_found_and_only_then(tmp_path: Path) -> None:
    runtime = tmp_path / "xdg"
    runtime.mkdir()
    assert dead_containers(runtime) == [], "nothing there"
    container(runtime, DEAD_ID, a_dead_pid())
    container(runtime, OTHER_DEAD_ID, None)  # being made: no conmon yet, neither alive nor dead
    assert dead_containers(runtime) == [DEAD_ID], "no pause process, the only conmon dead"
    pause(runtime, a_dead_pid())
    assert dead_containers(runtime) == [DEAD_ID], "a stale pause pid is no pause process"
    pause(runtime, os.getpid())
    assert dead_containers(runtime) == [], "a live pause process: Podman joins it"


def test_a_live_conmon_of_the_user_means_podman_works(tmp_path: Path) -> None:
    runtime = tmp_path / "xdg"
    container(runtime, DEAD_ID, a_dead_pid())
    container(runtime, OTHER_DEAD_ID, os.getpid())  # another job of the user runs a container here
    assert dead_containers(runtime) == []


def test_the_reset_migrates_and_removes_only_dlsubs_dead_containers(tmp_path: Path, podman: Path) -> None:
    runtime = tmp_path / "xdg"
    container(runtime, DEAD_ID, a_dead_pid())
    container(runtime, OTHER_DEAD_ID, a_dead_pid())  # dead too, but not dlsub's: `ps` does not list it
    done = reset_if_left_by_a_killed_attempt({"XDG_RUNTIME_DIR": str(runtime), "PATH": os.environ["PATH"]})
    assert done and "podman system migrate" in done and "1 of dlsub's removed" in done, done
    calls = podman.read_text().splitlines()
    assert calls[0] == "system migrate"
    assert calls[1].startswith("ps -a --no-trunc --filter label=dlsub.job_id")
    assert calls[2] == f"rm -f --ignore {DEAD_ID}"
    assert len(calls) == 3


def test_nothing_is_run_when_podman_is_fine(tmp_path: Path, podman: Path) -> None:
    runtime = tmp_path / "xdg"
    container(runtime, DEAD_ID, a_dead_pid())
    pause(runtime, os.getpid())
    assert reset_if_left_by_a_killed_attempt({"XDG_RUNTIME_DIR": str(runtime), "PATH": os.environ["PATH"]}) is None
    assert reset_if_left_by_a_killed_attempt({"PATH": os.environ["PATH"]}) is None, "no runtime directory"
    assert not podman.exists(), "podman was not called"
