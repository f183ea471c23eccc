"""Which file system a path is on, as this host's kernel names it (its mount table), and which of those are
shared between hosts over a network, where what works on a local disk may not (SQLite's WAL, Podman's storage).
"""

from __future__ import annotations

import errno
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


def mount_table() -> str | None:
    """This process's mount table (/proc/self/mountinfo) as text, for the functions below to share one read;
    None where it cannot be read."""
    try:
        return MOUNTINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _mount_of(path: Path, mountinfo: str | None = None) -> tuple[str, frozenset[str]] | None:
    """(type, mount and file-system options) of the mount ``path`` (or, where it does not exist yet, its nearest
    existing parent) is on: the mount whose point is the longest prefix of its real path (the last listed,
    where mounts stack). None where the mount table cannot be read."""
    if mountinfo is None:
        mountinfo = mount_table()
        if mountinfo is None:
            return None
    real = Path(os.path.realpath(path))
    best: tuple[int, str, frozenset[str]] | None = None
    for line in mountinfo.splitlines():
        mine, sep, theirs = line.partition(" - ")
        fields, kinds = mine.split(), theirs.split()
        if not sep or len(fields) < 6 or not kinds:
            continue
        point = Path(_unescaped(fields[4]))
        if real == point or point in real.parents:
            depth = len(point.parts)
            if best is None or depth >= best[0]:
                options = {*fields[5].split(","), *(kinds[2].split(",") if len(kinds) > 2 else ())}
                best = (depth, kinds[0], frozenset(options))
    return (best[1], best[2]) if best else None


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the file system ``path`` is on (:func:`_mount_of`); None where the mount table cannot be
    read."""
    mount = _mount_of(path, mountinfo)
    return mount[0] if mount else None


def on_network_filesystem(path: Path, mountinfo: str | None = None) -> bool:
    return filesystem_type(path, mountinfo) in NETWORK_FILESYSTEMS


#: Mount options of NFS under which a host's byte-range locks stay its own (nfs(5): ``nolock``, ``local_lock``).
LOCAL_LOCK_OPTIONS = frozenset({"nolock", "local_lock=all", "local_lock=posix"})


def locks_shared_between_hosts(path: Path, mountinfo: str | None = None) -> bool:
    """Whether a byte-range (POSIX) lock one host takes on ``path``'s file system is seen by the others: on a
    local disk there are no others; over NFS its lock manager shares them, unless mounted ``nolock`` or
    ``local_lock``; over sshfs they never are (SFTP has no locks: the kernel keeps each host's to itself).
    SQLite's rollback journal keeps writers apart with these locks alone. True where the table cannot be read."""
    mount = _mount_of(path, mountinfo)
    if mount is None:
        return True
    kind, options = mount
    if kind == "fuse.sshfs":
        return False
    return not (kind in ("nfs", "nfs4") and options & LOCAL_LOCK_OPTIONS)


#: getxattr's answers for a file system that keeps no POSIX ACLs (NFSv4 keeps its own, sshfs none).
_NO_ACLS = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def posix_acls_work(path: Path) -> bool:
    """Whether ``path``'s file system (its nearest existing folder's) keeps POSIX ACLs, as setfacl sets them: asked
    without writing (getxattr of the access ACL: "no such attribute" where there could be one, "not supported"
    where there cannot). True where it cannot be told (the folder cannot be reached)."""
    for folder in (path, *path.parents):
        try:
            os.getxattr(folder, "system.posix_acl_access")
        except FileNotFoundError:
            continue
        except OSError as exc:
            return exc.errno not in _NO_ACLS
        return True
    return True
