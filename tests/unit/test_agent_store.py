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

from dlsub.agent.agent_store import AgentStore
from dlsub.agent.job_data import JobData, TrustedRequest
from dlsub.agent.reconcile import Agent
from dlsub.agent.store_rows import JobRow
from dlsub.contract import IllegalTransition, JobState
from dlsub.jobdir import Cursor

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


def test_the_store_takes_skipped_states_and_keeps_a_final_one_from_unknown() -> None:
    row = JobRow(ME, 1, "0123abcd", "alice", None)
    row.set_state("PENDING")
    row.set_state("COMPLETED")  # it ran between two ticks
    with pytest.raises(IllegalTransition):
        row.set_state("UNKNOWN")
    assert row.state == "COMPLETED"
    row.set_state("PENDING")  # slurmctld lists it again: scontrol requeue of an ended job
    assert row.state == "PENDING"


def test_rows_round_trip_through_one_transaction(tmp_path: Path) -> None:
    from dlsub.agent.store_rows import Writes

    store = AgentStore(tmp_path / "a.db")
    w = Writes()
    data = JobData(last_note="why", said={"files": "unreadable"}, continuations=2, sample=(20, 18, 1))
    w.jobs[(ME, 5)] = JobRow(ME, 5, "0123abcd", "alice", JobState.RUNNING, data)
    w.record_decision(NOW, ME, "0123abcd", 5, "alice", "wait", "why", {"k": 1})
    w.meta["late"] = False
    store.write(w)
    assert store.job(ME, 5).data == data and store.decisions(uid=ME)[0].details == {"k": 1}
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


# A job's row as the agent wrote it before its data was a typed record (``data`` as the tick left it,
# keys sorted): every key it kept. Written by main at 4145d6a (a tick of tests/unit/agent_world.py's
# World, with a continuation, a backfill and a said reason added by hand).
_OLD_ROW = (
    '{"attempt_seen":0,"attempts":{"bad_events":0,"last_end_action":"move","last_end_restart":0,"requeues":0,'
    '"slurm_job_id":1001},"backfilled_from":"gpu","backfilled_limit_min":30,"continuations":1,'
    '"files":{"attempts.jsonl":{"dev":65024,"ino":2147286,"offset":103,"skipping":false},'
    '"progress.jsonl":null},"job_dir":"/home/alice/0123abcd","last_note":"not moved to gpu",'
    '"partition":"gpu","progress":{"application":null,"bad_events":0,"batch_limits":null,"checkpoint_step":18,'
    '"checkpoint_time":1799999988.0,"checkpoints":1,"finished":false,"first_time":1799999400.0,"grads":null,'
    '"last":{"attempt":"1001-0","step":20,"time":1799999990.0,"total_steps":1000},"latest_time":1799999990.0,'
    '"measured":{"1,1,0,0":[1.0,null]},"segment":{"points":[{"step":10,"time":1799999980.0},'
    '{"step":20,"time":1799999990.0}],"size":[1,1],"split":[0,0]},"window":[{"step":10,"time":1799999980.0},'
    '{"step":20,"time":1799999990.0}]},"request":{"dlsub_id":"0123abcd","gpus":1,"ideal":"gpu",'
    '"mode":"immediate","nodes":[1,3],"partition":"cpu","role":"main","source":"record","step":2,'
    '"time_limit_min":30},"said":{"dropped":"read in part"},"sample":[20,18,1]}')


def test_a_job_row_written_before_the_typed_record_loads_and_is_written_back_the_same(tmp_path: Path) -> None:
    """Unit test, SQLite only: an agent store a user upgrades keeps its rows. Each of the keys the old
    ``data`` dictionary held reads into its field, and the record is written back as the same JSON (plus
    the fields added since, derived from what it held)."""
    store = AgentStore(tmp_path / "agent.db")
    store.conn.execute("insert into jobs values (?, 1001, '0123abcd', 'alice', 'RUNNING', ?)", (ME, _OLD_ROW))
    store.conn.execute("insert into jobs values (?, 1002, '0badc0de', 'mallory', 'PENDING', '{\"ignored\":true}')",
                       (ME,))
    rows = AgentStore(tmp_path / "agent.db").jobs()
    data = rows[(ME, 1001)].data
    assert data.request == TrustedRequest("record", "0123abcd", "immediate", "gpu", 1, "cpu", 30, "main", (1, 3), 2)
    assert data.job_dir == "/home/alice/0123abcd" and data.job_dir_fixed and not data.ignored
    assert data.files == {"attempts.jsonl": Cursor(65024, 2147286, 103), "progress.jsonl": None}
    assert data.progress is not None and data.progress.progress().step == 20 and data.progress.checkpoints == 1
    assert data.attempts is not None and data.attempts.last_end_action == "move"
    assert data.attempts_summary(1001) == data.attempts and data.attempts_summary(7).last_end_action is None
    assert (data.said, data.last_note, data.partition, data.attempt_seen, data.sample) == (
        {"dropped": "read in part"}, "not moved to gpu", "gpu", 0, (20, 18, 1))
    assert (data.continuations, data.backfilled_from, data.backfilled_limit_min) == (1, "gpu", 30)
    # Written back the same, but for what later summaries keep: a progress summary folded before it kept
    # whether the training wrote its start event had one, since it had events (its first_time); whether that
    # start said it saves on request is not known, so it did not (a framework adapter's job is then moved only
    # once it has checkpointed, as any job was); nor the kind of GPU it ran on (none: untyped, as all were);
    # nor its starts (none counted: its restarts count from the next start on).
    assert data.progress.started and not data.progress.saves_on_request and data.progress.gpu_type is None
    assert data.progress.starts == 0
    old = json.loads(_OLD_ROW)
    assert json.loads(data.to_json()) == {**old, "progress": {**old["progress"], "started": True,
                                                              "saves_on_request": False, "gpu_type": None,
                                                              "starts": 0}}
    assert rows[(ME, 1002)].data == JobData(ignored=True) and rows[(ME, 1002)].state == JobState.PENDING


def test_a_job_dir_looked_for_and_not_found_stays_not_found() -> None:
    """Unit test: a row whose job directory was looked for at first sight and not found (null) is not
    looked for again; one never looked for (no key) is."""
    assert JobData.from_json('{"job_dir":null}').job_dir_fixed
    assert not JobData.from_json("{}").job_dir_fixed
    assert JobData.from_json('{"job_dir":null}').to_json() == '{"job_dir":null}'


def test_a_damaged_data_column_reads_as_empty_values_not_an_error() -> None:
    """Unit test: wrong types read as the field's empty value; keys no field names are passed over; a
    migrated request (no dlsub id) keeps its partition and time limit."""
    data = JobData.from_json('{"continuations":"x","said":[1],"sample":[1],"request":{"nodes":"?"},"x":1}')
    assert data == JobData()
    assert JobData.from_json("not json") == JobData()
    migrated = JobData.from_json('{"request":{"source":"migrated","partition":"cpu","time_limit_min":60}}')
    assert migrated.request is not None and not migrated.request.dlsub_id
    assert (migrated.request.partition, migrated.request.time_limit_min) == ("cpu", 60)


def test_the_records_in_flight_are_the_columns_of_their_tables(tmp_path: Path) -> None:
    """Unit test, SQLite only: the moves and resizes tables have a column for each field of their records,
    in order (the columns are derived from the records), and what the move rules see of a move is a part
    of its row (every MoveView field is a MoveRow field of the same name)."""
    from dataclasses import fields

    from dlsub.agent.records import MOVE_COLUMNS, RESIZE_COLUMNS, MoveRow
    from dlsub.policies.actions.move_views import MoveView

    store = AgentStore(tmp_path / "agent.db")
    columns = [r[1] for r in store.conn.execute('pragma table_info("moves")')]
    assert tuple(columns) == MOVE_COLUMNS
    assert set(store._columns("resizes")) == set(RESIZE_COLUMNS)
    assert {f.name for f in fields(MoveView)} <= {f.name for f in fields(MoveRow)}
