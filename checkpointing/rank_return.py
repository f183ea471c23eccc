"""A forked training process hands torchrun its return value and ends, instead of waiting to be told it was read.

torchrun's forked processes (``--run-path``, ``--start-method fork``: :mod:`dlsub.checkpointing.forked_rank`)
end in torch's ``_wrap``: the process puts its return value in a queue and then waits on an event that
torchrun's monitor sets once it has read every process's value. That event is a multiprocessing
``Condition``, whose ``notify_all`` waits for each process that went to sleep on it to wake up and say so. A
process killed while it sleeps there never says so, and torchrun waits forever: its monitor, and with it the
job, hangs with the process a zombie it never reaps. The memory cgroup's OOM killer does exactly that: a
forked process's pages are the parent's until it writes them, and its exit (Python's teardown touching every
object) copies them, so a job near its ``--mem`` loses the process there (seen in the testbed: a job of
200 MB, its attempt hung for ten minutes, the test timed out).

The wait buys nothing here: torch's queue is a ``SimpleQueue``, whose ``put`` has written the value into the
pipe before it returns, and torchrun reads a process's value whether or not the process still runs (an exit
code 0 is not a failure). :func:`install` gives torchrun's process context, in the torchrun process, an event
that neither sleeps nor wakes anyone: each forked process ends as soon as its value is in the pipe, and
torchrun's monitor never waits on a process that may be dead.

Only torch's own ``MultiprocessContext`` is touched, and only where it has the event this replaces; elsewhere
torchrun runs as it always has.
"""

from __future__ import annotations

import functools
from typing import Any


class ValueHandedBack:
    """The event torch's ``_wrap`` waits on after it put its process's return value, and torchrun's monitor
    sets once it has read them all: here already set, so that the process ends at once and the monitor waits
    on nobody."""

    def set(self) -> None:
        """Nothing to wake: no process waits."""

    def clear(self) -> None:
        """Stays set: a process never waits for torchrun's read."""

    def is_set(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return True


def install() -> bool:
    """Give each of torch's process contexts, as it starts its processes, a :class:`ValueHandedBack` for its
    reading event. Returns whether this torch had the event to replace (nothing changes where it did not)."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return False
    context = getattr(api, "MultiprocessContext", None)
    start = getattr(context, "_start", None)
    if context is None or start is None or getattr(start, "_dlsub_value_handed_back", False):
        return context is not None and start is not None

    @functools.wraps(start)
    def _start(self: Any) -> Any:
        if hasattr(self, "_worker_finished_event"):
            self._worker_finished_event = ValueHandedBack()
        return start(self)

    _start._dlsub_value_handed_back = True  # type: ignore[attr-defined]
    context._start = _start
    return True
