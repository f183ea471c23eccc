"""Asking the running agent over its query socket: the client of :mod:`dlsub.agent.query`'s server.

The user side (``dlsub why``, ``dlsub agent status``, ``dlsub doctor``, the
dashboard) reaches the agent only through this: one JSON request on one
line, one JSON answer back (the protocol heads the server's module).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The largest answer a client reads.
MAX_ANSWER = 16 * 1024 * 1024


class AgentUnavailable(RuntimeError):
    """The agent does not answer on its socket (not running, or stuck)."""


def ask(path: Path, request: Mapping[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    """Send one request to the agent and return its answer; AgentUnavailable when none comes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise AgentUnavailable(f"no agent socket at {path}: the agent is not running") from None
        except OSError as exc:
            raise AgentUnavailable(f"the agent does not answer on {path} ({exc.strerror or exc})") from None
        try:
            try:
                sock.sendall(json.dumps(dict(request)).encode() + b"\n")
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
                    raise AgentUnavailable(f"the agent's answer on {path} is larger than {MAX_ANSWER} bytes")
        except TimeoutError:
            raise AgentUnavailable(f"the agent did not answer on {path} within {timeout_s:g} s") from None
        except OSError as exc:
            raise AgentUnavailable(f"the agent's socket {path} failed: {exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise AgentUnavailable(f"the agent's answer on {path} is not JSON") from None
    if not isinstance(reply, dict):
        raise AgentUnavailable(f"the agent's answer on {path} is not a JSON object")
    return reply
