"""A user's rootless Podman on this node, left unusable by an attempt that was killed: found and reset.

When Slurm aborts an attempt (SIGKILL to every process of its cgroups, no SIGTERM first, so no launcher cleans
up: a node back after its jobs were requeued elsewhere, "registered on the wrong node"), the container's
``conmon`` dies with Podman's pause process (the job's first podman started it, in the job's cgroup), and
Podman's record still says the container runs. Every later ``podman`` command of that user on this node then
tries to join the user namespace of those processes, finds none, and exits with "invalid internal status, try
resetting the pause process with podman system migrate": the user's next job here failed in 2 s. (Found by
``benchmarks/soak.py --pair`` with Podman 4.3.)

Before this node's container starts, the launcher looks, with file reads only, for containers whose ``conmon``
has died: a ``conmon.pid`` naming no live process in Podman's run root. Podman keeps the run root it first used
in its database, so both places it may be are looked at: ``$XDG_RUNTIME_DIR/containers`` and, where the first
podman ran without a runtime directory, ``/tmp/containers-user-$UID/containers``. Only when there is such a
container does it ask Podman (``podman ps -q``, the one call that costs time, and only then); if Podman fails
asking for ``podman system migrate``, it runs that (a new pause process; those containers marked stopped:
nothing of this user runs here, or Podman would have joined it) and removes the dead containers that are
dlsub's (label ``dlsub.job_id``), never a container that was not among the dead ones it found.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Each container's run-time files under a run root: ``<id>/userdata/conmon.pid``.
CONTAINERS_RUN = "overlay-containers"
#: The label every dlsub container carries (containers/podman.py's ``podman run`` line).
DLSUB_LABEL = "dlsub.job_id"
#: What Podman says when the processes whose user namespace it must join are all gone.
WEDGED = "system migrate"
#: The name of the process that a container's ``conmon.pid`` names while it lives.
CONMON = "conmon"


def run_roots(env: Mapping[str, str], uid: int) -> list[Path]:
    """Where this user's Podman may keep its run root here (the one its database holds is one of them)."""
    roots = [Path(env["XDG_RUNTIME_DIR"]) / "containers"] if env.get("XDG_RUNTIME_DIR") else []
    return [*roots, Path(f"/tmp/containers-user-{uid}/containers")]


def _alive(pid_file: Path, uid: int | None = None) -> bool | None:
    """Whether the conmon a pid file names is alive; None when the file is missing or unreadable."""
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
        pass  # a process of another user: its status (below) says whose
    # The pid may be another process's by now: a node's pids wrap at pid_max (32768 on the testbed), and the
    # full live suite once found the killed conmon's taken within seconds, left the user's Podman wedged and
    # failed the next job (CI rehearsal, 3 Dec). And a conmon killed a moment ago may not be reaped yet: a
    # zombie answers kill -0 and keeps its name, and the user's next job on the node, started within the
    # second, took Podman for working (CI rehearsal 29, 3 Dec). A process's status is readable whoever owns it.
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
    except OSError:
        return True  # gone since, or not readable here: as before, not ours to judge
    name, state = status.get("Name", "").strip(), status.get("State", "").strip()[:1]
    owner = status.get("Uid", "").split()[:1]
    if uid is not None and owner and owner[0].isdigit() and int(owner[0]) != uid:
        return False  # another user's process: never this user's conmon
    return name == CONMON and state not in ("Z", "X")


def dead_containers(roots: Sequence[Path], uid: int | None = None) -> list[str]:
    """The IDs of the containers under ``roots`` whose ``conmon`` is dead; [] when a ``conmon`` of this user
    (``uid``, where given) lives here (Podman joins its namespace) or none is dead."""
    dead = []
    for root in roots:
        try:
            entries = sorted(os.scandir(root / CONTAINERS_RUN), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            state = _alive(Path(entry.path) / "userdata" / "conmon.pid", uid)
            if state:
                return []
            if state is False and entry.name not in dead:
                dead.append(entry.name)
    return dead


def _podman(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["podman", *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=dict(env), timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(["podman", *argv], 1, "", str(exc))


def reset_if_left_by_a_killed_attempt(env: Mapping[str, str], uid: int | None = None) -> str | None:
    """Reset this user's Podman here when a killed attempt left it unusable (above); what was done, for the
    job's output, or None when nothing was needed."""
    user = os.getuid() if uid is None else uid
    dead = dead_containers(run_roots(env, user), user)
    if not dead:
        return None
    probe = _podman(["ps", "-q"], env)
    if probe.returncode == 0 or WEDGED not in probe.stderr:
        return None  # Podman works (or fails otherwise: the container's own run says how)
    migrated = _podman(["system", "migrate"], env)
    # Podman 4.3's migrate exits 125 ("container not running") when it cannot stop a container whose conmon is
    # gone, having made the new pause process all the same: whether Podman works now is what counts (CI
    # rehearsal 30: the next job then ran, under a message that the reset had failed).
    if migrated.returncode != 0 and _podman(["ps", "-q"], env).returncode != 0:
        return (f"podman system migrate failed ({migrated.returncode}): "
                f"{(migrated.stderr or migrated.stdout).strip()[-300:]}")
    listed = _podman(["ps", "-a", "--no-trunc", "--filter", f"label={DLSUB_LABEL}", "--format", "{{.ID}}"], env)
    ours = [cid for cid in dead if cid in listed.stdout.split()]
    if ours:
        _podman(["rm", "-f", "--ignore", *ours], env)
    return (f"{len(dead)} container(s) of a killed attempt had left Podman unusable for this user here; reset "
            f"with podman system migrate, and {len(ours)} of dlsub's removed")


__all__ = ["dead_containers", "reset_if_left_by_a_killed_attempt", "run_roots"]
