"""Unit (mount tables given as text, and this host's own; real SQLite files, written by processes of their own):
which file system a path is on, and the job store's journal there: WAL on a local disk, the rollback journal
on a network file system, whose hosts do not share WAL's memory; and its locks: SQLite's dot-file lock where
one host's locks are not seen by the others (sshfs; NFS mounted nolock or local_lock)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from dlsub.job import filesystems, user_store
from dlsub.job.filesystems import filesystem_type, locks_shared_between_hosts, on_network_filesystem
from dlsub.job.user_store import JobRecord

# A login node's table, as /proc/self/mountinfo writes it: root on ext4, homes over NFS, a scratch on Lustre
# mounted below them, a path with a space (octal escape), and /home/bob stacked twice (the last one counts).
MOUNTS = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
40 22 0:45 / /home rw,relatime shared:20 - nfs4 nas:/export/home rw,vers=4.2
41 40 0:46 / /home/alice/scratch rw shared:21 - lustre 10.0.0.1@tcp:/fs rw
42 22 0:47 / /data\\040sets rw shared:22 - nfs nas:/data rw
43 40 0:48 / /home/bob rw shared:23 - ext4 /dev/vdb rw
44 40 0:49 / /home/bob rw shared:24 - fuse.sshfs head:/home/bob rw
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/", "ext4"), ("/tmp/x", "ext4"), ("/home", "nfs4"), ("/home/alice/.dlsub/dlsub.db", "nfs4"),
    ("/home/alice/scratch/run", "lustre"), ("/home/alicex", "nfs4"), ("/data sets/a", "nfs"),
    ("/data/a", "ext4"), ("/home/bob/.dlsub", "fuse.sshfs"),
])
def test_the_longest_mount_point_above_a_path_names_its_file_system(path: str, kind: str) -> None:
    assert filesystem_type(Path(path), MOUNTS) == kind


def test_this_hosts_own_table_is_read_and_an_unreadable_one_says_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert filesystem_type(tmp_path) is not None
    monkeypatch.setattr(filesystems, "MOUNTINFO", tmp_path / "no-such-table")
    assert filesystem_type(tmp_path) is None and not on_network_filesystem(tmp_path)


def test_the_job_store_keeps_wal_on_a_local_disk_and_a_rollback_journal_on_a_network_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = user_store.JobStore(tmp_path / "local" / "dlsub.db")
    assert local.journal == "wal"
    local.close()
    table = f"22 1 254:1 / / rw - ext4 /dev/vda1 rw\n40 22 0:45 / {tmp_path / 'home'} rw - nfs4 nas:/home rw\n"
    monkeypatch.setattr(filesystems, "MOUNTINFO", tmp_path / "mountinfo")
    (tmp_path / "mountinfo").write_text(table)
    shared = user_store.JobStore(tmp_path / "home" / ".dlsub" / "dlsub.db")
    assert shared.journal == "delete"
    shared.close()
    with sqlite3.connect(tmp_path / "home" / ".dlsub" / "dlsub.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete", "what the file itself records"
    # A store made in WAL before (the same home, not yet seen as shared) turns to the rollback journal.
    (tmp_path / "mountinfo").write_text(table.replace(str(tmp_path / "home"), str(tmp_path / "local")))
    again = user_store.JobStore(tmp_path / "local" / "dlsub.db")
    assert again.journal == "delete"
    again.close()
    with sqlite3.connect(tmp_path / "local" / "dlsub.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.parametrize(("table", "shared"), [
    ("40 22 0:45 / {home} rw - ext4 /dev/vdb rw", True),
    ("40 22 0:45 / {home} rw - nfs4 nas:/home rw,vers=4.2,local_lock=none", True),
    ("40 22 0:45 / {home} rw - nfs nas:/home rw,vers=3,nolock", False),
    ("40 22 0:45 / {home} rw - nfs4 nas:/home rw,vers=4.2,local_lock=all", False),
    ("40 22 0:45 / {home} rw,nosuid - fuse.sshfs head:/home rw,user_id=0", False),
])
def test_whether_a_hosts_locks_are_seen_by_the_others(tmp_path: Path, table: str, shared: bool) -> None:
    mounts = "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n" + table.format(home="/home") + "\n"
    assert locks_shared_between_hosts(Path("/home/alice/.dlsub"), mounts) is shared
    assert locks_shared_between_hosts(Path("/tmp"), mounts), "a local disk: no other host"


#: A login node's command, in a process of its own, on a home whose mount table says sshfs (SFTP has no locks:
#: each host's stay its own): it adds ``count`` jobs to the store, each its own transaction.
WRITER = """
import sys
from pathlib import Path
from dlsub.job import filesystems
filesystems.MOUNTINFO = Path(sys.argv[1])
from dlsub.job.user_store import JobRecord, JobStore
store = JobStore(Path(sys.argv[2]))
assert store.locking == "dotfile", store.locking
for i in range(int(sys.argv[4])):
    store.add(JobRecord(f"{sys.argv[3]}{i:04d}", "t", "alice", "/s.py", [], "/j", "cpu", 0, 1, 1, 100, None, "img",
                        slurm_job_id=int(sys.argv[5]) + i, submitted_at=float(i)))
    store.get(f"{sys.argv[3]}{i:04d}")
"""


def _sshfs_home(tmp_path: Path) -> tuple[Path, Path]:
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 254:1 / / rw - ext4 /dev/vda1 rw\n40 22 0:45 / {tmp_path / 'home'} rw - fuse.sshfs "
                     "head:/home rw\n")
    return table, tmp_path / "home" / ".dlsub" / "dlsub.db"


def test_on_a_home_whose_locks_stay_on_each_host_two_writers_at_once_keep_every_job(tmp_path: Path) -> None:
    """Two commands writing at once, as from login1 and login2 (no lock of one host seen by the other: the
    store then takes SQLite's dot-file lock, a directory every host sees made once): every job of both is
    kept and the file is whole."""
    table, db = _sshfs_home(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(table), str(db), prefix, "60", str(base)],
                                env=env, stderr=subprocess.PIPE, text=True)
               for prefix, base in (("aaaa", 1000), ("bbbb", 2000))]
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stderr.read() if writer.stderr else ""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 120
    assert not db.with_name("dlsub.db.lock").exists(), "no lock left behind"


def test_a_lock_left_by_a_killed_command_is_broken_and_a_live_one_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    table, db = _sshfs_home(tmp_path)
    monkeypatch.setattr(filesystems, "MOUNTINFO", table)
    user_store.JobStore(db).close()
    lock = db.with_name("dlsub.db.lock")
    lock.mkdir()  # what SQLite's dot-file locking leaves when its process is killed holding it
    os.utime(lock, (time.time() - 2 * user_store.STALE_LOCK_S,) * 2)
    store = user_store.JobStore(db)
    assert store.locking == "dotfile" and not lock.exists()
    assert "a lock on the job store left" in capsys.readouterr().err
    store.add(JobRecord("0123abcd", "t", "alice", "/s.py", [], "/j", "cpu", 0, 1, 1, 100, None, "img",
                        slurm_job_id=7, submitted_at=1.0))
    store.close()
    lock.mkdir()  # another command's, just taken: waited for, then the store is busy, never broken
    monkeypatch.setattr(user_store, "BUSY_WAIT_S", 0.2)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        user_store.JobStore(db).get("0123abcd")
    assert lock.exists()
    lock.rmdir()
    assert user_store.JobStore(db).get("0123abcd").id == "0123abcd"


def test_under_dot_file_locking_each_statement_opens_the_store_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host caches what it read of a file until it opens it again (NFS's close-to-open, FUSE's page cache), and
    a dot-file lock makes it read nothing again: a connection kept from one statement to the next read its
    old pages, and two login hosts' submits at once lost one (the live testbed's sshfs home). Each statement
    then has a connection of its own; under POSIX locks (a lock revalidates the cache) one serves them all."""
    table, db = _sshfs_home(tmp_path)
    monkeypatch.setattr(filesystems, "MOUNTINFO", table)
    store = user_store.JobStore(db)
    assert store.locking == "dotfile"
    first = store.conn
    assert store.conn is not first
    store.add(JobRecord("0123abcd", "t", "alice", "/s.py", [], "/j", "cpu", 0, 1, 1, 100, None, "img"))
    assert store.get("0123abcd").id == "0123abcd"
    monkeypatch.undo()
    local = user_store.JobStore(tmp_path / "local.db")
    assert local.locking == "posix" and local.conn is local.conn
