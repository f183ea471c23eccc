"""Unit tests (no Slurm; a real Unix socket in a temp dir): the agent's query channel.

The agent's store is a small in-test stand-in with the interface the keyed
agent store has (``decisions(dlsub_id, slurm_job_id, uid)``, ``Decision.uid``,
``moves`` rows with ``uid``). Peer credentials are the kernel's: tests that
need a second uid connect from a child process running as ``nobody`` when
they run as root, and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_HANG_S

from dlsub.agent.query import Caller, QueryServer, agent_status, answer
from dlsub.job.agent_client import ask
from dlsub.site_config.policy_file import AgentPolicy

NOBODY = 65534
ALICE = 4242  # owns the jobs below; nobody the tests connect as


@dataclass(frozen=True)
class Decision:
    time: float
    uid: int
    dlsub_id: str
    slurm_job_id: int | None
    user: str
    kind: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


class StandInStore:
    """The keyed agent store's read interface, in memory."""

    def __init__(self) -> None:
        self.rows = [
            Decision(100.0, ALICE, "0123abcd", 41, "alice", "move", "moving to gpu: alice's secret"),
            Decision(101.0, NOBODY, "feedbeef", 42, "nobody", "observe", "nobody's own job"),
        ]
        self.moving = [{"uid": ALICE, "dlsub_id": "0123abcd", "slurm_job_id": 41, "kind": "move",
                        "phase": "signalled", "target_partition": "gpu", "target_gpus": 1}]
        self.slow = threading.Event()  # set: meta() takes a while, as under a slow disk

    def meta(self) -> dict[str, Any]:
        if self.slow.is_set():
            time.sleep(0.3)
        return {"pid": 1, "host": "h", "policy": "fifo", "last_tick": time.time() - 5, "doing": "idle",
                "tick_interval_s": 30, "tick_deadline_s": 20}

    def moves(self) -> list[dict[str, Any]]:
        return list(self.moving)

    def lease(self) -> None:
        return None  # one host's agent

    def decisions(self, dlsub_id: str | None = None, slurm_job_id: int | None = None,
                  uid: int | None = None) -> list[Decision]:
        return [d for d in self.rows if (dlsub_id is None or d.dlsub_id == dlsub_id)
                and (slurm_job_id is None or d.slurm_job_id == slurm_job_id) and (uid is None or d.uid == uid)]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory every uid can reach (pytest's tmp_path is the test user's only)."""
    path = Path(tempfile.mkdtemp(prefix="dlsub-query-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def store() -> StandInStore:
    return StandInStore()


@pytest.fixture
def server(sock_dir: Path, store: StandInStore) -> Iterator[QueryServer]:
    with QueryServer(sock_dir / "run" / "agent.sock", lambda: store, AgentPolicy(), read_timeout_s=1.0,
                     max_clients=4, max_clients_per_uid=2, service_uid=-1) as srv:
        yield srv


CLIENT = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.decode())
"""


def ask_as(uid: int, path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Ask from a process running as ``uid`` (root only can start one)."""
    if os.geteuid() != 0:
        pytest.skip("connecting as another uid needs root")
    out = subprocess.run([sys.executable, "-I", "-c", CLIENT, str(path), json.dumps(request)], user=uid,
                         capture_output=True, text=True, timeout=NO_HANG_S, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_socket_is_open_to_all_in_a_directory_only_the_agent_writes(server: QueryServer) -> None:
    assert oct(server.path.stat().st_mode & 0o777) == "0o666"
    assert oct(server.path.parent.stat().st_mode & 0o777) == "0o755"


def test_server_sees_the_connecting_uid(server: QueryServer) -> None:
    me = ask(server.path, {"op": "status"})
    assert me["ok"] and me["you"]["uid"] == os.geteuid()
    if os.geteuid() == 0:
        other = ask_as(NOBODY, server.path, {"op": "status"})
        assert other["you"] == {"uid": NOBODY, "user": "nobody", "admin": False, "via": "socket"}


def test_another_uid_gets_nothing_about_a_job_it_does_not_own(server: QueryServer) -> None:
    by_id = ask_as(NOBODY, server.path, {"op": "why", "dlsub_id": "0123abcd"})
    by_slurm_id = ask_as(NOBODY, server.path, {"op": "why", "slurm_job_id": 41})
    assert by_id == {**by_id, "ok": True, "decisions": []} and by_slurm_id["decisions"] == []
    assert "secret" not in json.dumps([by_id, by_slurm_id])
    own = ask_as(NOBODY, server.path, {"op": "why", "slurm_job_id": 42})
    assert [d["reason"] for d in own["decisions"]] == ["nobody's own job"]
    status = ask_as(NOBODY, server.path, {"op": "status"})["status"]
    assert status["moves_in_flight"] == [], "another user's move is not shown"
    # Root sees every job.
    assert [d["uid"] for d in ask(server.path, {"op": "why", "dlsub_id": "0123abcd"})["decisions"]] == [ALICE]


def test_answers_filter_by_uid_and_admins_see_all(store: StandInStore) -> None:
    policy = AgentPolicy(admins=("carol",))
    bob = Caller(NOBODY, "bob", admin=False)
    assert answer({"op": "why", "dlsub_id": "0123abcd"}, bob, store, policy, 0)["decisions"] == []
    assert answer({"op": "why", "slurm_job_id": 41}, bob, store, policy, 0)["decisions"] == []
    assert answer({"op": "status"}, bob, store, policy, 0)["status"]["moves_in_flight"] == []
    carol = Caller.of(0, policy, service_uid=-1)
    assert carol.admin  # root
    assert len(answer({"op": "why", "slurm_job_id": 41}, carol, store, policy, 0)["decisions"]) == 1
    # A store that forgot to filter still leaks nothing: the answer filters again.
    store.decisions = lambda **kw: list(store.rows)  # type: ignore[method-assign]
    assert [d["uid"] for d in answer({"op": "why", "dlsub_id": "feedbeef"}, bob, store, policy, 0)["decisions"]] \
        == [NOBODY]


@pytest.mark.parametrize("request_, error", [
    ([1, 2], "one JSON object"),
    ({"op": "drop tables"}, "unknown op"),
    ({"op": "why"}, "give dlsub_id or slurm_job_id"),
    ({"op": "why", "dlsub_id": "../../etc"}, "8 hex digits"),
    ({"op": "why", "slurm_job_id": True}, "positive integer"),
    ({"op": "why", "slurm_job_id": "41"}, "positive integer"),
    ({"op": "why", "slurm_job_id": -1}, "positive integer"),
])
def test_bad_requests_get_a_clear_error(store: StandInStore, request_: Any, error: str) -> None:
    reply = answer(request_, Caller(NOBODY, "bob", False), store, AgentPolicy(), 0)
    assert reply["ok"] is False and error in reply["error"]


def _raw(path: Path, payload: bytes, *, close_write: bool = False) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    try:
        s.sendall(payload)
    except BrokenPipeError:
        pass  # refused before we wrote: the reason is waiting to be read
    if close_write:
        s.shutdown(socket.SHUT_WR)
    return s


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return data


def test_oversized_request_is_dropped_and_others_are_served(server: QueryServer) -> None:
    big = _raw(server.path, b"x" * 100_000)
    try:
        reply = _read_all(big)
    except ConnectionResetError:
        reply = b""  # dropped with the rest of its bytes unread: the kernel resets, as it should
    assert reply == b"" or b"larger than" in reply
    assert ask(server.path, {"op": "status"})["ok"]


@pytest.mark.wall_clock
def test_unfinished_request_does_not_stall_another_client(server: QueryServer) -> None:
    stuck = [_raw(server.path, b'{"op": "stat')]  # never finished (this uid may hold 2 connections)
    started = time.monotonic()
    assert ask(server.path, {"op": "status"})["ok"]
    assert time.monotonic() - started < 0.5, "answered while the other requests hang"
    # The unfinished ones are dropped at the read deadline.
    for s in stuck:
        assert b"not finished in time" in _read_all(s)


@pytest.mark.wall_clock
def test_bounded_connections_refuse_quickly_and_recover(server: QueryServer, store: StandInStore) -> None:
    # This uid may hold 2 connections at once: a third is refused at once, not queued.
    stuck = [_raw(server.path, b"{") for _ in range(2)]
    deadline = time.monotonic() + 5
    while server._active.get(os.geteuid(), 0) < 2:  # both taken up by the server, not just connected
        assert time.monotonic() < deadline, "the server did not take the two connections up"
        time.sleep(0.005)
    started = time.monotonic()
    refused = json.loads(_read_all(_raw(server.path, b"")))
    assert refused["ok"] is False and "busy" in refused["error"] and time.monotonic() - started < 0.5
    for s in stuck:
        _read_all(s)
    assert ask(server.path, {"op": "status"})["ok"], "slots come back when the stuck clients are dropped"


def test_garbage_and_half_closed_requests_do_not_crash_the_server(server: QueryServer) -> None:
    assert json.loads(_read_all(_raw(server.path, b"\xff\xfe not json\n")))["ok"] is False
    assert json.loads(_read_all(_raw(server.path, b'{"op": "status"}', close_write=True)))["ok"] is True
    _raw(server.path, b"").close()  # connect and leave
    assert ask(server.path, {"op": "why", "dlsub_id": "feedbeef"})["ok"]


def test_a_slow_store_answer_does_not_block_accepting(server: QueryServer, store: StandInStore) -> None:
    store.slow.set()
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(ask(server.path, {"op": "status"})))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert [r["ok"] for r in results] == [True, True]


def test_a_stale_socket_is_replaced_and_a_live_one_is_not_taken_over(sock_dir: Path, store: StandInStore) -> None:
    path = sock_dir / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # left behind, as by kill -9
    with QueryServer(path, lambda: store, AgentPolicy()) as srv:
        assert ask(path, {"op": "status"})["ok"]
        with pytest.raises(OSError, match="another agent answers"):
            QueryServer(path, lambda: store, AgentPolicy()).start()
        assert srv.path.is_socket()
    assert not path.exists(), "a stopped server removes its socket"


def test_client_reports_an_agent_that_is_not_there(sock_dir: Path) -> None:
    from dlsub.job.agent_client import AgentUnavailable

    with pytest.raises(AgentUnavailable, match="not running"):
        ask(sock_dir / "missing.sock", {"op": "status"})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_dir / "mute.sock"))
    listener.listen(1)  # accepts, never answers: a stuck agent
    try:
        with pytest.raises(AgentUnavailable, match="did not answer"):
            ask(sock_dir / "mute.sock", {"op": "status"}, timeout_s=0.3)
    finally:
        listener.close()


def test_status_is_late_when_no_tick_came_within_interval_plus_deadline() -> None:
    policy = AgentPolicy(tick_interval_s=30, tick_deadline_s=20)
    fresh = agent_status({"last_tick": 1000.0}, [], policy, 1040.0, running=True)
    assert fresh["late"] is False and fresh["last_tick_age_s"] == 40.0
    stale = agent_status({"last_tick": 1000.0}, [], policy, 1051.0, running=True)
    assert stale["late"] is True and stale["overdue"] is True
    hit = agent_status({"last_tick": 1000.0, "late": True}, [], policy, 1001.0, running=True)
    assert hit["late"] is True and hit["last_tick_hit_deadline"] is True
    never = agent_status({"started": 1000.0}, [], policy, 1100.0, running=True)
    assert never["late"] is True and never["last_tick"] is None
    for info in (fresh, stale, hit, never):
        assert {"running", "last_tick", "last_tick_age_s", "doing", "moves_in_flight", "last_error",
                "late", "tick_deadline_s"} <= set(info)


def test_json_nested_thousands_deep_gets_an_answer(server: QueryServer) -> None:
    """json raises RecursionError, not ValueError, on deep nesting: it is still a bad request, answered."""
    reply = json.loads(_read_all(_raw(server.path, b"[" * 4000 + b"\n", close_write=True)))
    assert reply["ok"] is False and "one line of JSON" in reply["error"]
