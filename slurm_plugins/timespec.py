"""Slurm's time-limit formats, parsed and printed (pure)."""

from __future__ import annotations

import re

_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_PATTERN = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)


class TimeSpecError(ValueError):
    """A time limit that is not in one of Slurm's formats."""


def parse_time_limit(text: str) -> int:
    """Return the limit in whole minutes (seconds round up, as Slurm does).

    Accepts what ``sbatch --time`` accepts: ``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``.
    """
    m = _PATTERN.match(text.strip())
    if not m:
        raise TimeSpecError(f"{text!r} is not a time limit; use one of {_FORMATS} (e.g. 90, 1:30:00, 2-00)")
    if m.group("days") is not None:
        days, hours = int(m.group("days")), int(m.group("dh"))
        minutes, seconds = int(m.group("dm") or 0), int(m.group("ds") or 0)
    else:
        parts = [int(p) for p in (m.group("a"), m.group("b"), m.group("c")) if p is not None]
        days = 0
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total_seconds <= 0:
        raise TimeSpecError(f"{text!r} is zero; give a positive time limit ({_FORMATS})")
    return -(-total_seconds // 60)


def format_minutes(minutes: int) -> str:
    """Minutes as Slurm prints them: ``D-HH:MM:SS`` or ``HH:MM:SS``."""
    days, rest = divmod(int(minutes), 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def parse_slurm_duration(text: str) -> int | None:
    """A limit as ``scontrol`` prints it (``UNLIMITED``, ``00:10:00``, ``1-00:00:00``) in minutes."""
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    return parse_time_limit(text)
