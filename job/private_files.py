"""A job directory private to its user, readable by the agent only where it must read.

With POSIX ACLs (the usual case)::

    ~/.dlsub/, ~/.dlsub/jobs/     the user's mode, plus u:<agent>:x  (traverse, not list)
    jobs/<id>/                    0700 + u:<agent>:x
    jobs/<id>/progress.jsonl      0600 + u:<agent>:r   (contract.AGENT_READABLE)
    jobs/<id>/attempts.jsonl      0600 + u:<agent>:r
    jobs/<id>/agent/              0700 + u:<agent>:rwx (contract.AGENT_MAILBOX_DIR:
                                  where the agent leaves the batch size it picked)
    everything else               owner only (checkpoints 0700; Slurm's output
                                  file 0600, sbatch runs under umask 077)

Where the filesystem or host has no ACLs (``setfacl`` missing, or "Operation
not supported"), the fallback is dlsub's earlier layout: directories 0711
(anyone may traverse, nobody may list) and the two agent-readable files 0644,
and no mailbox (mode bits cannot let the agent write there and no one else),
so dlsub does not choose that job's batch size; a one-line warning says so.
``setfacl`` runs as an argv list, never a shell.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dlsub.contract import AGENT_MAILBOX_DIR, AGENT_READABLE

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Without ACLs: what mode bits add so the agent may pass through a directory (group and others: x) and read
# the files it reads (group and others: r), and the modes that gives (0711 and 0644), said in the warning.
TRAVERSE_BITS = 0o011
READ_BITS = 0o044
FALLBACK_DIR_MODE = PRIVATE_DIR_MODE | TRAVERSE_BITS
FALLBACK_FILE_MODE = PRIVATE_FILE_MODE | READ_BITS


@dataclass
class AgentAccess:
    """Grants the agent's account what it needs; falls back to mode bits once ACLs fail."""

    agent_user: str
    use_acl: bool = True
    warnings: list[str] = field(default_factory=list)

    def _setfacl(self, path: Path, perms: str) -> str | None:
        """None on success, else why it failed."""
        try:
            result = subprocess.run(["setfacl", "-m", f"u:{self.agent_user}:{perms}", "--", str(path)],
                                    capture_output=True, text=True, timeout=30, check=False)
        except FileNotFoundError:
            return "setfacl is not installed"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"setfacl failed ({exc})"
        if result.returncode != 0:
            return (result.stderr.strip() or f"setfacl exited {result.returncode}").splitlines()[-1]
        return None

    def _acl(self, path: Path, perms: str) -> bool:
        """Grant ``perms`` by ACL; on the first failure, say once that there are none and stop trying."""
        if not self.use_acl:
            return False
        error = self._setfacl(path, perms)
        if error is None:
            return True
        self.use_acl = False
        self.warnings.append(
            f"no POSIX ACLs here ({error}); falling back to mode {FALLBACK_DIR_MODE:04o} directories and "
            f"{FALLBACK_FILE_MODE:04o} progress "
            f"and attempt files, so other users can open those two files of your jobs by name; and the agent "
            f"gets no mailbox in the job directory, so dlsub will not choose your jobs' batch sizes")
        return False

    def _grant(self, path: Path, perms: str, fallback_bits: int) -> None:
        if self._acl(path, perms):
            return
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & fallback_bits != fallback_bits:
            path.chmod(mode | fallback_bits)

    def traverse(self, directory: Path) -> None:
        """Let the agent pass through a directory of ours without listing it."""
        self._grant(directory, "x", TRAVERSE_BITS)

    def read(self, file: Path) -> None:
        self._grant(file, "r", READ_BITS)

    def write_in(self, directory: Path) -> bool:
        """Let the agent (and no one else) write in a directory of ours; False where only ACLs could."""
        return self._acl(directory, "rwx")


def make_job_dir(job_dir: Path, access: AgentAccess) -> None:
    """Make ``job_dir`` (and its parents), the files the agent reads and its mailbox, with the modes above."""
    parents = [p for p in (job_dir.parent.parent, job_dir.parent)]
    for directory in parents:
        directory.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        if directory.stat().st_uid == os.getuid():
            access.traverse(directory)
    job_dir.mkdir(mode=PRIVATE_DIR_MODE)
    access.traverse(job_dir)
    for name in AGENT_READABLE:
        fd = os.open(job_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
        os.close(fd)
        access.read(job_dir / name)
    mailbox = job_dir / AGENT_MAILBOX_DIR
    mailbox.mkdir(mode=PRIVATE_DIR_MODE)
    if not access.write_in(mailbox):
        mailbox.rmdir()  # a mailbox only its owner can write would mislead the agent and the user


# ---------------------------------------------------------------- can the agent get there?


def _acl_allows(path: Path, uid: int, gids: set[int]) -> bool | None:
    """What the ACL says about traversing ``path`` for uid/gids; None when there is no named entry."""
    try:
        out = subprocess.run(["getfacl", "-pn", "--", str(path)], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    entries = {}
    for line in out.splitlines():
        parts = line.split("#")[0].strip().split(":")
        if len(parts) == 3:
            entries[(parts[0], parts[1])] = parts[2]
    mask = entries.get(("mask", ""), "rwx")
    named = entries.get(("user", str(uid)))
    if named is not None:
        return "x" in named and "x" in mask
    groups = [entries[("group", str(g))] for g in gids if ("group", str(g)) in entries]
    if groups:
        return any("x" in g for g in groups) and "x" in mask
    return None


def agent_can_traverse(path: Path, agent_user: str) -> bool:
    """Whether the agent's account may pass through ``path`` (mode bits and ACLs; root-free guess)."""
    try:
        agent = pwd.getpwnam(agent_user)
    except KeyError:
        return True  # no such account on this host (a login node without it): nothing to tell
    gids = {agent.pw_gid, *(g.gr_gid for g in grp.getgrall() if agent_user in g.gr_mem)}
    try:
        info = path.stat()
    except OSError:
        return True
    if info.st_uid == agent.pw_uid:
        return bool(info.st_mode & stat.S_IXUSR)
    acl = _acl_allows(path, agent.pw_uid, gids)
    if acl is not None:
        return acl
    if info.st_gid in gids:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def blocked_ancestor(directory: Path, agent_user: str) -> Path | None:
    """The first directory above ``directory`` (not made by dlsub) the agent cannot pass, if any."""
    for ancestor in reversed(directory.resolve().parents):
        if not agent_can_traverse(ancestor, agent_user):
            return ancestor
    return None


def let_agent_through(directory: Path, access: AgentAccess) -> tuple[list[Path], Path | None]:
    """Let the agent pass the directories above ``directory`` that block it and that are the user's own (a 0700
    home: pam_mkhomedir's, and many sites' default), as ~/.dlsub is passed (:meth:`AgentAccess.traverse`: it may
    enter, never list). Returns those opened, and the first blocking one that is not the user's (None: none)."""
    opened: list[Path] = []
    while (blocked := blocked_ancestor(directory, access.agent_user)) is not None:
        if blocked in opened or blocked.stat().st_uid != os.getuid():
            return opened, blocked
        access.traverse(blocked)
        opened.append(blocked)
    return opened, None
