"""The agent's query channel: ``dlsub why`` and ``dlsub agent status`` over a Unix socket, and TCP with munge.

The agent's database is private to its service account. Users ask the
running agent instead, through a Unix socket (``policy.socket``, default
``/run/dlsub/agent.sock``, mode 0666 in a 0755 directory the agent owns).
The kernel says who is asking (``SO_PEERCRED``): the answer covers that
uid's jobs only; root, the service account and ``policy.admins`` see all.

Users on other login hosts cannot reach that socket. When the policy names
``agent_address`` (``HOST:PORT``), the server also listens there on TCP; a
client sends one line, a munge credential whose payload is its request
(:mod:`dlsub.munge` decodes it with ``unmunge``), and munge, not
the kernel, says who asks: the same answer, the same uid's jobs only. A
credential that is not valid, has expired or was used before is refused
with the reason, and the connection closed.

Protocol: the client sends one JSON object on one line and reads one JSON
object back, then the server closes the connection (over TCP, each inside
a munge credential: the answer sealed for the uid that asked,
:func:`dlsub.munge.seal`; only a refusal made before munge proved who asks,
which says nothing of any job, comes back plain)::

    {"op": "status"}
    {"op": "why", "dlsub_id": "0123abcd", "slurm_job_id": 42}   (either, or both)

Every answer has ``ok`` (and ``error`` when false) and ``you`` (the uid and
user the server saw, and ``via``: ``socket`` or ``munge``). The client, :func:`dlsub.job.agent_client.ask`, is the
user side's: nothing a user runs imports the daemon. Anyone on the host can connect, so the server is
built for hostile clients: a request is size-capped and must arrive within
a deadline, connections are bounded (overall and per uid) and a failed
request costs only its own connection. The server runs in threads of its
own with its own read-only store connection, so it answers while a tick
is slow, and nothing a client does reaches the tick.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlsub.agent.lease import LeaseRow
from dlsub.contract import DLSUB_ID
from dlsub.munge import MAX_CREDENTIAL, MungeRefused, seal, verify
from dlsub.site_config.policy_file import AgentPolicy, parse_address

log = logging.getLogger("dlsub.agent.query")

#: The longest request line the server reads (a request is ~100 bytes).
MAX_REQUEST = 4096
#: A request must arrive whole within this (slow-drip clients are dropped).
READ_TIMEOUT_S = 2.0
#: Connections served at once, and by one uid.
MAX_CLIENTS = 16
MAX_CLIENTS_PER_UID = 4
#: TCP connections served at once from one address (before munge says who asks; users of one login host share it).
MAX_CLIENTS_PER_HOST = 8
#: The newest decisions an answer carries.
MAX_DECISIONS = 500
_MAX_SLURM_ID = 2**32


class StoreView(Protocol):
    """What the query channel reads from the agent's store (agent_store.AgentStore)."""

    def meta(self) -> dict[str, Any]: ...

    def moves(self) -> list[dict[str, Any]]: ...

    def decisions(self, dlsub_id: str | None = None, slurm_job_id: int | None = None,
                  uid: int | None = None) -> list[Any]: ...

    def lease(self) -> LeaseRow | None: ...


@dataclass(frozen=True)
class Caller:
    """Who is asking, as the kernel (``via="socket"``) or munge (``via="munge"``) says."""

    uid: int
    user: str
    admin: bool  # sees every job
    via: str = "socket"

    @classmethod
    def of(cls, uid: int, policy: AgentPolicy, service_uid: int, via: str = "socket") -> Caller:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            # A uid without a name is never an admin, whatever policy.admins lists.
            return cls(uid, str(uid), uid == 0 or uid == service_uid, via)
        return cls(uid, name, uid == 0 or uid == service_uid or policy.is_admin(name), via)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


# ---------------------------------------------------------------- answers (pure)


def lease_status(lease: LeaseRow | None, now: float) -> dict[str, Any] | None:
    """Who holds a pair's lease, as status shows it (None: one host's agent, no lease)."""
    if lease is None:
        return None
    return {"holder": lease.host, "pid": lease.pid, "token": lease.token, "renewed": lease.renewed,
            "expires": lease.expires, "expires_in_s": round(lease.expires - now, 1), "live": lease.live(now)}


def agent_status(meta: Mapping[str, Any], moves: list[dict[str, Any]], policy: AgentPolicy, now: float,
                 *, running: bool, role: str | None = None, lease: LeaseRow | None = None) -> dict[str, Any]:
    """The status document: the fields `dlsub agent status --json` has always had, and more.

    ``late``: no tick for longer than ``tick_interval_s + tick_deadline_s``,
    or the last tick hit its deadline. ``role``: whether the agent that answered acts ("active") or stands
    by ("standby", one of a pair), with ``answered_by`` its host; ``lease``: a pair's lease
    (:func:`lease_status`; ``pid`` and ``host`` are then the active agent's, as it recorded them).
    """
    interval = float(meta.get("tick_interval_s") or policy.tick_interval_s)
    deadline = float(meta.get("tick_deadline_s") or policy.tick_deadline_s)
    last = meta.get("last_tick")
    since = last if last is not None else meta.get("started")
    age = round(now - float(last), 1) if last is not None else None
    overdue = running and since is not None and now - float(since) > interval + deadline
    return {
        "running": running,
        "pid": meta.get("pid"), "host": meta.get("host"), "policy": meta.get("policy"),
        "started": meta.get("started"),
        "last_tick": last, "last_tick_age_s": age,
        "last_tick_duration_s": meta.get("last_tick_duration_s"),
        "tick_interval_s": interval, "tick_deadline_s": deadline,
        "late": bool(overdue or meta.get("late")),
        "overdue": bool(overdue), "last_tick_hit_deadline": bool(meta.get("late")),
        "doing": meta.get("doing"), "jobs": meta.get("jobs"), "skipped": meta.get("skipped"),
        "moves_in_flight": moves, "last_error": meta.get("last_error"),
        "role": role, "answered_by": os.uname().nodename if role is not None else None,
        "lease": lease_status(lease, now),
    }


def _visible_moves(store: StoreView, caller: Caller) -> list[dict[str, Any]]:
    rows = store.moves()
    return [dict(r) for r in rows if caller.admin or r.get("uid") == caller.uid]


def _decision_dict(decision: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(decision) and not isinstance(decision, type):
        return dataclasses.asdict(decision)
    return dict(decision)


def _why(request: Mapping[str, Any], caller: Caller, store: StoreView) -> dict[str, Any]:
    dlsub_id, slurm_id = request.get("dlsub_id"), request.get("slurm_job_id")
    if dlsub_id is not None and not (isinstance(dlsub_id, str) and DLSUB_ID.match(dlsub_id)):
        return {"ok": False, "error": "dlsub_id must be 8 hex digits"}
    if slurm_id is not None and not (type(slurm_id) is int and 0 < slurm_id < _MAX_SLURM_ID):
        return {"ok": False, "error": "slurm_job_id must be a positive integer"}
    if dlsub_id is None and slurm_id is None:
        return {"ok": False, "error": "give dlsub_id or slurm_job_id"}
    uid = None if caller.admin else caller.uid
    # A dlsub id names the whole job (every Slurm job of it); the Slurm id only narrows an unknown one.
    found = store.decisions(dlsub_id=dlsub_id, slurm_job_id=None if dlsub_id else slurm_id, uid=uid)
    rows = [_decision_dict(d) for d in found]
    if uid is not None:  # the store filters by uid; this keeps it true whatever the store does
        rows = [r for r in rows if r.get("uid") == uid]
    return {"ok": True, "decisions": rows[-MAX_DECISIONS:], "truncated": len(rows) > MAX_DECISIONS}


def answer(request: Any, caller: Caller, store: StoreView, policy: AgentPolicy, now: float,
           role: str = "active") -> dict[str, Any]:
    """The answer to one request from ``caller`` (never raises on bad input); ``role``: the answering agent's."""
    you = {"uid": caller.uid, "user": caller.user, "admin": caller.admin, "via": caller.via}
    if not isinstance(request, dict):
        return {"ok": False, "error": "a request is one JSON object", "you": you}
    op = request.get("op")
    if op == "status":
        status = agent_status(store.meta(), _visible_moves(store, caller), policy, now, running=True, role=role,
                              lease=store.lease())
        return {"ok": True, "status": status, "you": you}
    if op == "why":
        return {**_why(request, caller, store), "you": you}
    return {"ok": False, "error": "unknown op; valid ops: status, why", "you": you}


# ---------------------------------------------------------------- the server


class QueryServer:
    """Serves :func:`answer` on a Unix socket, and on TCP with munge when an address is set, from threads of
    its own.

    ``open_store`` is called (once, lazily, and again after a failure) for
    the server's own read-only connection; queries through it are short
    and serialised by a lock that is never held while reading from or
    writing to a client. ``address`` (``HOST:PORT``; default the policy's
    ``agent_address``, "" for none) is where TCP clients connect; port 0
    picks a free one (:attr:`tcp_address` says which). ``role`` says whether
    the agent that serves acts or stands by (one of a pair).
    """

    def __init__(self, path: Path, open_store: Callable[[], StoreView], policy: AgentPolicy, *,
                 address: str | None = None, role: Callable[[], str] = lambda: "active",
                 clock: Callable[[], float] = time.time, service_uid: int | None = None,
                 max_clients: int = MAX_CLIENTS, max_clients_per_uid: int = MAX_CLIENTS_PER_UID,
                 max_clients_per_host: int = MAX_CLIENTS_PER_HOST,
                 read_timeout_s: float = READ_TIMEOUT_S, max_request: int = MAX_REQUEST) -> None:
        self.path = path
        self.policy = policy
        self.address = policy.agent_address if address is None else address
        self.tcp_address = ""
        self._open_store = open_store
        self._role = role
        self._clock = clock
        self._service_uid = os.geteuid() if service_uid is None else service_uid
        self._max_clients, self._max_per_uid = max_clients, max_clients_per_uid
        self._max_per_host = max_clients_per_host
        self._read_timeout_s, self._max_request = read_timeout_s, max_request
        self._store: StoreView | None = None
        self._store_lock = threading.Lock()
        self._slots_lock = threading.Lock()
        self._active: dict[int | str, int] = {}
        self._sock: socket.socket | None = None
        self._tcp: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        tcp = self._listen_tcp() if self.address else None  # first: a wrong address leaves nothing behind
        try:
            self._prepare_directory()
            if self.path.is_socket() or self.path.exists():
                self._remove_stale()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(self.path))
        except BaseException:
            if tcp is not None:
                tcp.close()
            raise
        # Every user may connect; the answer depends on who they are.
        os.chmod(self.path, 0o666)
        sock.listen(64)
        sock.settimeout(0.5)  # to notice stop()
        self._sock, self._tcp = sock, tcp
        self._threads = [threading.Thread(target=self._serve, args=(sock, False), name="dlsub-query", daemon=True)]
        if tcp is not None:
            self._threads.append(threading.Thread(target=self._serve, args=(tcp, True), name="dlsub-query-tcp",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()

    def _listen_tcp(self) -> socket.socket:
        """The TCP listener on ``address``; OSError naming the policy key when it cannot be made."""
        try:
            host, port = parse_address(self.address, any_port=True)
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except ValueError as exc:
            raise OSError(f"agent_address {exc}") from None
        except OSError as exc:
            raise OSError(f"agent_address {self.address!r}: {host} does not resolve here ({exc})") from None
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart must not wait for TIME_WAIT
            sock.bind(sockaddr)
            sock.listen(64)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL:
                raise OSError(f"agent_address {self.address!r}: {host} is not an address of this host; run the "
                              f"agent on {host}, or name this host in agent_address") from None
            raise OSError(f"cannot listen on {self.address} (agent_address): {exc.strerror or exc}") from None
        sock.settimeout(0.5)
        bound = sock.getsockname()
        self.tcp_address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
        return sock

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._tcp is not None:
            self._tcp.close()
        if self._sock is not None:
            self._sock.close()
            try:
                if self.path.is_socket():
                    self.path.unlink()
            except OSError:
                pass

    def __enter__(self) -> QueryServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _prepare_directory(self) -> None:
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True)
            os.chmod(parent, 0o755)  # users must reach the socket; our umask is 077
        info = parent.stat()
        if info.st_uid not in (os.geteuid(), 0) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            # Someone else could replace our socket with theirs and answer in our name.
            raise OSError(f"{parent} must be owned by the agent's account (or root) and not writable by others")

    def _remove_stale(self) -> None:
        """Remove a socket a dead agent left; refuse to take over anything else."""
        if not self.path.is_socket():
            raise OSError(f"{self.path} exists and is not a socket; remove it or set `socket` in policy.toml")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink()
            return
        finally:
            probe.close()
        raise OSError(f"another agent answers on {self.path}; stop it first")

    # ---------------------------------------------------------------- serving
    def _serve(self, listener: socket.socket, tcp: bool) -> None:
        while not self._stopping.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                log.warning("query socket: accept failed: %s", exc)
                time.sleep(0.1)
                continue
            # Who asks: the kernel says for the Unix socket; over TCP munge says, once the request is read, so
            # until then the slot is the peer host's.
            key: int | str
            if tcp:
                key = f"tcp:{peer[0]}"
            else:
                try:
                    key = peer_uid(conn)
                except OSError:
                    conn.close()
                    continue
            if not self._take_slot(key):
                self._refuse(conn)
                continue
            threading.Thread(target=self._handle, args=(conn, key, tcp), name=f"dlsub-query-{key}",
                             daemon=True).start()

    def _take_slot(self, key: int | str) -> bool:
        most = self._max_per_host if isinstance(key, str) else self._max_per_uid
        with self._slots_lock:
            if sum(self._active.values()) >= self._max_clients or self._active.get(key, 0) >= most:
                return False
            self._active[key] = self._active.get(key, 0) + 1
            return True

    def _free_slot(self, key: int | str) -> None:
        with self._slots_lock:
            self._active[key] -= 1
            if not self._active[key]:
                del self._active[key]

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        _send_error(conn, "the agent is busy answering others; try again")
        _close(conn)

    def _handle(self, conn: socket.socket, key: int | str, tcp: bool) -> None:
        try:
            if tcp:
                found = self._munge_request(conn)
                if found is None:
                    return
                caller, line = found
            else:
                got = self._read_request(conn, self._max_request)
                if got is None:
                    return
                assert isinstance(key, int)
                caller, line = Caller.of(key, self.policy, self._service_uid), got
            try:
                request = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting thousands deep
                reply: dict[str, Any] = {"ok": False, "error": "a request is one line of JSON"}
            else:
                reply = self._answer(request, caller)
            data = json.dumps(reply, default=str).encode()
            if tcp:
                data = self._sealed(data, caller)
            conn.settimeout(self._read_timeout_s)  # the whole reply, as for the request
            conn.sendall(data + b"\n")
        except Exception as exc:  # noqa: BLE001 - one client's failure ends its connection, never the server
            log.debug("query from %s dropped: %s", key, exc)
        finally:
            # The slot first: a client that saw our answer end may connect again at once.
            self._free_slot(key)
            _close(conn)

    def _munge_request(self, conn: socket.socket) -> tuple[Caller, bytes] | None:
        """The caller and request a TCP client's credential proves; None (the client told why) when it does not."""
        credential = self._read_request(conn, MAX_CREDENTIAL)
        if credential is None:
            return None
        try:
            proven = verify(credential, max_payload=self._max_request)
        except MungeRefused as exc:
            log.info("query over TCP refused: %s", exc)
            _send_error(conn, f"refused: {exc}")
            return None
        caller = Caller.of(proven.uid, self.policy, self._service_uid, via="munge")
        return caller, proven.payload.strip()

    @staticmethod
    def _sealed(answer: bytes, caller: Caller) -> bytes:
        """An answer over TCP, sealed for the uid munge proved (:func:`dlsub.munge.seal`): encrypted with the
        cluster's key, decodable by that uid alone, and known by its uid to be the agent's. What cannot be
        sealed goes back as an error that tells nothing of the jobs."""
        try:
            return seal(answer, caller.uid)
        except MungeRefused as exc:
            log.warning("query over TCP from uid %d: %s", caller.uid, exc)
            return json.dumps({"ok": False, "error": f"the agent could not seal its answer: {exc}"}).encode()

    def _read_request(self, conn: socket.socket, limit: int) -> bytes | None:
        """One request line, or None when it is too big or too slow (the client is told which)."""
        # One deadline for the whole line: a client dripping a byte a second gets no longer.
        deadline = time.monotonic() + self._read_timeout_s
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _send_error(conn, "request not finished in time")
                return None
            conn.settimeout(left)
            try:
                chunk = conn.recv(limit + 1 - len(buf))
            except TimeoutError:
                _send_error(conn, "request not finished in time")
                return None
            if not chunk:  # the client closed its side: what it sent is the request
                return buf if buf.strip() else None
            buf += chunk
            line, newline, _ = buf.partition(b"\n")
            if len(line) > limit:
                _send_error(conn, f"request larger than {limit} bytes")
                return None
            if newline:
                return line

    def _answer(self, request: Any, caller: Caller) -> dict[str, Any]:
        with self._store_lock:
            try:
                if self._store is None:
                    self._store = self._open_store()
                return answer(request, caller, self._store, self.policy, self._clock(), self._role())
            except Exception as exc:  # noqa: BLE001 - a broken store: say so, open it afresh next time
                log.warning("query channel: reading the agent's state failed: %s", exc)
                self._store = None
                return {"ok": False, "error": f"the agent cannot read its state: {type(exc).__name__}"}


def _send_error(conn: socket.socket, message: str) -> None:
    """One error line, without waiting: a fresh socket's buffer takes it at once."""
    try:
        conn.setblocking(False)
        conn.send(json.dumps({"ok": False, "error": message}).encode() + b"\n")
    except OSError:
        pass


def _close(conn: socket.socket) -> None:
    """Close so that the client still reads our answer.

    Closing a Unix socket with unread bytes in it resets the connection and
    the client loses what we sent; so take what is already there (never
    waiting, never more than a little) first.
    """
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.setblocking(False)
        for _ in range(16):
            if not conn.recv(65536):
                break
    except OSError:
        pass
    finally:
        conn.close()
