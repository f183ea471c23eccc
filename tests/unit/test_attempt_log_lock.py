"""Unit (real processes on this machine's file system; no Slurm): the launchers of one job append to its
``attempts.jsonl`` from several nodes, and on NFS an O_APPEND write from one client can land over another's
line. Each append takes an exclusive POSIX lock first (slurm_plugins/launcher/records.py, append_line): a
line waits while another process holds the lock, and a lock held too long (a dead host's) costs the wait,
never the line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import NO_HANG_S

from dlsub.slurm_plugins.launcher import records

# Holds an exclusive POSIX lock on argv[1] until a line comes on stdin, as another node's launcher would.
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
os.write(fd, b'{"event":"end","role":"worker"}\\n')
os.close(fd)
"""


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def test_a_line_waits_for_another_processs_lock_and_lands_after_its_line(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    holder = _hold_lock(path)
    try:
        appended = threading.Thread(target=records.append_line, args=(path, '{"event":"start","role":"main"}\n'))
        appended.start()
        time.sleep(0.5)
        assert path.read_text() == "", "the line was written while another process held the lock"
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.wait(timeout=NO_HANG_S) == 0
        appended.join(timeout=NO_HANG_S)
        assert not appended.is_alive()
    finally:
        holder.kill()
    assert path.read_text().splitlines() == ['{"event":"end","role":"worker"}', '{"event":"start","role":"main"}']


def test_a_lock_held_past_the_wait_costs_the_wait_not_the_line(tmp_path: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "attempts.jsonl"
    holder = _hold_lock(path)
    try:
        began = time.monotonic()
        records.append_line(path, '{"event":"start","role":"main"}\n', lock_wait_s=0.3)
        waited = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait(timeout=NO_HANG_S)
    assert waited >= 0.3
    assert path.read_text() == '{"event":"start","role":"main"}\n'
    assert f"dlsub: {path} stayed locked for 0.3 s; appending without the lock" in capfd.readouterr().err


def test_a_file_that_cannot_be_opened_costs_its_line_and_says_so(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no such directory" / "attempts.jsonl"
    records.append_line(path, '{"event":"start"}\n')
    assert not path.exists()
    assert f"dlsub: cannot write {path}: No such file or directory" in capfd.readouterr().err
