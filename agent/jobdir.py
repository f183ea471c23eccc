"""Read what a job leaves in its directory: progress events and attempt records (pure I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub.contract import ATTEMPTS_FILE, PROGRESS_FILE


def read_events(path: Path) -> list[dict[str, Any]]:
    """JSON lines, skipping a torn last line (the writer may be mid-append)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    epoch: float | None = None
    loss: float | None = None
    samples: int | None = None
    total_steps: int | None = None
    total_epochs: int | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    last_time: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    finished: bool = False

    def eta_s(self) -> float | None:
        if self.finished:
            return 0.0
        if self.total_steps is not None and self.step is not None and self.steps_per_s:
            return max(0.0, (self.total_steps - self.step) / self.steps_per_s)
        return None


def _rate(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    dt = float(b["time"]) - float(a["time"])
    if key not in a or key not in b or dt <= 0:
        return None
    rate = (float(b[key]) - float(a[key])) / dt
    return rate if rate > 0 else None


def summarize_progress(job_dir: Path) -> Progress:
    events = read_events(job_dir / PROGRESS_FILE)
    reports = [e for e in events if e.get("event") == "progress"]
    checkpoints = [e for e in events if e.get("event") == "checkpoint"]
    finished = any(e.get("event") == "finished" for e in events)
    if not reports:
        return Progress(finished=finished)
    last = reports[-1]
    # Rate over the recent reports of the current attempt (restarts reset the clock).
    same = [e for e in reports if e.get("attempt") == last.get("attempt")][-20:]
    first = same[0]
    return Progress(
        step=last.get("step"),
        epoch=last.get("epoch"),
        loss=last.get("loss"),
        samples=last.get("samples"),
        total_steps=last.get("total_steps"),
        total_epochs=last.get("total_epochs"),
        steps_per_s=_rate(first, last, "step") if len(same) > 1 else None,
        samples_per_s=_rate(first, last, "samples") if len(same) > 1 else None,
        last_time=last.get("time"),
        last_checkpoint_step=checkpoints[-1].get("step") if checkpoints else None,
        last_checkpoint_time=checkpoints[-1].get("time") if checkpoints else None,
        finished=finished,
    )


def read_attempts(job_dir: Path) -> list[dict[str, Any]]:
    return read_events(job_dir / ATTEMPTS_FILE)
