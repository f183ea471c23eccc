"""When will the loss reach the target? Optimus's fit of the loss curve (pure).

Optimus (Peng et al., EuroSys '18) models an SGD training loss as
``loss(k) = 1 / (a·k + b) + c`` in the step ``k`` (a, b ≥ 0; c the loss it
tends to) and fits it by least squares to the reports so far. The step at
which the curve reaches a target loss ``X > c`` is ``k = (1/(X - c) - b) / a``.

The confidence is how little that step moves when the fit's parameters move
within their standard errors (the covariance of the least-squares fit): the
ETA is shown only once the fit is stable (enough reports, confidence above
:data:`STABLE_CONFIDENCE`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MIN_POINTS = 8
STABLE_CONFIDENCE = 0.5


@dataclass(frozen=True)
class LossCurve:
    a: float
    b: float
    c: float
    stderr: tuple[float, float, float]  # of a, b, c
    points: int

    def loss(self, step: float) -> float:
        return 1.0 / (self.a * step + self.b) + self.c

    def step_for(self, target: float, *, a: float | None = None, b: float | None = None,
                 c: float | None = None) -> float | None:
        """The step where the curve reaches ``target``; None when it never does (target at or below c)."""
        a, b, c = self.a if a is None else a, self.b if b is None else b, self.c if c is None else c
        if target <= c or a <= 0:
            return None
        return max(0.0, (1.0 / (target - c) - b) / a)


@dataclass(frozen=True)
class TargetEta:
    target_step: float | None  # None: the fitted curve never reaches the target
    confidence: float  # 0..1
    stable: bool


def _model(k: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return 1.0 / (a * k + b) + c


def fit_loss_curve(steps: Sequence[float], losses: Sequence[float]) -> LossCurve | None:
    """Least squares (scipy) over (step, loss); None with too few points or no convergence."""
    # NumPy and SciPy here, not at the top: every dlsub command (status, cancel, logs) imports this module,
    # and NumPy's import alone was 150 ms of the 350 ms each spent importing; only a fit needs them.
    import numpy as np
    from scipy.optimize import curve_fit

    pairs = [(float(s), float(v)) for s, v in zip(steps, losses, strict=True)
             if math.isfinite(float(s)) and math.isfinite(float(v))]
    if len(pairs) < MIN_POINTS:
        return None
    k = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    c0 = max(0.0, float(y.min()) * 0.5)
    b0 = 1.0 / max(1e-6, float(y[0]) - c0)
    slope = (1.0 / max(1e-6, float(y[-1]) - c0) - b0) / max(1.0, float(k[-1] - k[0]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params, cov = curve_fit(_model, k, y, p0=(max(slope, 1e-6), b0, c0),
                                    bounds=([0.0, 1e-9, -np.inf], [np.inf, np.inf, float(y.min())]), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    errs = np.sqrt(np.clip(np.diag(cov), 0, None)) if np.all(np.isfinite(cov)) else np.full(3, np.inf)
    a, b, c = (float(x) for x in params)
    return LossCurve(a, b, c, (float(errs[0]), float(errs[1]), float(errs[2])), len(pairs))


def target_eta(curve: LossCurve | None, target: float) -> TargetEta | None:
    """The step the loss reaches ``target`` at, and how sure the fit is of it."""
    if curve is None:
        return None
    step = curve.step_for(target)
    if step is None:
        return TargetEta(None, 0.0, curve.points >= MIN_POINTS)
    # Spread of the predicted step when each parameter moves by one standard error.
    spreads = []
    for i in range(3):
        for sign in (-1.0, 1.0):
            moved = [curve.a, curve.b, curve.c]
            moved[i] += sign * curve.stderr[i]
            other = curve.step_for(target, a=moved[0], b=moved[1], c=moved[2])
            spreads.append(math.inf if other is None else abs(other - step))
    relative = max(spreads) / max(step, 1.0)
    confidence = 0.0 if not math.isfinite(relative) else 1.0 / (1.0 + relative)
    return TargetEta(step, round(confidence, 3), confidence >= STABLE_CONFIDENCE)
