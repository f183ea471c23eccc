"""Which file system a path is on, as this host's kernel names it (its mount table), and which of those are
shared between hosts over a network, where what works on a local disk may not (SQLite's WAL, Podman's storage).
"""

from __future__ import annotations

import os
from pathlib import Path

#: File systems shared between hosts over a network or a parallel file system's own protocol, as the kernel
#: names them (``stat -f -c %T``, /proc/self/mountinfo): rootless Podman's storage does not work on them
#: (Podman's rootless.md), nor SQLite's WAL (its shared memory is one host's: sqlite.org/wal.html).
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb2", "smb3", "ceph",
                                 "fuse.ceph", "panfs", "fuse.glusterfs", "fuse.sshfs", "wekafs", "9p"})

MOUNTINFO = Path("/proc/self/mountinfo")


def _unescaped(field: str) -> str:
    """A mount point as mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the file system ``path`` (or, where it does not exist yet, its nearest existing parent) is
    on: the mount whose point is the longest prefix of its real path (the last listed, where mounts stack).
    None where the mount table cannot be read. ``mountinfo``: the table's text (read from the kernel by
    default)."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    real = Path(os.path.realpath(path))
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        mine, sep, theirs = line.partition(" - ")
        fields, kinds = mine.split(), theirs.split()
        if not sep or len(fields) < 5 or not kinds:
            continue
        point = Path(_unescaped(fields[4]))
        if real == point or point in real.parents:
            depth = len(point.parts)
            if best is None or depth >= best[0]:
                best = (depth, kinds[0])
    return best[1] if best else None


def on_network_filesystem(path: Path, mountinfo: str | None = None) -> bool:
    return filesystem_type(path, mountinfo) in NETWORK_FILESYSTEMS
