"""Unit tests (no Slurm; a real Unix socket in a temp dir, the in-test stand-in store of
test_query_socket): `dlsub agent status` and `dlsub why` as users run them, and the daemon's private files.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_query_socket import StandInStore

from dlsub.agent.query import QueryServer
from dlsub.cli.agent_commands import agent, why
from dlsub.cli.daemon_commands import agent_lock, make_private
from dlsub.site_config.policy_file import AgentPolicy

KEPT_FIELDS = {"running", "last_tick", "last_tick_age_s", "doing", "moves_in_flight", "last_error"}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # No agent database anyone could read directly, and an empty user store.
    monkeypatch.setenv("DLSUB_AGENT_DB", str(tmp_path / "nowhere" / "agent.db"))
    monkeypatch.setenv("DLSUB_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def served(env: Path) -> Iterator[Path]:
    with QueryServer(env / "run" / "agent.sock", StandInStore, AgentPolicy(), service_uid=-1) as server:
        yield server.path


def test_status_without_an_agent_exits_3_with_the_kept_fields(env: Path) -> None:
    result = CliRunner().invoke(agent, ["status", "--json", "--socket", str(env / "none.sock")])
    assert result.exit_code == 3
    info = json.loads(result.stdout)
    assert set(info) >= KEPT_FIELDS and info["running"] is False and "not running" in info["error"]
    text = CliRunner().invoke(agent, ["status", "--socket", str(env / "none.sock")])
    assert text.exit_code == 3 and "not running" in text.stdout


def test_status_through_the_socket(served: Path) -> None:
    result = CliRunner().invoke(agent, ["status", "--json", "--socket", str(served)])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert set(info) >= KEPT_FIELDS | {"late", "tick_deadline_s"} and info["running"] is True
    text = CliRunner().invoke(agent, ["status", "--socket", str(served)])
    assert "running (pid 1 on h)" in text.stdout and "last tick" in text.stdout


def test_why_asks_the_agent_by_dlsub_id_or_slurm_id(served: Path) -> None:
    by_id = CliRunner().invoke(why, ["feedbeef", "--json", "--socket", str(served)])
    assert by_id.exit_code == 0, by_id.output
    by_slurm_id = CliRunner().invoke(why, ["42", "--socket", str(served)])
    assert by_slurm_id.exit_code == 0 and "nobody's own job" in by_slurm_id.stdout
    if os.geteuid() == 0:  # root sees all
        assert [d["reason"] for d in json.loads(by_id.stdout)] == ["nobody's own job"]


def test_why_refuses_what_is_no_job(served: Path) -> None:
    result = CliRunner().invoke(why, ["../../etc/passwd", "--socket", str(served)])
    assert result.exit_code == 2 and "unknown job" in result.output


def test_why_without_an_agent_says_so(env: Path) -> None:
    result = CliRunner().invoke(why, ["feedbeef", "--socket", str(env / "none.sock")])
    assert result.exit_code == 3 and "not running" in result.output


def test_the_daemons_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    db = tmp_path / "state" / "agent.db"
    old = os.umask(0o022)
    try:
        with agent_lock(db) as lock:
            assert lock is not None
            with agent_lock(db) as second:
                assert second is None, "one agent per database"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").write_text("")
            os.chmod(f"{db}{suffix}", 0o644)
        make_private(db)
    finally:
        os.umask(old)
    for suffix in ("", "-wal", "-shm", ".lock"):
        assert stat.S_IMODE(Path(f"{db}{suffix}").stat().st_mode) == 0o600, suffix


def test_why_finds_a_job_whose_dlsub_id_is_all_decimal_digits_or_the_slurm_job_of_that_number(env: Path) -> None:
    """Eight decimal digits are both a dlsub id and a Slurm job id: `dlsub why` finds whichever was decided on
    (a real AgentStore read directly, as the service account does with --db)."""
    from dlsub.agent.agent_store import AgentStore
    from dlsub.agent.store_rows import Writes

    db = env / "agent.db"
    store = AgentStore(db)
    writes = Writes()
    writes.record_decision(1.0, 1000, "35566508", 7, "alice", "signal-continue", "time limit on gpu-dev ends in 30 s")
    writes.record_decision(2.0, 1000, "0123abcd", 12345678, "alice", "move", "gpu partition idle")
    store.write(writes)
    by_dlsub_id = CliRunner().invoke(why, ["35566508", "--db", str(db)])
    assert by_dlsub_id.exit_code == 0 and "time limit on gpu-dev" in by_dlsub_id.stdout, by_dlsub_id.output
    by_slurm_id = CliRunner().invoke(why, ["12345678", "--db", str(db)])
    assert by_slurm_id.exit_code == 0 and "gpu partition idle" in by_slurm_id.stdout, by_slurm_id.output


def test_new_dlsub_ids_are_never_all_decimal_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from dlsub.contract import DLSUB_ID
    from dlsub.job import submit

    fresh = iter([uuid.UUID("12345678" + "0" * 24), uuid.UUID("1234567a" + "0" * 24)])
    monkeypatch.setattr(submit.uuid, "uuid4", lambda: next(fresh))
    made = submit.new_dlsub_id()
    assert made == "1234567a" and DLSUB_ID.match(made)
