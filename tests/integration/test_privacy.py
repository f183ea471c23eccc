"""Integration tests (live testbed, two unprivileged users, the agent service running): the agent's
state is private, and users learn about their own jobs only.

`dltest` owns a job the agent has decided about; `dltest2` is another user
who tries to read those decisions, to open the agent's database, its
-wal/-shm and its lock file, and to stall the agent through its socket.
"""

from __future__ import annotations

import json
import pwd
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from livebed import AGENT_USER, TestbedUser, wait_for

STATE_DIR = Path("/var/lib/dlsub")
SERVICE_DB = STATE_DIR / "agent.db"
STATE_FILES = [Path(f"{SERVICE_DB}{suffix}") for suffix in ("", "-wal", "-shm", ".lock")]
SOCKET = Path("/run/dlsub/agent.sock")
KEPT_FIELDS = {"running", "last_tick", "last_tick_age_s", "doing", "moves_in_flight", "last_error"}


pytestmark = pytest.mark.usefixtures("service_agent_for_module")


def status_as(who: TestbedUser) -> tuple[int, dict[str, Any]]:
    out = who.run("dlsub", "agent", "status", "--json", timeout=60)
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def decided_job(user: TestbedUser) -> Iterator[dict[str, Any]]:
    """A job of `dltest` that the agent has decided something about (what `dlsub why` shows its owner)."""
    dlsub_id = secrets.token_hex(4)
    job_dir = user.home / ".dlsub" / "jobs" / dlsub_id
    user.run("mkdir", "-p", str(job_dir), check=True)
    # A plain batch job that says it is dlsub's, immediate mode on cpu, wanting a GPU: the agent follows it and
    # says why it does not move it (no checkpoint). Held work is none: it only sleeps.
    out = user.run("sbatch", "--parsable", "-p", "cpu", "--mem=50", "--time=10", "-J", "it-privacy",
                   f"--comment=dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1",
                   f"--output={job_dir}/slurm-%j.out", "--wrap", "sleep 600", check=True)
    slurm_id = int(out.stdout.strip().split(";")[0])

    def owner_sees() -> list[dict[str, Any]]:
        res = user.run("dlsub", "why", dlsub_id, "--json")
        return json.loads(res.stdout) if res.returncode == 0 else []

    try:
        decisions = wait_for("the agent to decide something about the job", owner_sees, timeout=60)
        yield {"dlsub_id": dlsub_id, "slurm_job_id": slurm_id, "decisions": decisions}
    finally:
        subprocess.run(["scancel", str(slurm_id)], check=False)


def test_agent_status_as_a_user_has_the_kept_fields_and_says_running(user: TestbedUser) -> None:
    code, info = status_as(user)
    assert code == 0, info
    assert KEPT_FIELDS <= set(info) and info["running"] is True
    assert info["late"] is False and info["tick_deadline_s"] > 0
    assert info["last_tick_age_s"] is not None and info["last_tick_age_s"] < info["tick_interval_s"] + 10
    text = user.run("dlsub", "agent", "status", check=True).stdout
    assert "running" in text and "last tick" in text


def test_the_owner_sees_the_decisions_and_another_user_sees_none(
    user: TestbedUser, user2: TestbedUser, decided_job: dict[str, Any]
) -> None:
    assert all(d["uid"] == user.uid for d in decided_job["decisions"])
    reasons = [d["reason"] for d in decided_job["decisions"]]
    by_slurm_id = json.loads(user.dlsub("why", str(decided_job["slurm_job_id"]), "--json").stdout)
    assert {d["reason"] for d in by_slurm_id} >= set(reasons)
    for job in (decided_job["dlsub_id"], str(decided_job["slurm_job_id"])):
        as_json = user2.run("dlsub", "why", job, "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == []
        text = user2.run("dlsub", "why", job)
        assert "decided nothing" in text.stdout
        assert not any(r in text.stdout + text.stderr for r in reasons)
    # Nor through the status: another user's move would not be listed.
    _, info = status_as(user2)
    assert all(m.get("uid") == user2.uid for m in info["moves_in_flight"])


def test_the_agents_files_are_private_to_its_account(user2: TestbedUser) -> None:
    info = STATE_DIR.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == pwd.getpwnam(AGENT_USER).pw_uid
    present = [p for p in STATE_FILES if p.exists()]
    assert SERVICE_DB in present and Path(f"{SERVICE_DB}.lock") in present
    for path in present:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is mode {mode:o}"
    probe = ("import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p, 'rb').close()\n"
             "        print('opened', p)\n    except PermissionError:\n        print('denied', p)\n")
    out = user2.run("python3", "-c", probe, *map(str, STATE_FILES), check=True).stdout.split("\n")
    assert [line.split()[0] for line in out if line] == ["denied"] * len(STATE_FILES), out
    for argv in (["agent", "status"], ["why", "0123abcd"]):
        res = user2.run("dlsub", *argv, "--db", str(SERVICE_DB))
        assert res.returncode == 3 and "private" in res.stderr, res


HOSTILE = r"""
import fcntl, socket, sys, time
paths, sock_path, until = sys.argv[1:-2], sys.argv[-2], time.time() + float(sys.argv[-1])
held, tries = [], 0
while time.time() < until:
    for p in paths:  # the database, its WAL files, the lock: try to hold any of them
        try:
            fh = open(p, "rb+")
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(fh)
            print("LOCKED", p, flush=True)
        except OSError:
            pass
    # Connections that never finish a request, an endless one, and junk.
    for payload in (b"", b'{"op": "why", "dlsub_id": "', b"x" * 65536, b"\x00\xff" * 100):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(0.2)
            s.connect(sock_path)
            s.sendall(payload)
            held.append(s)
            tries += 1
        except OSError:
            pass
    held = held[-200:]
    time.sleep(0.05)
print("TRIES", tries, flush=True)
"""


def test_another_user_cannot_lock_the_agent_out_or_stall_it(user: TestbedUser, user2: TestbedUser) -> None:
    _, before = status_as(user)
    interval = before["tick_interval_s"]
    duration = max(15.0, 4 * interval)
    hostile = subprocess.Popen(
        ["runuser", "-u", user2.name, "--", "env", "-i", *(f"{k}={v}" for k, v in user2.env.items()),
         "/usr/bin/python3", "-I", "-c", HOSTILE,
         *map(str, STATE_FILES), str(SOCKET), str(duration)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        time.sleep(1)
        ticks, slowest = [], 0.0
        while hostile.poll() is None:
            started = time.monotonic()
            code, info = status_as(user)
            slowest = max(slowest, time.monotonic() - started)
            assert code == 0 and info["running"], info
            ticks.append(info["last_tick"])
            time.sleep(interval)
        out, err = hostile.communicate(timeout=30)
    finally:
        if hostile.poll() is None:
            hostile.kill()
            hostile.wait()
    assert "LOCKED" not in out, out
    assert "TRIES" in out and int(out.split("TRIES")[1].split()[0]) > 0, (out, err)
    assert len(set(ticks)) >= 3, f"the agent kept ticking while another user tried: {ticks}"
    assert slowest < 5, f"the owner's status query took {slowest:.1f} s under attack"
    _, after = status_as(user)
    assert after["late"] is False and after["last_tick"] > before["last_tick"]
