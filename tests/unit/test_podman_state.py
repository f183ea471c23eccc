"""Unit (real files and processes, a stand-in `podman` on PATH that records its calls): a user's Podman on a node
left unusable by a killed attempt is found from its run roots and Podman's own answer, and reset; nothing else is
touched, and Podman is not asked at all while no container's conmon is dead."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlsub.slurm_plugins.launcher.podman_state import (
    CONTAINERS_RUN,
    dead_containers,
    reset_if_left_by_a_killed_attempt,
    run_roots,
)

DEAD_ID = "5aad3ad9c23d796d66f78cf4bb0bc6e5aa0982901278b389222842ebbc326e0c"
OTHER_ID = "77" * 32
WEDGED_MESSAGE = ('level=error msg="invalid internal status, try resetting the pause process with '
                  '\\"podman system migrate\\": could not find any running process: no such process"')


def a_dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def a_conmon(tmp_path: Path) -> Iterator[int]:
    """The pid of a live process named conmon, as a container's monitor is."""
    program = tmp_path / "conmon"
    shutil.copy("/bin/sleep", program)
    proc = subprocess.Popen([str(program), "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def container(root: Path, cid: str, conmon_pid: int | None) -> None:
    userdata = root / CONTAINERS_RUN / cid / "userdata"
    userdata.mkdir(parents=True)
    if conmon_pid is not None:
        (userdata / "conmon.pid").write_text(f"{conmon_pid}\n")


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "xdg"
    path.mkdir()
    return path


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in podman: records each call; `ps -q` fails as a wedged Podman does while the file `wedged` is
    there, `system migrate` removes it, and `ps -a` lists DEAD_ID as dlsub's."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    script = bin_dir / "podman"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
    "ps -q") if [ -e {tmp_path}/wedged ]; then echo '{WEDGED_MESSAGE}' >&2; exit 1; fi ;;
    "system migrate") rm -f {tmp_path}/wedged
        if [ -e {tmp_path}/migrate-fails ]; then echo 'level=error msg="container not running"' >&2; exit 125; fi ;;
    "ps -a"*) echo {DEAD_ID} ;;
esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def env_of(runtime: Path) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(runtime), "PATH": os.environ["PATH"]}


def test_the_run_roots_are_the_runtime_directorys_and_podmans_default_without_one(runtime: Path) -> None:
    assert run_roots(env_of(runtime), 1234) == [runtime / "containers", Path("/tmp/containers-user-1234/containers")]
    assert run_roots({}, 1234) == [Path("/tmp/containers-user-1234/containers")]


def test_dead_conmons_are_found_and_a_live_one_means_podman_works(runtime: Path, a_conmon: int) -> None:
    roots = [runtime / "containers", runtime / "other-root"]
    assert dead_containers(roots) == [], "nothing there"
    container(roots[1], DEAD_ID, a_dead_pid())
    container(roots[0], OTHER_ID, None)  # being made: no conmon yet, neither alive nor dead
    assert dead_containers(roots) == [DEAD_ID]
    container(roots[0], "88" * 32, a_conmon)  # another job of the user runs a container here
    assert dead_containers(roots) == []


def test_a_conmons_pid_taken_by_another_process_is_a_dead_conmon(runtime: Path) -> None:
    """The node's pids wrapped: the killed conmon's pid is another process's now (here, this one's)."""
    container(runtime / "containers", DEAD_ID, os.getpid())
    assert dead_containers([runtime / "containers"]) == [DEAD_ID]


def test_a_conmon_killed_but_not_yet_reaped_is_dead(tmp_path: Path, runtime: Path) -> None:
    """A zombie answers kill -0 and keeps its name: the user's next job, started within the second of the kill,
    took a wedged Podman for working (CI rehearsal 29)."""
    program = tmp_path / "conmon"
    shutil.copy("/bin/sleep", program)
    proc = subprocess.Popen([str(program), "60"])
    try:
        proc.kill()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/status").read_text().find("State:\tZ") < 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        container(runtime / "containers", DEAD_ID, proc.pid)  # not reaped yet: a zombie named conmon
        assert dead_containers([runtime / "containers"], os.getuid()) == [DEAD_ID]
    finally:
        proc.wait()


def test_another_users_conmon_on_a_conmons_old_pid_is_not_this_users(runtime: Path, a_conmon: int) -> None:
    """The pid of a killed conmon taken by another user's conmon (pids wrap, and every user's conmons share the
    node's pid space): this user's container is dead all the same."""
    container(runtime / "containers", DEAD_ID, a_conmon)
    assert dead_containers([runtime / "containers"], os.getuid() + 1) == [DEAD_ID]
    assert dead_containers([runtime / "containers"], os.getuid()) == []


def test_a_wedged_podman_is_migrated_and_only_dlsubs_dead_containers_removed(
        tmp_path: Path, runtime: Path, podman: Path) -> None:
    container(runtime / "containers", DEAD_ID, a_dead_pid())
    container(runtime / "containers", OTHER_ID, a_dead_pid())  # dead too, but not dlsub's: `ps -a` omits it
    (tmp_path / "wedged").touch()
    done = reset_if_left_by_a_killed_attempt(env_of(runtime), uid=os.getuid())
    assert done and "podman system migrate" in done and "1 of dlsub's removed" in done, done
    calls = podman.read_text().splitlines()
    assert calls[:2] == ["ps -q", "system migrate"]
    assert calls[2].startswith("ps -a --no-trunc --filter label=dlsub.job_id")
    assert calls[3:] == [f"rm -f --ignore {DEAD_ID}"]


def test_dead_containers_but_a_working_podman_are_left_to_podman(runtime: Path, podman: Path) -> None:
    container(runtime / "containers", DEAD_ID, a_dead_pid())
    assert reset_if_left_by_a_killed_attempt(env_of(runtime), uid=os.getuid()) is None
    assert podman.read_text().splitlines() == ["ps -q"], "asked, and nothing changed"


def test_podman_is_not_run_while_no_conmon_is_dead(runtime: Path, podman: Path, a_conmon: int) -> None:
    container(runtime / "containers", DEAD_ID, a_conmon)
    assert reset_if_left_by_a_killed_attempt(env_of(runtime), uid=os.getuid()) is None
    assert reset_if_left_by_a_killed_attempt({"PATH": os.environ["PATH"]}, uid=2**31 - 7) is None
    assert not podman.exists(), "podman was not called"


def test_a_migrate_that_exits_125_but_leaves_podman_working_is_a_reset(
        tmp_path: Path, runtime: Path, podman: Path) -> None:
    """Podman 4.3's migrate says "container not running" (125) of a container whose conmon is gone, and has reset
    the pause process all the same (CI rehearsal 30: the next job ran); one whose Podman still fails is not."""
    container(runtime / "containers", DEAD_ID, a_dead_pid())
    (tmp_path / "wedged").touch()
    (tmp_path / "migrate-fails").touch()
    done = reset_if_left_by_a_killed_attempt(env_of(runtime), uid=os.getuid())
    assert done and "had left Podman unusable" in done and "1 of dlsub's removed" in done, done
    assert podman.read_text().splitlines()[:3] == ["ps -q", "system migrate", "ps -q"]
