"""`dlsub doctor` on the live testbed: ok as it comes up, and each problem introduced on purpose is named
with its fix (the job_submit plugin removed, the agent stopped, a user's subuid entry missing)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from livebed import USER, USER2, TestbedUser, agent_service


def doctor(user: str = USER) -> tuple[int, dict[str, dict[str, Any]]]:
    """`dlsub doctor --user USER --json` as root (an admin's run), by check name."""
    result = subprocess.run(["dlsub", "doctor", "--user", user, "--json"], capture_output=True, text=True,
                            timeout=120)
    report = json.loads(result.stdout)
    assert report["ok"] == (result.returncode == 0), report
    return result.returncode, {c["check"]: c for c in report["checks"]}


@contextmanager
def moved_aside(path: Path) -> Iterator[None]:
    aside = path.with_name(path.name + ".doctor-test")
    shutil.move(path, aside)
    try:
        yield
    finally:
        shutil.move(aside, path)


def test_the_testbed_is_ok(user: TestbedUser) -> None:
    rc, checks = doctor()
    assert rc == 0, checks
    assert checks["slurm version"]["status"] == "ok"
    version = subprocess.run(["scontrol", "--version"], capture_output=True, text=True).stdout.split()[-1]
    assert version in checks["slurm version"]["detail"]
    for name in ("agent is a Slurm Operator", "job_submit.lua", "cred_expire", "GPU gres", "policy partitions exist",
                 "agent", "clocks", f"image of {USER}", f"subordinate ids of {USER}", "job cgroups",
                 f"container storage of {USER}", "dlsub package for containers", "shared mounts"):
        assert checks[name]["status"] == "ok", checks[name]


def test_the_job_submit_plugin_removed(user: TestbedUser) -> None:
    with moved_aside(Path("/etc/slurm/job_submit.lua")):
        rc, checks = doctor()
    assert rc == 1
    assert checks["job_submit.lua"]["status"] == "problem"
    assert "job_submit.lua" in checks["job_submit.lua"]["fix"]


def test_the_agent_stopped(user: TestbedUser) -> None:
    agent_service("stop")
    try:
        rc, checks = doctor()
    finally:
        agent_service("start")
    assert rc == 1
    assert checks["agent"]["status"] == "problem" and "start" in checks["agent"]["fix"]
    assert doctor()[0] == 0


def test_a_users_subuid_entry_missing(user2: TestbedUser) -> None:
    subuid = Path("/etc/subuid")
    original = subuid.read_text()
    subuid.write_text("".join(line for line in original.splitlines(keepends=True)
                              if not line.startswith(f"{USER2}:")))
    try:
        rc, checks = doctor(USER2)
    finally:
        subuid.write_text(original)
    assert rc == 1
    found = checks[f"subordinate ids of {USER2}"]
    # Through getsubids where the host has it (Debian's uidmap ships it; it reads /etc/subuid here), else the file.
    assert found["status"] == "problem" and ("getsubids gives 0 uids" in found["detail"]
                                             or "/etc/subuid has 0" in found["detail"])
    assert "usermod --add-subuids" in found["fix"]
