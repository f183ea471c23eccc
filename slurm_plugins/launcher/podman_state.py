"""A user's rootless Podman on this node, left unusable by an attempt that was killed: found and reset.

When Slurm kills an attempt's processes outright (a node that comes back while its old attempt still ends, a
job cancelled or timed out while its container stops), the container's ``conmon`` dies with Podman's pause
process, and Podman's record still says the container runs. Every later ``podman`` command of that user on this
node then tries to join the user namespace of those processes, finds none, and exits with "invalid internal
status, try resetting the pause process with podman system migrate": the user's next job here could not start
its container. (Seen in ``benchmarks/soak.py --pair`` with Podman 4.3: a node cut off, back as Slurm killed its
old attempt.)

Before this node's container starts, the launcher looks, with file reads only, for that state: no live pause
process, and every container with a ``conmon.pid`` in the runtime directory's run root dead. Only then does it
run ``podman system migrate`` (which starts a new pause process and marks those containers stopped; nothing of
this user runs here, or Podman would have joined it) and remove the dead containers that are dlsub's (label
``dlsub.job_id``), never a container that was not among the dead ones it found.

The run root is Podman's rootless default, ``$XDG_RUNTIME_DIR/containers``; a site that sets another
``runroot`` gets no reset (nothing is found), as before.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Where Podman keeps the pause process's pid, under the runtime directory.
PAUSE_PID = Path("libpod/tmp/pause.pid")
#: Each container's run-time files, under the runtime directory: ``<id>/userdata/conmon.pid``.
CONTAINERS_RUN = Path("containers/overlay-containers")
#: The label every dlsub container carries (containers/podman.py's ``podman run`` line).
DLSUB_LABEL = "dlsub.job_id"


def _alive(pid_file: Path) -> bool | None:
    """Whether the process a pid file names is alive; None when the file is missing or unreadable."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a process of another user holds that pid now: alive, and not ours to judge
    return True


def dead_containers(runtime_dir: Path) -> list[str]:
    """The IDs of the containers whose ``conmon`` is dead, when no pause process and no ``conmon`` of this
    user lives here (Podman's state left by a killed attempt); [] otherwise, or when nothing was there."""
    if _alive(runtime_dir / PAUSE_PID):
        return []
    try:
        entries = sorted(os.scandir(runtime_dir / CONTAINERS_RUN), key=lambda e: e.name)
    except OSError:
        return []
    dead = []
    for entry in entries:
        state = _alive(Path(entry.path) / "userdata" / "conmon.pid")
        if state:
            return []  # a container of this user runs here: Podman joins its namespace
        if state is False:
            dead.append(entry.name)
    return dead


def _podman(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["podman", *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=dict(env), timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(["podman", *argv], 1, "", str(exc))


def reset_if_left_by_a_killed_attempt(env: Mapping[str, str]) -> str | None:
    """Reset this user's Podman here when a killed attempt left it unusable (above); what was done, for the
    job's output, or None when nothing was needed."""
    runtime = env.get("XDG_RUNTIME_DIR")
    dead = dead_containers(Path(runtime)) if runtime else []
    if not dead:
        return None
    migrated = _podman(["system", "migrate"], env)
    if migrated.returncode != 0:
        return (f"podman system migrate failed ({migrated.returncode}): "
                f"{(migrated.stderr or migrated.stdout).strip()[-300:]}")
    listed = _podman(["ps", "-a", "--no-trunc", "--filter", f"label={DLSUB_LABEL}", "--format", "{{.ID}}"], env)
    ours = [cid for cid in dead if cid in listed.stdout.split()]
    if ours:
        _podman(["rm", "-f", "--ignore", *ours], env)
    return (f"{len(dead)} container(s) of a killed attempt had left Podman unusable for this user here; reset "
            f"with podman system migrate, and {len(ours)} of dlsub's removed")


__all__ = ["dead_containers", "reset_if_left_by_a_killed_attempt"]
