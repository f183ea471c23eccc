"""Unit (mount tables given as text, and this host's own; a real SQLite file): which file system a path is
on, and the job store's journal there: WAL on a local disk, the rollback journal on a network file system,
whose hosts do not share WAL's memory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlsub.job import filesystems, user_store
from dlsub.job.filesystems import filesystem_type, on_network_filesystem

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
