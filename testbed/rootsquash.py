#!/usr/bin/python3
"""The testbed's network home, as a client sees it: what an NFS export with root_squash gives (testbed/nethome.sh).

Run as root on a host, over that host's sshfs mount of the head's home (made by root: ``idmap=none``, the
head's numeric owners kept, ``default_permissions``: the kernel checks the mode bits against the caller).
For each request this layer takes on the caller's identity (file-system uid and gid, supplementary groups)
before it touches the sshfs mount below, so the kernel's check there is the caller's; root's requests it makes
as nobody, so root reads and writes only what anyone may, as a server's root_squash makes it. What a caller
creates is theirs (the head's sftp server creates it as root; the layer gives it to the caller, as an NFS
server creates it as the caller). There are no extended attributes, so no POSIX ACLs (sshfs has none; NFSv4's
are not POSIX's), and byte-range locks stay each host's (the kernel's own, as sshfs's). It calls itself sshfs
(``fuse.sshfs`` in the mount table): dlsub sees the file system a site's sshfs home would show it.

Usage: rootsquash.py LOWER MOUNTPOINT PIDFILE (stays in the foreground; its pid is written once mounted).
Debian's python3-fusepy (libfuse 2); one thread, so the identity it takes is the one the request runs under.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

from fusepy import FUSE, FuseOSError, Operations, fuse_get_context

NOBODY, NOGROUP = 65534, 65534
_libc = ctypes.CDLL(None, use_errno=True)


def _groups_of(pid: int) -> list[int]:
    """The caller's supplementary groups (its /proc status): the kernel checks group bits against them."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return [int(g) for g in line.split()[1:]]
    except OSError:
        pass
    return []


class RootSquash(Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, lower: str) -> None:
        self.lower = lower

    def _path(self, path: str) -> str:
        return self.lower + path

    def _become(self, uid: int, gid: int, groups: list[int]) -> None:
        # Groups first, while the file-system uid is still root's (setgroups needs CAP_SETGID, kept either way).
        os.setgroups(groups)
        _libc.setfsgid(gid)
        _libc.setfsuid(uid)

    def __call__(self, op: str, path: str, *args: Any) -> Any:
        if op in ("init", "destroy"):  # libfuse's own, as root
            return getattr(self, op)(path)
        uid, gid, pid = fuse_get_context()
        if uid == 0:  # root_squash: root is nobody here
            uid, gid, groups = NOBODY, NOGROUP, []
        else:
            groups = _groups_of(pid)
        self._become(uid, gid, groups)
        try:
            return getattr(self, op)(path, *args)
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None
        except AttributeError:
            raise FuseOSError(errno.ENOSYS) from None
        finally:
            self._become(0, 0, [])

    def _give(self, target: str | int) -> None:
        """Give what a caller made to the caller (or nobody): the sftp server below made it as root. By path for a
        directory or node (the testbed's users are its own test accounts: a race that swaps it for a symlink in
        between is not guarded against, as it would be in a server); a symlink stays root's, since sftp's
        setstat follows links."""
        uid, gid = self._identity()
        self._become(0, 0, [])  # __call__ takes root's identity back after the request in any case
        if isinstance(target, int):
            os.fchown(target, uid, gid)
        else:
            os.chown(target, uid, gid, follow_symlinks=False)

    # ---------------------------------------------------------------- metadata

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        st = os.lstat(self._path(path))
        return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid, "st_gid": st.st_gid,
                "st_size": st.st_size, "st_blocks": st.st_blocks, "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._path(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                  "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._path(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._path(path), uid, gid, follow_symlinks=False)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        if times is None:
            os.utime(self._path(path))
        else:
            os.utime(self._path(path), ns=times, follow_symlinks=False)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        if fh:  # the open file's (fusepy's raw file info)
            os.ftruncate(fh.fh, length)
        else:
            os.truncate(self._path(path), length)

    # ---------------------------------------------------------------- names

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._path(path), mode)
        self._give(self._path(path))

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._path(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._path(old), self._path(new))

    def symlink(self, target: str, source: str) -> None:  # fusepy's order: the link's path, then what it names
        os.symlink(source, self._path(target))

    def link(self, target: str, source: str) -> None:
        os.link(self._path(source), self._path(target))

    def mknod(self, path: str, mode: int, dev: int) -> None:
        os.mknod(self._path(path), mode, dev)
        self._give(self._path(path))

    # ---------------------------------------------------------------- contents

    # Files are opened with direct I/O (no page cache on this host: every read goes to the head): sftp gives
    # times in whole seconds, so a host's cache of a file another host rewrote within the same second would be
    # taken for current (SQLite's dot-file locked store lost writes between login hosts so). NFS revalidates
    # its cache on open with a finer change attribute.
    def open(self, path: str, fi: Any) -> int:
        fi.fh = os.open(self._path(path), fi.flags)
        fi.direct_io = 1
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        fi.fh = os.open(self._path(path), os.O_RDWR | os.O_CREAT, mode)
        fi.direct_io = 1
        self._give(fi.fh)
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        return os.pread(fi.fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        return os.pwrite(fi.fh, data, offset)

    def flush(self, path: str, fi: Any) -> None:
        # A close(2) of the caller's: closing a copy of the file below makes sshfs send what it holds (close-to-
        # open, as NFS gives it); the file itself closes at release, which the kernel does not wait for.
        os.close(os.dup(fi.fh))

    def fsync(self, path: str, datasync: int, fi: Any) -> None:
        if datasync:
            os.fdatasync(fi.fh)
        else:
            os.fsync(fi.fh)

    def release(self, path: str, fi: Any) -> None:
        os.close(fi.fh)

    def _identity(self) -> tuple[int, int]:
        """The file-system uid and gid this request runs under (the caller's, or nobody's)."""
        uid, gid, _ = fuse_get_context()
        return (NOBODY, NOGROUP) if uid == 0 else (uid, gid)


def main() -> None:
    lower, mountpoint, pidfile = sys.argv[1:4]
    os.umask(0)  # the kernel applied the caller's umask already
    os.chdir("/")

    class Mounted(RootSquash):
        def init(self, path: str) -> None:  # called once the mount is in place
            with open(pidfile, "w", encoding="ascii") as out:
                out.write(f"{os.getpid()}\n")

    FUSE(Mounted(lower), mountpoint, raw_fi=True, foreground=True, nothreads=True, allow_other=True,
         default_permissions=True,
         fsname=f"root@head:{os.path.basename(lower)}", subtype="sshfs", attr_timeout=0, entry_timeout=0,
         negative_timeout=0, nonempty=True)  # over the head's disk, which the machine shares


if __name__ == "__main__":
    main()
