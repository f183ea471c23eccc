"""What ``dlsub status`` adds for a job: node-hours and cost so far, and the loss-curve ETA.

Cost is from the job's attempt records (start and end of each Slurm
attempt, a running one up to now) at the policy's ``cost_per_node_hour``.
With a target loss (``dlsub submit --target-loss`` or
``checkpointing.init(target_loss=)``, recorded in the progress reports)
the Optimus fit of the loss curve (:mod:`dlsub.job.loss_curve`) says at
which step the target is reached; the ETA is shown once the fit is stable.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlsub.contract import EVENT_PROGRESS, PROGRESS_FILE
from dlsub.job.loss_curve import fit_loss_curve, target_eta
from dlsub.job_progress import read_events
from dlsub.site_config.cost import Prices, job_spend

#: Reports the fit uses at most (the newest): bounded work per job and status call.
MAX_POINTS = 2000


@dataclass(frozen=True)
class Extra:
    node_hours: float | None = None
    cost: float | None = None
    target_loss: float | None = None
    target_step: int | None = None
    loss_eta_s: float | None = None
    eta_confidence: float | None = None


@functools.lru_cache(maxsize=1)
def site_prices() -> Prices:
    """The policy's prices (none when the policy cannot be read)."""
    from dlsub.site_config.policy_file import PolicyFileError, load_policy

    try:
        policy = load_policy()
    except PolicyFileError:
        return Prices()
    return policy.prices()


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def loss_eta(events: Sequence[dict[str, Any]], steps_per_s: float | None) -> Extra:
    """The loss-curve ETA from a job's progress events (pure); empty without a target."""
    reports = [e for e in events if e.get("event") == EVENT_PROGRESS][-MAX_POINTS:]
    target = next((t for e in reversed(reports) if (t := _finite(e.get("target_loss"))) is not None), None)
    if target is None:
        return Extra()
    points = [(s, v) for e in reports
              if (s := _finite(e.get("step"))) is not None and (v := _finite(e.get("loss"))) is not None]
    if not points:
        return Extra(target_loss=target)
    step_now = points[-1][0]
    eta = target_eta(fit_loss_curve([s for s, _ in points], [v for _, v in points]), target)
    if eta is None or not eta.stable or eta.target_step is None:
        return Extra(target_loss=target, eta_confidence=None if eta is None else eta.confidence)
    remaining = max(0.0, eta.target_step - step_now)
    seconds = remaining / steps_per_s if steps_per_s else None
    return Extra(target_loss=target, target_step=int(round(eta.target_step)),
                 loss_eta_s=None if seconds is None else round(seconds, 1), eta_confidence=eta.confidence)


def job_extra(job_dir: Path, attempts: Sequence[dict[str, Any]], nodes: int, steps_per_s: float | None,
              now: float | None = None) -> Extra:
    spent = job_spend(attempts, nodes, site_prices(), time.time() if now is None else now)
    eta = loss_eta(read_events(job_dir / PROGRESS_FILE), steps_per_s)
    return Extra(round(spent.node_hours, 4), round(spent.cost, 4), eta.target_loss, eta.target_step,
                 eta.loss_eta_s, eta.eta_confidence)
