"""Unit tests (no Slurm; a real TCP listener on 127.0.0.1, fake `munge`/`unmunge` scripts on PATH, the
in-test stand-in store of test_query_socket): the agent's query channel from another login host.

The fakes keep munge's contract as its man pages give it: `munge` reads the payload on stdin and prints one
`MUNGE:...:` line; `unmunge --numeric` reads the credential on stdin, prints `KEY: value` lines, a blank
line and the payload, and exits with munge's error code (8 bad credential, 15 expired, 17 replayed). The
uid a fake credential vouches for is $FAKE_MUNGE_UID (as if another user's process had made it), or, for one
restricted to a numeric uid (the agent's sealed answer), $FAKE_MUNGE_AGENT_UID (the agent's account, this
test's own uid, unless a test plays an impostor); each credential has a nonce the fake decoder remembers, as
munged's replay cache does. The last tests run the real munge where munged answers, to hold the parser to the
real output.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_query_socket import ALICE, NOBODY, StandInStore

from dlsub import munge as munge_auth
from dlsub.agent.query import QueryServer
from dlsub.cli.agent_commands import agent, why
from dlsub.cli.daemon_commands import backfill
from dlsub.job import agent_client
from dlsub.job.agent_client import AgentEndpoint, AgentUnavailable, ask, munge_credential
from dlsub.site_config.policy_file import AgentPolicy

FAKE_MUNGE = r'''#!PYTHON
import base64, json, os, sys, uuid
args = sys.argv[1:]
restrict = args[args.index("--restrict-uid") + 1] if "--restrict-uid" in args else ""
uid_of = "FAKE_MUNGE_AGENT_UID" if restrict.isdigit() else "FAKE_MUNGE_UID"
body = {"uid": int(os.environ.get(uid_of, os.getuid())), "gid": 100, "nonce": uuid.uuid4().hex,
        "expired": bool(os.environ.get("FAKE_MUNGE_EXPIRED")), "restrict": restrict,
        "payload": base64.b64encode(sys.stdin.buffer.read()).decode()}
print("MUNGE:" + base64.b64encode(json.dumps(body).encode()).decode() + ":")
'''

FAKE_UNMUNGE = r'''#!PYTHON
import base64, json, os, sys
with open(os.environ["FAKE_MUNGE_DIR"] + "/unmunge.argv", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
text = sys.stdin.buffer.read().strip()
try:
    assert text.startswith(b"MUNGE:") and text.endswith(b":")
    body = json.loads(base64.b64decode(text[6:-1], validate=True))
    payload = base64.b64decode(body["payload"])
except Exception:
    sys.stderr.write("unmunge: Error: Invalid credential format\n")
    sys.exit(8)
status, code = "0", 0
seen = os.path.join(os.environ["FAKE_MUNGE_DIR"], "seen-" + body["nonce"])
if body["expired"]:
    status, code = "15", 15
elif os.path.exists(seen):
    status, code = "17", 17
open(seen, "w").close()
sys.stdout.write(f"STATUS:          {status}\nENCODE_HOST:     127.0.0.1\nUID:             {body['uid']}\n"
                 f"GID:             {body['gid']}\nLENGTH:          {len(payload)}\n\n")
sys.stdout.flush()
sys.stdout.buffer.write(payload)
if code:
    sys.stderr.write("unmunge: Error: refused\n")
sys.exit(code)
'''


def _accounts_here(user: str) -> int:
    """This host's accounts as the client sees them in these tests: the agent's, "dlsub", is this test's uid."""
    if user != "dlsub":
        raise KeyError(user)
    return os.getuid()


@pytest.fixture
def fake_munge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake munge and unmunge first on PATH; their state (replay cache, argv log) in the returned folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("munge", FAKE_MUNGE), ("unmunge", FAKE_UNMUNGE)):
        script = bin_dir / name
        script.write_text(text.replace("PYTHON", sys.executable, 1))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MUNGE_DIR", str(tmp_path))
    # The agent's account is this test's uid: its sealed answers come from there.
    monkeypatch.setattr(agent_client, "account_uid", _accounts_here)
    monkeypatch.setenv("DLSUB_AGENT_DB", str(tmp_path / "nowhere" / "agent.db"))
    monkeypatch.setenv("DLSUB_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def store() -> StandInStore:
    return StandInStore()


@pytest.fixture
def server(fake_munge: Path, store: StandInStore) -> Iterator[QueryServer]:
    with QueryServer(fake_munge / "run" / "agent.sock", lambda: store, AgentPolicy(), address="127.0.0.1:0",
                     read_timeout_s=1.0, service_uid=-1) as srv:
        yield srv


def remote(server: QueryServer) -> AgentEndpoint:
    """The agent as a client on another login host sees it: an address, no socket of its own."""
    return AgentEndpoint(address=server.tcp_address, agent_user="dlsub")


def as_uid(monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    monkeypatch.setenv("FAKE_MUNGE_UID", str(uid))


def raw_bytes(server: QueryServer, data: bytes) -> bytes:
    host, port = server.tcp_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def fake_body(credential: bytes) -> dict[str, Any]:
    """What a fake credential holds (its uid, restriction and payload), read without unmunge."""
    body: dict[str, Any] = json.loads(base64.b64decode(credential.strip()[6:-1]))
    return body


def raw(server: QueryServer, data: bytes) -> dict[str, Any]:
    """The answer to ``data`` sent as it is: a sealed one opened (fake munge), a plain refusal as it came."""
    out = raw_bytes(server, data)
    if out.startswith(b"MUNGE:"):
        out = base64.b64decode(fake_body(out)["payload"])
    reply: dict[str, Any] = json.loads(out)
    return reply


def test_the_uid_munge_vouches_for_gets_its_own_job(server: QueryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    as_uid(monkeypatch, ALICE)
    reply = ask(remote(server), {"op": "why", "dlsub_id": "0123abcd"})
    assert reply["ok"] and [d["reason"] for d in reply["decisions"]] == ["moving to gpu: alice's secret"]
    assert reply["you"] == {"uid": ALICE, "user": str(ALICE), "admin": False, "via": "munge"}
    status = ask(remote(server), {"op": "status"})
    assert [m["dlsub_id"] for m in status["status"]["moves_in_flight"]] == ["0123abcd"]


def test_a_credential_for_another_uid_gets_nothing_about_the_job(server: QueryServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    as_uid(monkeypatch, NOBODY)
    by_id = ask(remote(server), {"op": "why", "dlsub_id": "0123abcd"})
    by_slurm_id = ask(remote(server), {"op": "why", "slurm_job_id": 41})
    assert by_id["ok"] and by_id["decisions"] == [] and by_slurm_id["decisions"] == []
    assert by_id["you"]["uid"] == NOBODY and by_id["you"]["via"] == "munge"
    assert ask(remote(server), {"op": "status"})["status"]["moves_in_flight"] == []
    own = ask(remote(server), {"op": "why", "dlsub_id": "feedbeef"})
    assert [d["reason"] for d in own["decisions"]] == ["nobody's own job"]


def test_the_credential_is_made_for_the_agents_account_and_reaches_unmunge_on_stdin_only(
        server: QueryServer, fake_munge: Path) -> None:
    credential = munge_credential(b'{"op": "status", "x": "$(touch /tmp/pwned) ; rm -rf ~"}', "dlsub", 5.0)
    body = json.loads(base64.b64decode(credential[6:-1]))
    assert body["restrict"] == "dlsub"
    reply = raw(server, credential + b"\n")
    assert reply["ok"] and reply["you"]["via"] == "munge"
    argv = [json.loads(line) for line in (fake_munge / "unmunge.argv").read_text().splitlines()]
    assert argv == [["--numeric", "--keys", "STATUS,ENCODE_HOST,UID,GID,LENGTH"]]


def test_a_replayed_credential_is_refused_and_the_agent_answers_the_next(server: QueryServer,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    as_uid(monkeypatch, ALICE)
    credential = munge_credential(json.dumps({"op": "why", "dlsub_id": "0123abcd"}).encode(), "dlsub", 5.0)
    first = raw(server, credential + b"\n")
    assert first["ok"] and len(first["decisions"]) == 1
    again = raw(server, credential + b"\n")
    assert again == {"ok": False, "error": "refused: the credential was already used (replayed): every request "
                                           "needs a fresh one"}
    assert ask(remote(server), {"op": "status"})["ok"]


def test_an_expired_credential_is_refused_with_the_clock_hint(server: QueryServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MUNGE_EXPIRED", "1")
    reply = ask(remote(server), {"op": "status"})
    assert reply["ok"] is False and "expired" in reply["error"] and "NTP" in reply["error"]
    assert "status" not in reply and "you" not in reply


@pytest.mark.parametrize("data, error", [
    (b"hello agent\n", "refused: expected a munge credential"),
    (b'{"op": "status"}\n', "refused: expected a munge credential"),
    (b"MUNGE:!!not base64!!:\n", "refused: not a valid munge credential"),
    (b"\x00\xff\xfe garbage\n", "refused: expected a munge credential"),
    (b"MUNGE:" + b"A" * 20_000 + b":\n", "request larger than 16384 bytes"),
])
def test_garbage_and_oversized_input_is_refused_and_the_agent_is_unharmed(server: QueryServer, data: bytes,
                                                                          error: str) -> None:
    reply = raw(server, data)
    assert reply["ok"] is False and reply["error"].startswith(error)
    assert ask(remote(server), {"op": "status"})["ok"]


def test_an_oversized_request_inside_a_valid_credential_is_refused(server: QueryServer) -> None:
    credential = munge_credential(json.dumps({"op": "status", "pad": "x" * 5000}).encode(), "", 5.0)
    reply = raw(server, credential + b"\n")
    assert reply == {"ok": False, "error": "refused: request larger than 4096 bytes"}


def test_a_silent_tcp_client_is_dropped_in_time(server: QueryServer) -> None:
    host, port = server.tcp_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"MUNGE:abc")  # and never the rest
        out = s.recv(65536)
    assert json.loads(out) == {"ok": False, "error": "request not finished in time"}


def test_the_client_says_what_is_wrong_with_munge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_client, "MUNGE", str(tmp_path / "no-munge-here"))
    with pytest.raises(AgentUnavailable, match="has no `munge` command: install munge"):
        ask(AgentEndpoint(address="127.0.0.1:9"), {"op": "status"})
    broken = tmp_path / "munge"
    broken.write_text('#!/bin/sh\necho \'munge: Error: Failed to access "/run/munge/munge.socket.2"\' >&2\nexit 6\n')
    broken.chmod(0o755)
    monkeypatch.setattr(agent_client, "MUNGE", str(broken))
    with pytest.raises(AgentUnavailable,
                       match=r"exit 6: munge: Error: Failed to access.*is munged running on this host"):
        ask(AgentEndpoint(address="127.0.0.1:9"), {"op": "status"})


def test_the_client_says_when_nothing_listens(fake_munge: Path) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a port that was free a moment ago: nothing listens there
    with pytest.raises(AgentUnavailable, match=f"nothing listens on 127.0.0.1:{port}: the agent is not running"):
        ask(AgentEndpoint(address=f"127.0.0.1:{port}"), {"op": "status"})


def test_the_socket_on_the_agents_host_and_tcp_from_elsewhere(server: QueryServer) -> None:
    here = AgentEndpoint(server.path, f"localhost:{server.tcp_address.rsplit(':', 1)[1]}", "dlsub")
    assert not here.via_tcp() and not here.elsewhere()
    assert ask(here, {"op": "status"})["you"]["via"] == "socket"
    # 192.0.2.1 (TEST-NET-1) is never an address of this machine: the agent is on another host.
    there = AgentEndpoint(server.path, "192.0.2.1:6830", "dlsub")
    assert there.via_tcp() and there.elsewhere()
    no_socket = AgentEndpoint(server.path.parent / "none.sock", server.tcp_address, "dlsub")
    assert no_socket.via_tcp() and ask(no_socket, {"op": "status"})["you"]["via"] == "munge"
    assert not AgentEndpoint(server.path).via_tcp()


def test_a_pairs_client_asks_the_agent_on_its_own_host_first_and_the_address_when_that_one_is_down(
    server: QueryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unit (real sockets, fake munge): of an agent pair, the address names the other login host; the agent here
    answers on its socket (the state is shared), and where it is down (its socket left behind, nothing listening)
    the address is asked."""
    monkeypatch.setattr("dlsub.job.agent_client.is_this_host", lambda host: False)  # the address: another host
    pair = AgentEndpoint(server.path, server.tcp_address, "dlsub", pair=True)
    assert pair.elsewhere() and not pair.via_tcp()
    assert ask(pair, {"op": "status"})["you"]["via"] == "socket"
    assert AgentEndpoint(server.path, server.tcp_address, "dlsub").via_tcp(), "one agent: its address, as before"
    left_behind = server.path.parent / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(left_behind))  # a socket file that nothing listens on: the agent here was killed
    stale = AgentEndpoint(left_behind, server.tcp_address, "dlsub", pair=True)
    assert not stale.via_tcp() and ask(stale, {"op": "status"})["you"]["via"] == "munge"
    with pytest.raises(AgentUnavailable, match="does not answer on"):
        ask(AgentEndpoint(left_behind, pair=True), {"op": "status"})  # no address: nothing else to ask


def test_an_agent_given_another_hosts_address_does_not_start(fake_munge: Path, store: StandInStore) -> None:
    path = fake_munge / "run2" / "agent.sock"
    with pytest.raises(OSError, match="192.0.2.1 is not an address of this host; run the agent on 192.0.2.1"):
        QueryServer(path, lambda: store, AgentPolicy(), address="192.0.2.1:6830").start()
    assert not path.exists()


def test_cli_why_and_status_from_another_login_host(server: QueryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    as_uid(monkeypatch, NOBODY)
    address = ["--address", server.tcp_address]
    status = CliRunner().invoke(agent, ["status", "--json", *address])
    assert status.exit_code == 0, status.output
    info = json.loads(status.stdout)
    assert info["running"] is True and info["you"]["via"] == "munge" and info["moves_in_flight"] == []
    own = CliRunner().invoke(why, ["feedbeef", "--json", *address])
    assert own.exit_code == 0 and [d["reason"] for d in json.loads(own.stdout)] == ["nobody's own job"]
    other = CliRunner().invoke(why, ["0123abcd", *address])
    assert other.exit_code == 0 and "decided nothing about job 0123abcd" in other.stdout


def test_cli_through_the_policys_agent_address(server: QueryServer, fake_munge: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    policy = fake_munge / "policy.toml"
    policy.write_text(f'socket = "{fake_munge}/elsewhere/agent.sock"\nagent_address = "{server.tcp_address}"\n')
    monkeypatch.setenv("DLSUB_POLICY", str(policy))
    as_uid(monkeypatch, ALICE)
    own = CliRunner().invoke(why, ["0123abcd", "--json"])
    assert own.exit_code == 0, own.output
    assert [d["reason"] for d in json.loads(own.stdout)] == ["moving to gpu: alice's secret"]


def test_a_cron_backfill_on_another_login_host_never_ticks(server: QueryServer, fake_munge: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    db = fake_munge / "state" / "agent.db"
    policy = fake_munge / "policy.toml"
    policy.write_text('agent_address = "192.0.2.1:6830"\n')
    down = CliRunner().invoke(backfill, ["--once", "--policy", str(policy), "--db", str(db)])
    assert down.exit_code == 1 and "no backfill runs from this host; run it there" in down.output
    # The agent answering on "another host" (this test's listener, taken for one).
    policy.write_text(f'agent_address = "{server.tcp_address}"\n')
    monkeypatch.setattr(agent_client, "is_this_host", lambda host: False)
    up = CliRunner().invoke(backfill, ["--once", "--policy", str(policy), "--db", str(db)])
    assert up.exit_code == 0 and "the agent runs on h and backfills on its own" in up.output
    assert not db.parent.exists()  # no state of its own was made here


def _real_munge_works() -> bool:
    try:
        made = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=False)
        return made.returncode == 0 and subprocess.run(["unmunge", "-n"], input=made.stdout, capture_output=True,
                                                       timeout=5, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _real_munge_works(), reason="no munged answers on this machine")
def test_the_real_unmunge_output_is_read_and_its_replay_refused() -> None:
    """Unit test against this machine's real munged (skipped without one): the parser holds to the real format."""
    credential = munge_credential(b'{"op": "status"}', "", 5.0)
    caller = munge_auth.verify(credential)
    assert (caller.uid, caller.payload) == (os.getuid(), b'{"op": "status"}')
    with pytest.raises(munge_auth.MungeRefused, match="replayed"):
        munge_auth.verify(credential)
    with pytest.raises(munge_auth.MungeRefused, match="not a valid munge credential"):
        munge_auth.verify(b"MUNGE:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:")


def test_the_answer_is_sealed_for_the_uid_that_asked(server: QueryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer over TCP is a credential restricted to the asker's uid (only it can decode it), zlib-compressed,
    made by the agent's account; the request's is restricted to the agent's account."""
    as_uid(monkeypatch, ALICE)
    request = munge_credential(json.dumps({"op": "why", "dlsub_id": "0123abcd"}).encode(), "dlsub", 5.0)
    answer = raw_bytes(server, request + b"\n")
    body = fake_body(answer)
    assert body["restrict"] == str(ALICE) and body["uid"] == os.getuid()
    reply = json.loads(base64.b64decode(body["payload"]))
    assert [d["reason"] for d in reply["decisions"]] == ["moving to gpu: alice's secret"]
    assert b"alice's secret" not in answer  # (the fake's payload is base64; real munge encrypts it)


def _one_answer_server(answer: bytes) -> tuple[socket.socket, str]:
    """A listener on loopback that answers one connection with ``answer``: another process on the agent's port."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def test_an_answer_not_sealed_by_the_agent_is_not_taken(fake_munge: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Something else on the agent's port: a plain "ok" answer, or one sealed by another uid, is refused with
    why; a plain refusal is passed on (the agent's own, made before munge proved who asks, tells nothing)."""
    forged = json.dumps({"ok": True, "decisions": [{"reason": "forged"}]}).encode()
    listener, address = _one_answer_server(forged + b"\n")
    with listener, pytest.raises(AgentUnavailable, match="not sealed by the agent's munge credential"):
        ask(AgentEndpoint(address=address, agent_user="dlsub"), {"op": "why", "dlsub_id": "0123abcd"})
    monkeypatch.setenv("FAKE_MUNGE_AGENT_UID", "4242")
    impostor = munge_credential(forged, str(os.getuid()), 5.0)
    monkeypatch.delenv("FAKE_MUNGE_AGENT_UID")
    listener, address = _one_answer_server(impostor + b"\n")
    with listener, pytest.raises(AgentUnavailable, match="sealed by uid 4242, not by the agent's account dlsub"):
        ask(AgentEndpoint(address=address, agent_user="dlsub"), {"op": "status"})
    listener, address = _one_answer_server(b'{"ok": false, "error": "refused: the credential has expired"}\n')
    with listener:
        assert ask(AgentEndpoint(address=address, agent_user="dlsub"), {"op": "status"})["ok"] is False
    listener, address = _one_answer_server(munge_credential(forged, str(os.getuid()), 5.0) + b"\n")
    with listener, pytest.raises(AgentUnavailable, match="account nobody-here does not exist on this host"):
        ask(AgentEndpoint(address=address, agent_user="nobody-here"), {"op": "status"})


@pytest.mark.skipif(not _real_munge_works(), reason="no munged answers on this machine")
def test_the_real_munge_seals_an_answer_this_uid_opens() -> None:
    """Unit test against this machine's real munged (skipped without one): a sealed answer opens for its uid with
    the sealer's uid, its payload whole; one sealed for another uid does not open here."""
    from dlsub.munge import seal

    answer = json.dumps({"ok": True, "pad": "x" * 100_000}).encode()
    opened = munge_auth.verify(seal(answer, os.getuid()), max_payload=1 << 20, max_credential=1 << 21)
    assert (opened.uid, opened.payload) == (os.getuid(), answer)
    with pytest.raises(munge_auth.MungeRefused):
        munge_auth.verify(seal(answer, os.getuid() + 4242), max_payload=1 << 20, max_credential=1 << 21)
