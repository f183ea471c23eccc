"""Host paths a job's container sees: the site's shared file systems and the user's ``--mount``/``--mount-rw``.

A path is checked on the submit host before anything is submitted (it must
exist, be a directory or a file, and carry no ``:``, Podman's ``--volume``
separator, nor a line break) and is mounted at the path the user named,
from the real path behind it, so a script that reads ``/scratch/me/data``
finds it there even when ``/scratch`` is a symbolic link. Read-only unless
asked for read-write.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Where a mount came from: the site's policy.toml, the user's submit, or dlsub's own (script, submit, job dirs).
ORIGIN_SITE, ORIGIN_USER, ORIGIN_JOB = "site", "user", "job"


class MountError(ValueError):
    """A path that cannot be mounted into the container; the message says which and what to do."""


@dataclass(frozen=True)
class MountRequest:
    """A mount as asked for, before it is checked: the path as written, relative to the submit directory."""

    path: str
    read_only: bool = True
    origin: str = ORIGIN_USER


@dataclass(frozen=True)
class Mount:
    """A checked mount: ``source`` on the host (symbolic links resolved) seen at ``target`` in the container."""

    source: Path
    target: Path
    read_only: bool = True
    origin: str = ORIGIN_USER

    def volume(self) -> str:
        """Podman's ``--volume`` value (both paths are checked free of ``:``)."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.target), "source": str(self.source), "read_only": self.read_only,
                "origin": self.origin}


def check_path_text(text: str, what: str) -> None:
    """Refuse what Podman's ``-v SRC:DST[:ro]`` or one line of the batch script cannot carry."""
    if any(ch in text for ch in "\n\r"):
        raise MountError(f"{what} {text!r} has a line break; rename the path or mount a folder above it")
    if ":" in text:
        raise MountError(f"{what} {text!r} contains ':', which Podman's --volume cannot mount; "
                         "move or rename it, or mount a folder above it")


def resolve_mount(request: MountRequest, cwd: Path) -> Mount:
    """``request`` checked on this host: an absolute target and the real, existing directory or file behind it."""
    option = "--mount" if request.read_only else "--mount-rw"
    what = f"{option} {request.path}" if request.origin == ORIGIN_USER else "the site's shared file system"
    if not request.path.strip():
        raise MountError(f"{option} needs a path (a directory or file to see in the container)")
    check_path_text(request.path, what)
    target = Path(os.path.abspath(cwd / os.path.expanduser(request.path)))
    if target == Path("/"):
        raise MountError(f"{what}: cannot mount the whole file system over the container's; name a folder")
    try:
        source = target.resolve(strict=True)
        info = source.stat()
    except (FileNotFoundError, NotADirectoryError):
        hint = ("; give a directory or file that does (a relative path is taken from the directory you submit "
                "from)") if request.origin == ORIGIN_USER else ""
        raise MountError(f"{what}: {target} does not exist on this host{hint}") from None
    except (OSError, RuntimeError) as exc:
        raise MountError(f"{what}: {target} cannot be read ({exc}); check the path and its permissions") from None
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise MountError(f"{what}: {source} is neither a directory nor a file; mount the folder it is in")
    check_path_text(str(source), f"{what}: the real path")
    if not os.access(source, os.R_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)):
        raise MountError(f"{what}: you cannot read {source}; check its permissions")
    return Mount(source, target, request.read_only, request.origin)


def merge_mounts(mounts: Iterable[Mount]) -> list[Mount]:
    """The mounts to give Podman, parents before what is inside them (as Podman mounts them).

    One mount per target: read-write if any asked for it. A mount inside
    another with the same mode and the same files under it adds nothing and
    is left out; one with another mode (a read-write job directory under a
    read-only shared file system, a read-only data folder in a read-write
    home) is kept, so it shadows its parent there.
    """
    by_target: dict[Path, Mount] = {}
    for m in mounts:
        seen = by_target.get(m.target)
        if seen is None or (seen.read_only and not m.read_only):
            by_target[m.target] = m
    kept: list[Mount] = []
    for m in sorted(by_target.values(), key=lambda m: (len(m.target.parts), str(m.target))):
        parents = [k for k in kept if k.target in m.target.parents]
        nearest = max(parents, key=lambda k: len(k.target.parts), default=None)
        if nearest is not None and nearest.read_only == m.read_only \
                and nearest.source / m.target.relative_to(nearest.target) == m.source:
            continue
        kept.append(m)
    return kept
