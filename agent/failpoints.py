"""Named points where a test may kill the agent with SIGKILL, as a crash would.

``DLSUB_FAILPOINT=move-signalled dlsub agent tick`` dies, kill -9 style, the
moment the tick passes that point; nothing else changes. Integration tests
use it to prove that a restarted agent finishes or abandons a move cleanly
from every step of it (tests/integration/test_move_crashes.py), and that
it grows or shrinks an elastic job once from every step of a resize
(tests/integration/test_resize_crashes.py).
"""

from __future__ import annotations

import os
import signal

ENV = "DLSUB_FAILPOINT"

#: Every point, in the order a move passes them.
MOVE_POINTS = (
    "move-planned",  # the intent is written; no signal sent yet
    "move-signal-sent",  # the signal is sent; not yet recorded
    "move-signalled",  # the signal is recorded; the job is checkpointing
    "move-retarget",  # the job is requeued held; about to point it at the new partition
    "move-updated",  # pointed there and recorded; not yet released
    "move-released",  # released and recorded; not yet seen running there
)

#: Every point of a resize, in the order a grow then a shrink pass them.
RESIZE_POINTS = (
    "grow-planned",  # the grow is written ahead; the worker not released yet
    "grow-released",  # the worker is released; not yet recorded
    "grow-recorded",  # the release is recorded
    "shrink-planned",  # the shrink is written ahead; no signal sent yet
    "shrink-signal-sent",  # the worker is told to leave; not yet recorded
    "shrink-signalled",  # recorded as leaving: it checkpoints with its group and requeues itself held
)


def reach(point: str) -> None:
    """Die here if the environment names this point."""
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
