"""How torchrun's process context forks the training processes and lets them end, in the torchrun process that
forks them (``--run-path``, ``--start-method fork``: :mod:`dlsub.checkpointing.forked_rank`).

Two changes to torch's ``MultiprocessContext``, both made right before it forks (:func:`install`):

* **The heap frozen before the fork.** A forked process shares torchrun's memory until it writes it, and the
  first full collection of Python's garbage collector in it writes the header of every object it tracks:
  torch and what torchrun imported for the processes are about 280,000 objects, and one collection copied
  70 MB of them into each process (measured here: 1.4 MB private at the fork, 71 MB after one collection;
  1.9 MB with the heap frozen). ``gc.freeze()`` moves them out of the collector's reach, in torchrun and in
  every process it forks, as Python's documentation of ``gc.freeze`` advises before a fork. torchrun's own
  objects are long-lived (its modules, its agent) and are left uncollected.
* **A process ends once it has handed torchrun its return value.** torch's ``_wrap`` puts the value in a
  queue and then waits on an event that torchrun's monitor sets once it has read every process's value. That
  event is a multiprocessing ``Condition``, whose ``notify_all`` waits for each process asleep on it to wake
  up and say so. A process killed while it sleeps there never says so, and torchrun waits forever: its
  monitor, and with it the job, hangs with the process a zombie it never reaps. The memory cgroup's OOM
  killer did exactly that to a job near its ``--mem`` (the pages its process copied, above), and the live test
  of a job that asks to be resumed forever hung ten minutes so. The wait buys nothing: torch's queue is a
  ``SimpleQueue``, whose ``put`` has written the value into the pipe before it returns, and torchrun reads a
  process's value whether or not the process still runs (an exit code 0 is no failure). The event this
  module gives the context is already set: nobody waits on it, and setting it wakes nobody.

Only torch's own ``MultiprocessContext`` is touched, and only where it has what this changes; elsewhere
torchrun runs as it always has.
"""

from __future__ import annotations

import functools
import gc
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
    """Have each of torch's process contexts, as it starts its processes, freeze this process's heap and take a
    :class:`ValueHandedBack` for its reading event. Returns whether this torch has the context to change."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return False
    context = getattr(api, "MultiprocessContext", None)
    start = getattr(context, "_start", None)
    if context is None or start is None:
        return False
    if getattr(start, "_dlsub_fork_context", False):
        return True

    @functools.wraps(start)
    def _start(self: Any) -> Any:
        if hasattr(self, "_worker_finished_event"):
            self._worker_finished_event = ValueHandedBack()
        gc.freeze()  # right before the fork: objects made since the last start are frozen too
        return start(self)

    _start._dlsub_fork_context = True  # type: ignore[attr-defined]
    context._start = _start
    return True
