"""Unit tests (stateful fake Slurm, fake clock, SQLite in tmp_path): the agent store's upgrade from the old schema.

tests/unit/fixtures/agent_db_v1.sql is the DDL main's agent_store.py wrote
(keyed by dlsub id). A database in that shape, with a move in flight,
opens after the upgrade and the move finishes.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from agent_world import ME, NOW, World

from dlsub.agent.agent_store import AgentStore, JobRow
from dlsub.agent.reconcile import Agent
from dlsub.contract import IllegalTransition

FIXTURE = Path(__file__).parent / "fixtures" / "agent_db_v1.sql"


def old_database(path: Path, job_id: int, job_dir: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text())
    conn.execute("insert into jobs values (?, 'alice', ?, ?, 'immediate', 'gpu', 1, ?, ?, 'RUNNING', 'cpu', 0, "
                 "NULL, NULL, NULL)", ("0123abcd", job_id, str(job_dir), NOW - 100, NOW - 10))
    conn.execute("insert into attempts values (?, 0, '0123abcd', 'cpu', 'cpu1', ?, ?, 'RUNNING')",
                 (job_id, NOW - 100, NOW - 600))
    conn.execute("insert into progress values ('0123abcd', ?, 20, 100.0, 1.0, 18, 'cpu')", (NOW - 10,))
    conn.execute("insert into decisions (time, dlsub_id, slurm_job_id, user, kind, reason, details) "
                 "values (?, '0123abcd', ?, 'alice', 'move', 'moving to gpu', '{}')", (NOW - 10, job_id))
    conn.execute("insert into moves values ('0123abcd', ?, 'move', 'signalled', 'gpu', 1, ?, 1, ?, NULL)",
                 (job_id, NOW - 10, NOW - 10))
    conn.execute("insert into meta values ('pid', '4242')")
    conn.commit()
    conn.close()


def test_an_old_database_with_a_move_in_flight_is_migrated_and_the_move_finishes(tmp_path: Path) -> None:
    w = World(tmp_path)
    job_id, job_dir = w.submit("0123abcd")
    w.progress(job_dir, job_id)
    old_database(w.db, job_id, job_dir)
    # The old agent signalled; the job checkpointed and requeued held while the agent was being upgraded.
    w.batch_script_moves(job_dir, job_id)
    store = AgentStore(w.db, uid_of=lambda name: ME if name == "alice" else None)
    assert store.meta()["pid"] == 4242
    [move] = store.moves()
    assert (move["uid"], move["dlsub_id"], move["slurm_job_id"], move["phase"]) == (ME, "0123abcd", job_id, "signalled")
    assert {k: b.uid for k, b in store.bindings().items()} == {"0123abcd": ME}
    assert [(d.uid, d.kind) for d in store.decisions("0123abcd")] == [(ME, "move")]
    assert len(store.progress(ME, job_id)) == 1
    agent = Agent(w.client, store, w.policy)
    assert [a.kind for a in agent.tick(NOW)] == ["retarget", "release"]
    assert store.move(ME, job_id)["restart_count"] == 0, "adopted from Slurm"
    w.fake.start(job_id, "gpu1", int(NOW + 1))
    assert [a.kind for a in agent.tick(NOW + 5)] == ["finish-move"]
    assert store.moves() == [] and w.fake.jobs[job_id].restart_cnt == 1
    # Opening it again changes nothing.
    again = AgentStore(w.db)
    assert [d.kind for d in again.decisions("0123abcd")] == ["move", "move-done"]
    tables = {r[0] for r in again.conn.execute("select name from sqlite_master where type = 'table'")}
    assert not [t for t in tables if t.startswith("v1_")]


def test_the_store_refuses_illegal_state_transitions() -> None:
    row = JobRow(ME, 1, "0123abcd", "alice", None)
    row.set_state("PENDING")
    row.set_state("RUNNING")
    row.set_state("COMPLETED")
    with pytest.raises(IllegalTransition):
        row.set_state("PENDING")
    assert row.state == "COMPLETED"


def test_rows_round_trip_through_one_transaction(tmp_path: Path) -> None:
    from dlsub.agent.agent_store import Writes

    store = AgentStore(tmp_path / "a.db")
    w = Writes()
    w.jobs[(ME, 5)] = JobRow(ME, 5, "0123abcd", "alice", "RUNNING", {"x": [1, 2]})
    w.decide(NOW, ME, "0123abcd", 5, "alice", "wait", "why", {"k": 1})
    w.meta["late"] = False
    store.write(w)
    assert store.job(ME, 5).data == {"x": [1, 2]} and store.decisions(uid=ME)[0].details == {"k": 1}
    assert json.dumps(store.meta()) == '{"late": false}'


def test_a_resize_written_ahead_before_grows_had_a_node_is_read_back(tmp_path: Path) -> None:
    """SQLite only: a resizes table from before grows were pinned (no node column) gains the column, and its
    row comes back with no node (the grow then goes where Slurm likes, as it did)."""
    path = tmp_path / "agent.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE resizes (worker TEXT PRIMARY KEY, uid INTEGER NOT NULL, dlsub_id TEXT, "
                 "slurm_job_id INTEGER, kind TEXT, phase TEXT, since REAL, reason TEXT, partition TEXT, "
                 "batch_size INTEGER, accumulation_steps INTEGER)")
    conn.execute("insert into resizes values ('900_1', 1001, '0123abcd', 901, 'grow', 'planned', ?, 'r', 'gpu', "
                 "NULL, NULL)", (NOW,))
    conn.commit()
    conn.close()
    (row,) = AgentStore(path).resizes().values()
    assert (row.worker, row.kind, row.node) == ("900_1", "grow", None)
