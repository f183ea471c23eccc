"""Which jobs ``dlsub status`` lists by default, and the one-line progress bar (pure).

Like squeue (what lives) beside sacct (the history): the default view is
the jobs that are still alive and those that ended in the last day;
``--since DATE`` moves that edge, ``--all`` removes it, and a named JOB is
always shown however old. A job's end is the newest ``end`` record its
attempts left, else when dlsub first saw it ended, else its submission.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable

from dlsub.contract import EVENT_END, JobState
from dlsub.job.user_store import JobRecord
from dlsub.job_progress import Progress

#: The default view reaches back this far for ended jobs.
DEFAULT_WINDOW_S = 24 * 3600
_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SinceError(ValueError):
    """--since cannot be read; the message says what to write."""


def parse_since(text: str, now: float) -> float:
    """``--since``: an ISO date or date-time (local time), or an age such as ``2d``, ``12h``, ``30m``."""
    value = text.strip()
    relative = _RELATIVE.fullmatch(value.lower())
    if relative:
        return now - float(relative.group(1)) * _UNIT_S[relative.group(2)]
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise SinceError(f"--since {text!r}: give a date (2026-11-20), a date and time (2026-11-20T09:30) "
                         "or an age (12h, 2d, 1w)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as `date` prints it
    return moment.timestamp()


def is_ended(state: str | None) -> bool:
    return state is not None and state != JobState.UNKNOWN.value and JobState(state).terminal


def maybe_in_window(record: JobRecord, since: float) -> bool:
    """Before asking Slurm: False only for a job the store already knows ended before ``since``.

    An ended job changes state again only if slurmctld requeues it
    (``scontrol requeue`` of a finished batch job, an admin's rare act), so
    such a job needs no squeue or sacct call and no job-directory read;
    one requeued after the window is shown by name or with ``--all``.
    """
    if not is_ended(record.state):
        return True
    return max(record.state_at or 0.0, record.submitted_at) >= since


def ended_at(record: JobRecord, attempts: Iterable[dict[str, object]]) -> float:
    """When the job ended, as well as its records say."""
    ends = [float(t) for a in attempts
            if a.get("event") == EVENT_END and isinstance(t := a.get("time"), (int, float))]
    if ends:
        return max(ends)
    return record.state_at or record.submitted_at


def fraction_done(progress: Progress) -> float | None:
    """How much of its declared total (steps, else epochs) the job has done; None when it declared none."""
    if progress.finished:
        return 1.0
    if progress.total_steps and progress.step is not None:
        return min(1.0, max(0.0, progress.step / progress.total_steps))
    if progress.total_epochs and progress.epoch is not None:
        return min(1.0, max(0.0, progress.epoch / progress.total_epochs))
    return None


def progress_bar(fraction: float | None, width: int = 20) -> str:
    """``[#########-----------]  45%``, or ``-`` when the total is not known."""
    if fraction is None:
        return "-"
    filled = int(round(fraction * width))
    return f"[{'#' * filled}{'-' * (width - filled)}] {fraction * 100:3.0f}%"
