"""Asking the running agent: the client of :mod:`dlsub.agent.query`'s server.

The user side (``dlsub why``, ``dlsub agent status``, ``dlsub doctor``, the
dashboard) reaches the agent only through this: one JSON request, one JSON
answer back (the protocol heads the server's module). Two ways in:

* on the agent's own host, its Unix socket (``policy.socket``): the kernel
  tells the agent who asks;
* from any other host, TCP to ``policy.agent_address`` (``HOST:PORT``):
  the request travels as the payload of a **munge** credential, made here by
  ``munge`` (as Slurm's own RPCs authenticate a uid across hosts); the
  agent decodes it with ``unmunge`` and so knows the uid, as from the socket.
  Its answer comes back sealed the same way (:func:`dlsub.munge.seal`):
  encrypted for this uid alone, and taken only when munge says the agent's
  account made it; a plain answer is believed only as a refusal.

:func:`ask` picks: the socket when the agent's address is this host (or no
address is set), TCP when the address names another host or there is no
socket here. Of an agent pair (``[failover] shared_state``), the agent on
this login host is asked first whatever the address names: it reads the
state both share, and it still answers when the host the address names is
lost; TCP to that address only when no agent of the pair answers here.
"""

from __future__ import annotations

import errno
import json
import pwd
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub.munge import MungeRefused, verify
from dlsub.site_config.policy_file import AgentPolicy, parse_address

#: The largest answer a client reads.
MAX_ANSWER = 16 * 1024 * 1024
#: munge's CLI (Debian's munge package, on every Slurm host); found on PATH.
MUNGE = "munge"
#: The largest credential sent (a request is ~100 bytes; munge adds well under 1 KiB around it).
MAX_CREDENTIAL = 16 * 1024


class AgentUnavailable(RuntimeError):
    """The agent does not answer (not running, stuck, unreachable, or munge cannot vouch for us)."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where the agent answers: its Unix socket on its own host, its TCP address (``HOST:PORT``) from others."""

    socket: Path | None = None
    address: str = ""
    #: The agent's account: credentials are made decodable by it alone (``munge --restrict-uid``).
    agent_user: str = ""
    #: An agent runs on each login host over one shared state (``[failover] shared_state``).
    pair: bool = False

    @classmethod
    def of(cls, policy: AgentPolicy, socket_path: Path | None = None, address: str | None = None) -> AgentEndpoint:
        """The policy's endpoint; an explicit socket or address (a command's option) is used alone."""
        if socket_path is not None:
            return cls(socket=socket_path)
        if address:
            return cls(address=address, agent_user=policy.agent_user)
        return cls(Path(policy.socket), policy.agent_address, policy.agent_user, policy.failover.shared_state)

    def elsewhere(self) -> bool:
        """Whether the agent's address names another host (its state, lock and socket are there, not here)."""
        if not self.address:
            return False
        try:
            host, _ = parse_address(self.address)
        except ValueError:
            return True  # ask() says what is wrong with it
        return not is_this_host(host)

    def via_tcp(self) -> bool:
        """Whether :func:`ask` goes over TCP with munge (else the Unix socket)."""
        if not self.address:
            return False
        if self.socket is None or not self.socket.is_socket():
            return True
        return not self.pair and self.elsewhere()

    def __str__(self) -> str:
        return self.address if self.via_tcp() else str(self.socket)


def is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine: its own name, or an address bound here (or loopback)."""
    mine = socket.gethostname()
    if host in ("localhost", mine) or host.split(".")[0] == mine.split(".")[0]:
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        if ip.startswith("127.") or ip == "::1":
            return True
        probe = socket.socket(family, socket.SOCK_DGRAM)
        try:
            probe.bind((ip, 0))  # succeeds only for an address of one of this host's interfaces
        except OSError:
            continue
        finally:
            probe.close()
        return True
    return False


def ask(where: AgentEndpoint | Path, request: Mapping[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    """Send one request to the agent and return its answer; AgentUnavailable when none comes."""
    endpoint = where if isinstance(where, AgentEndpoint) else AgentEndpoint(socket=where)
    line = json.dumps(dict(request)).encode()
    if endpoint.via_tcp():
        return _ask_tcp(endpoint, line, timeout_s)
    if endpoint.socket is None:
        raise AgentUnavailable("no agent socket and no agent_address: the policy names neither")
    try:
        return _ask_unix(endpoint.socket, line, timeout_s)
    except AgentUnavailable:
        if not (endpoint.pair and endpoint.elsewhere()):
            raise
    # This host's agent of the pair is down or stuck (its socket left behind): the other host's may answer.
    return _ask_tcp(endpoint, line, timeout_s)


def _ask_unix(path: Path, line: bytes, timeout_s: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise AgentUnavailable(f"no agent socket at {path}: the agent is not running here (on another "
                                   "login host, the policy's agent_address names where it listens)") from None
        except OSError as exc:
            raise AgentUnavailable(f"the agent does not answer on {path} ({exc.strerror or exc})") from None
        return _exchange(sock, line + b"\n", str(path), timeout_s)
    finally:
        sock.close()


def _ask_tcp(endpoint: AgentEndpoint, line: bytes, timeout_s: float) -> dict[str, Any]:
    try:
        host, port = parse_address(endpoint.address)
    except ValueError as exc:
        raise AgentUnavailable(f"agent_address {exc}") from None
    credential = munge_credential(line, endpoint.agent_user, timeout_s)
    where = endpoint.address
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError:
        raise AgentUnavailable(f"the agent did not answer on {where} within {timeout_s:g} s") from None
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            raise AgentUnavailable(f"nothing listens on {where}: the agent is not running there") from None
        raise AgentUnavailable(f"the agent at {where} cannot be reached ({exc.strerror or exc})") from None
    try:
        sock.settimeout(timeout_s)
        answer = _exchange_bytes(sock, credential + b"\n", where, timeout_s)
    finally:
        sock.close()
    if not answer.strip().startswith(b"MUNGE:"):
        reply = _json_reply(answer, where)
        if reply.get("ok") is not False:
            raise AgentUnavailable(f"the answer on {where} was not sealed by the agent's munge credential, so it "
                                   "is not taken: is something else listening on that port?")
        return reply  # a refusal made before munge proved who asked: it says nothing of any job
    return _json_reply(_unsealed(answer, endpoint, where), where)


def account_uid(user: str) -> int:
    """The uid of an account on this host (KeyError when it has none)."""
    return pwd.getpwnam(user).pw_uid


def _unsealed(answer: bytes, endpoint: AgentEndpoint, where: str) -> bytes:
    """The payload of the agent's sealed answer, once munge says the agent's account made it for us."""
    try:
        agent_uid = account_uid(endpoint.agent_user)
    except KeyError:
        raise AgentUnavailable(f"the agent's account {endpoint.agent_user or '(agent_user unset)'} does not exist "
                               "on this host, so its answer cannot be told from another's") from None
    try:
        sealed = verify(answer, max_payload=MAX_ANSWER, max_credential=2 * MAX_ANSWER)
    except MungeRefused as exc:
        raise AgentUnavailable(f"the agent's answer on {where} did not unseal here: {exc}") from None
    if sealed.uid != agent_uid:
        raise AgentUnavailable(f"the answer on {where} was sealed by uid {sealed.uid}, not by the agent's account "
                               f"{endpoint.agent_user} (uid {agent_uid}): not taken")
    return sealed.payload


def munge_credential(payload: bytes, restrict_to: str, timeout_s: float) -> bytes:
    """A munge credential carrying ``payload``, vouching for this process's uid (``munge``, no shell)."""
    argv = [MUNGE]
    if restrict_to:
        argv += ["--restrict-uid", restrict_to]
    try:
        made = subprocess.run(argv, input=payload, capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise AgentUnavailable("the agent on another host needs a munge credential, and this host has no "
                               "`munge` command: install munge (Debian's munge package, as for Slurm)") from None
    except subprocess.TimeoutExpired:
        raise AgentUnavailable(f"munge made no credential within {timeout_s:g} s: is munged running?") from None
    if made.returncode != 0:
        said = made.stderr.decode(errors="replace").strip().splitlines()
        raise AgentUnavailable(f"munge could not make a credential (exit {made.returncode}: "
                               f"{said[-1] if said else 'no message'}); is munged running on this host, and does "
                               f"the agent's account {restrict_to or '(agent_user)'} exist here?")
    credential = made.stdout.strip()
    if not credential.startswith(b"MUNGE:") or len(credential) > MAX_CREDENTIAL:
        raise AgentUnavailable("munge printed no credential (expected one line starting MUNGE:)")
    return credential


def _exchange(sock: socket.socket, data: bytes, where: str, timeout_s: float) -> dict[str, Any]:
    """Send ``data`` on a connected socket and read the agent's JSON answer to its end."""
    return _json_reply(_exchange_bytes(sock, data, where, timeout_s), where)


def _exchange_bytes(sock: socket.socket, data: bytes, where: str, timeout_s: float) -> bytes:
    """Send ``data`` on a connected socket and read what comes back to its end."""
    try:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent refused us before reading: its reason is waiting to be read
        chunks, size = [], 0
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                raise AgentUnavailable(f"the agent's answer on {where} is larger than {MAX_ANSWER} bytes")
    except TimeoutError:
        raise AgentUnavailable(f"the agent did not answer on {where} within {timeout_s:g} s") from None
    except OSError as exc:
        raise AgentUnavailable(f"the agent's connection {where} failed: {exc.strerror or exc}") from None
    return b"".join(chunks)


def _json_reply(answer: bytes, where: str) -> dict[str, Any]:
    try:
        reply = json.loads(answer)
    except ValueError:
        raise AgentUnavailable(f"the agent's answer on {where} is not JSON") from None
    if not isinstance(reply, dict):
        raise AgentUnavailable(f"the agent's answer on {where} is not a JSON object")
    return reply
