"""Unit (real SQLite files; no Slurm): the user's job store, read and written with the standard library's sqlite3,
sqlite-utils only making or extending its table."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from dlsub.contract import IllegalTransition, JobState
from dlsub.job.user_store import JobRecord, JobStore, UnknownJob


def record(job_id: str, slurm_job_id: int) -> JobRecord:
    return JobRecord(job_id, "train", "alice", "/home/alice/my 'train'; x.py", ["--lr", "0.1"], f"/j/{job_id}",
                     "cpu", 0, 1, 2, 700, None, "img", slurm_job_id=slurm_job_id, submitted_at=float(slurm_job_id),
                     mounts=[{"source": "/data", "target": "/data", "read_only": True}])


def test_records_go_in_and_come_back_whole(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "dlsub.db")
    store.add(record("0123abcd", 7))
    store.add(record("4567ef01", 8))
    assert store.get("0123abcd") == record("0123abcd", 7)
    assert store.get("8").id == "4567ef01" and store.get("4567e").id == "4567ef01"
    assert [r.id for r in store.all()] == ["0123abcd", "4567ef01"]
    store.update("0123abcd", cancelled_at=5.0, slurm_job_id=9)
    assert store.get("9").cancelled_at == 5.0
    assert store.observe("0123abcd", JobState.RUNNING, now=1.0) == JobState.RUNNING
    assert store.observe("0123abcd", JobState.COMPLETED, now=2.0) == JobState.COMPLETED
    with pytest.raises(IllegalTransition):
        store.observe("0123abcd", JobState.UNKNOWN)
    assert store.observed("0123abcd", JobState.UNKNOWN) == JobState.COMPLETED, "a final state stands"
    store.remove("0123abcd")
    with pytest.raises(UnknownJob):
        store.get("0123abcd")
    with pytest.raises(UnknownJob):
        store.update("0123abcd", cancelled_at=1.0)
    with pytest.raises(ValueError, match="no such field"):
        store.update("4567ef01", **{"name = 'x', id": "y"})  # a field name is never SQL
    assert (tmp_path / "dlsub.db").stat().st_mode & 0o777 == 0o600


def test_a_store_of_the_first_schema_gains_the_columns_added_since(tmp_path: Path) -> None:
    path = tmp_path / "dlsub.db"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, user TEXT, script TEXT, args TEXT, job_dir TEXT, "
                "partition TEXT, gpus_per_node INTEGER, nodes INTEGER, cpus INTEGER, mem_mb INTEGER, "
                "time_limit_min INTEGER, image TEXT, slurm_job_id INTEGER, submitted_at FLOAT, cancelled_at FLOAT)")
    old.execute("INSERT INTO jobs VALUES ('0ldj0b00', 't', 'alice', 't.py', ?, '/j', 'cpu', 0, 1, 2, 700, NULL, "
                "'img', 3, 1.0, NULL)", [json.dumps(["-x"])])
    old.commit()
    old.close()
    store = JobStore(path)
    kept = store.get("0ldj0b00")
    assert kept.args == ["-x"] and kept.state is None and kept.mounts == [] and kept.image_id is None
    store.observe("0ldj0b00", JobState.PENDING)
    assert JobStore(path).get("3").state == JobState.PENDING.value


def test_opening_a_made_store_imports_no_sqlite_utils(tmp_path: Path) -> None:
    """Every dlsub command opens the store: sqlite-utils' import (and NumPy's, which it loads) is only for making
    or extending the table."""
    JobStore(tmp_path / "dlsub.db").add(record("0123abcd", 7))
    code = ("import sys; from pathlib import Path; from dlsub.job.user_store import JobStore; "
            f"print(JobStore(Path({str(tmp_path / 'dlsub.db')!r})).get('7').id, 'sqlite_utils' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["0123abcd", "False"], done.stdout + done.stderr
