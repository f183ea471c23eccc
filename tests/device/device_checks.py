"""What the device checks share: a check's failure in words, running one check so that it always reports, and a free
port on loopback."""

from __future__ import annotations

import socket
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Failed(Exception):
    """A check's expectation not met (its message says which); other exceptions also carry their traceback."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


def run_check(check: Callable[[T], dict[str, Any]], argument: T) -> dict[str, Any]:
    """``check(argument)``'s figures with ``passed`` and ``seconds``, or what made it fail: every check reports,
    whatever the one before did."""
    began = time.perf_counter()
    try:
        result: dict[str, Any] = {"passed": True, **check(argument)}
    except Exception as exc:  # noqa: BLE001 -- reported, not raised
        result = {"passed": False, "error": str(exc)[-4000:],
                  "traceback": None if isinstance(exc, Failed) else traceback.format_exc()[-4000:]}
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a group's store or a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
