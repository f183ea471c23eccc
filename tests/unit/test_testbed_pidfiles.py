"""Unit (real processes and pid files in a temporary folder; no Slurm, no root): the testbed's scripts
(testbed/common.sh) trust a pid file only while the process it names is older than the file. A run ended
without `make testbed-down` (a session's processes killed, the machine's /run kept) leaves its pid files, and a
later run's processes may have their pids: CI's run on such a machine took slurmdbd for alive, never started
it, and failed waiting for it ("slurmdbd does not answer"); stop_pidfile would have signalled the stranger.
A process once found so is known by its pid and start from then on (pid_record), so that a wall clock stepped
forward while the testbed runs (CI's machine, restored from a snapshot mid-run) does not make it look younger
than its file: a step forward reads as a file written earlier, which is how these tests make one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

COMMON = REPO / "testbed" / "common.sh"


def _bash(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'. "$0"; {script}', str(COMMON), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.fixture(autouse=True)
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pid_alive's records in the test's folder, not the testbed's."""
    folder = tmp_path / "records"
    monkeypatch.setenv("DLSUB_TESTBED_PID_RECORDS", str(folder))
    return folder


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process of nobody's testbed, that must outlive every check."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _pidfile(folder: Path, pid: int, *, written_s_ago: float = 0.0) -> Path:
    path = folder / "daemon.pid"
    path.write_text(f"{pid}\n")
    if written_s_ago:
        then = time.time() - written_s_ago
        os.utime(path, (then, then))
    return path


def test_a_pid_file_written_after_its_process_started_names_it(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    pidfile = _pidfile(tmp_path, stranger.pid)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 0


def test_a_pid_file_older_than_the_process_with_its_pid_names_nothing(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    # As a killed run's file looks once a later process has its pid: written before that process started.
    pidfile = _pidfile(tmp_path, stranger.pid, written_s_ago=30)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 1


def test_stopping_by_a_stale_pid_file_signals_no_one_and_removes_the_file(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    pidfile = _pidfile(tmp_path, stranger.pid, written_s_ago=30)
    result = _bash('stop_pidfile "$1"', str(pidfile))
    assert result.returncode == 0, result.stderr
    assert not pidfile.exists()
    assert stranger.poll() is None  # the stranger runs on


def test_stopping_by_a_current_pid_file_stops_its_process(tmp_path: Path) -> None:
    # A daemon's way: not this test's child (whose end would leave a zombie that kill -0 still finds).
    started = _bash("sleep 60 >/dev/null 2>&1 & echo $!")
    pid = int(started.stdout)
    try:
        pidfile = _pidfile(tmp_path, pid)
        assert _bash('stop_pidfile "$1"', str(pidfile)).returncode == 0
        assert not Path(f"/proc/{pid}").exists()
        assert not pidfile.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str | None:
    """The process's state letter (/proc/PID/stat, after its name in parentheses); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except FileNotFoundError:
        return None


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    return _state(pid) not in (None, "Z")


def _ignores_term(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored, 16) & (1 << (signal.SIGTERM - 1)))


def test_several_pid_files_are_stopped_together_the_stubborn_one_killed_the_stranger_left(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    """stop_pidfile with several files (stop_slurm's slurmds and backup controller): each named daemon TERMed
    at once and waited for, one that ignores TERM killed after the wait, a stale file's pid left alone, and
    every file removed."""
    polite = int(_bash("sleep 60 >/dev/null 2>&1 & echo $!").stdout)
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    stubborn = int(_bash(f'"$1" -c "{ignore_term}" >/dev/null 2>&1 & echo $!', sys.executable).stdout)
    try:
        deadline = time.monotonic() + 30
        while not _ignores_term(stubborn):  # its TERM must find it ignoring TERM, not still starting
            assert time.monotonic() < deadline, "the stubborn process never came to ignore TERM"
            time.sleep(0.05)
        files = []
        for n, pid in enumerate((polite, stubborn)):
            (folder := tmp_path / str(n)).mkdir()
            files.append(_pidfile(folder, pid))
        (folder := tmp_path / "stale").mkdir()
        files.append(_pidfile(folder, stranger.pid, written_s_ago=30))
        result = _bash('stop_pidfile "$@"', *map(str, files))
        assert result.returncode == 0, result.stderr
        assert not _running(polite) and not _running(stubborn)
        assert not any(f.exists() for f in files)
        assert stranger.poll() is None
    finally:
        for pid in (polite, stubborn):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("content", ["", "not-a-pid\n", "-1\n", "999999999\n", "1 2\n"])
def test_a_pid_file_naming_no_process_names_nothing(tmp_path: Path, content: str) -> None:
    pidfile = tmp_path / "daemon.pid"
    pidfile.write_text(content)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 1
    assert _bash('pid_alive "$1"', str(tmp_path / "missing.pid")).returncode == 1


def test_a_killed_daemon_not_yet_reaped_is_not_alive(tmp_path: Path) -> None:
    # A session's daemons killed at its end stay zombies until init reaps them; kill -0 still finds a zombie, and
    # the next run took munged for alive a second after the kill ("munge does not work").
    process = subprocess.Popen(["sleep", "60"])
    try:
        pidfile = _pidfile(tmp_path, process.pid)
        process.kill()
        deadline = time.monotonic() + 20
        while _state(process.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _bash('pid_alive "$1"', str(pidfile)).returncode == 1
    finally:
        process.kill()
        process.wait()


def _backdate(path: Path, seconds: float) -> None:
    """As the file reads after the wall clock is stepped forward by ``seconds``."""
    then = path.stat().st_mtime - seconds
    os.utime(path, (then, then))


def test_a_process_found_alive_stays_alive_when_the_wall_clock_is_stepped_forward(
    tmp_path: Path, stranger: subprocess.Popen[bytes], records: Path
) -> None:
    pidfile = _pidfile(tmp_path, stranger.pid)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 0
    _backdate(pidfile, 60)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 0
    # Unrecorded, the same file would name nothing: the record is what keeps it.
    for record in records.iterdir():
        record.unlink()
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 1


def test_a_record_of_an_earlier_process_with_the_pid_vouches_for_no_other(
    tmp_path: Path, stranger: subprocess.Popen[bytes], records: Path
) -> None:
    pidfile = _pidfile(tmp_path, stranger.pid)
    assert _bash('pid_alive "$1"', str(pidfile)).returncode == 0
    (record,) = records.iterdir()
    pid, start, boot = record.read_text().split()
    assert (int(pid), boot) == (stranger.pid, Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    # The process that had the pid before this one (another start), or one of another boot (the same start).
    for earlier in (f"{pid} {int(start) - 1} {boot}", f"{pid} {start} 00000000-0000-0000-0000-000000000000"):
        record.write_text(earlier + "\n")
        _backdate(pidfile, 60)
        assert _bash('pid_alive "$1"', str(pidfile)).returncode == 1, earlier


def test_stopping_removes_the_record_with_the_pid_file(tmp_path: Path, records: Path) -> None:
    started = _bash("sleep 60 >/dev/null 2>&1 & echo $!")
    pid = int(started.stdout)
    try:
        pidfile = _pidfile(tmp_path, pid)
        assert _bash('pid_alive "$1"', str(pidfile)).returncode == 0
        assert len(list(records.iterdir())) == 1
        _backdate(pidfile, 60)  # stopped by its record, as after a step of the clock
        assert _bash('stop_pidfile "$1"', str(pidfile)).returncode == 0
        assert not Path(f"/proc/{pid}").exists()
        assert not pidfile.exists() and not list(records.iterdir())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_record_that_cannot_be_written_leaves_the_answer_as_the_file_gives_it(
    tmp_path: Path, stranger: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a caller that may not write the testbed's records would find it: the age check alone.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("DLSUB_TESTBED_PID_RECORDS", str(blocked / "records"))
    pidfile = _pidfile(tmp_path, stranger.pid)
    result = _bash('pid_alive "$1"', str(pidfile))
    assert result.returncode == 0 and result.stderr == "", result
