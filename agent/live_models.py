"""Each elastic job's view for an elastic policy, built from what the job measured (the live side of issue 10).

The agent folds every job's progress reports into the rates it measured at
each size it has run (:class:`~dlsub.agent.jobdir.ProgressSummary`). Here
those become the step-time reports that :func:`dlsub.policies.throughput_fit.fit`
takes (the same fit the simulator's online mode uses), and the fit becomes
the job's :class:`~dlsub.policies.fitted_model.FittedPerformance`: the
``PerformanceModel`` of the :class:`~dlsub.policies.api.JobView` that the
policy sees. A job keeps the global batch it runs at (it did not opt in to
dlsub choosing it); where its reports give samples, one step is
samples-per-second over steps-per-second samples, else the model counts in
steps of a nominal batch. Remaining work is the job's declared total steps
less its step; unknown otherwise (the policy then guesses it).

A fit costs milliseconds; it is redone only when what the job measured has
changed by more than the rounding in :func:`_measured_key`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dlsub.agent.jobdir import Progress
from dlsub.agent.policy_file import AgentPolicy
from dlsub.policies.api import JobView, Policy
from dlsub.policies.fitted_model import NO_GAIN, BatchLimits, FittedPerformance
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.goodput_resize import ScaledJob
from dlsub.policies.resize import ElasticJob
from dlsub.policies.throughput_fit import StepReport, fit

#: The batch a model counts in when a job's reports give no samples (its rates are then steps/s).
NOMINAL_BATCH = 1024

Measured = Mapping[tuple[int, int], tuple[float, float | None]]


def sizing_policy(policy: AgentPolicy) -> Policy | None:
    """The policy that sizes elastic jobs live, or None when policy.toml names one that does not learn
    from reports. It is the simulator's ``goodput`` class; its restart margin is the site's: a resize must
    save what a restart costs (``moves.restart_cost_s``) plus ``moves.min_saving_s``."""
    if policy.policy != GoodputPolicy.name:
        return None
    return GoodputPolicy(restart_penalty_s=policy.moves.restart_cost_s + policy.moves.min_saving_s,
                         restart_weight=1.0)


def global_batch(measured: Measured) -> int | None:
    """Samples in one optimiser step, from the newest size whose reports give samples."""
    for (_, _), (steps, samples) in sorted(measured.items(), reverse=True):
        if samples is not None and steps > 0:
            return max(1, round(samples / steps))
    return None


def step_reports(measured: Measured, batch: int) -> list[StepReport]:
    """One report per size run: its step time, each replica's share of the (fixed) global batch."""
    return [StepReport(nodes, replicas, max(1, round(batch / replicas)), 0, 1.0 / steps)
            for (nodes, replicas), (steps, _) in sorted(measured.items()) if steps > 0]


def _measured_key(measured: Measured) -> tuple[tuple[int, int, float], ...]:
    """The measured rates to two significant figures: a refit only when they move."""
    def rounded(x: float) -> float:
        return float(f"{x:.2g}") if x > 0 and math.isfinite(x) else 0.0
    return tuple((n, r, rounded(steps)) for (n, r), (steps, _) in sorted(measured.items()))


class LiveModels:
    """Fitted models of the elastic jobs the agent follows, by dlsub id, refitted when their rates change."""

    def __init__(self) -> None:
        self._fits: dict[str, tuple[tuple[tuple[int, int, float], ...], int, FittedPerformance]] = {}

    def model(self, dlsub_id: str, measured: Measured, batch: int) -> FittedPerformance:
        key = _measured_key(measured)
        cached = self._fits.get(dlsub_id)
        if cached is None or cached[0] != key or cached[1] != batch:
            fitted = fit(step_reports(measured, batch))
            limits = BatchLimits(init_batch=batch, max_batch=batch, min_local=1, max_local=batch)
            cached = (key, batch, FittedPerformance(fitted, limits, NO_GAIN))
            self._fits[dlsub_id] = cached
        return cached[2]

    def forget_except(self, live: set[str]) -> None:
        self._fits = {k: v for k, v in self._fits.items() if k in live}

    def scaled(self, job: ElasticJob, progress: Progress, now: float, headroom_gpus: int | None) -> ScaledJob:
        """The job as the policy sees it. ``headroom_gpus``: what its user may still add (None: no limit)."""
        per_node = max(1, job.gpus_per_node)
        measured = progress.measured
        samples_batch = global_batch(measured)
        batch = samples_batch or NOMINAL_BATCH
        current = job.nodes_now * per_node
        most = job.max_nodes * per_node
        if headroom_gpus is not None:
            most = min(most, current + max(0, headroom_gpus) // per_node * per_node)
        remaining = None
        if progress.total_steps is not None and progress.step is not None:
            remaining = float(max(0, progress.total_steps - progress.step))
        ran = progress.ran_s or 0.0
        view = JobView(
            name=job.dlsub_id, arrival_s=job.submit_time, gpus=current,
            min_gpus=job.min_nodes * per_node, max_gpus=max(most, job.min_nodes * per_node),
            batch_size=batch, adaptive_batch=False, attained_gpu_s=ran * current,
            remaining=remaining, progress=float(progress.step or 0),
            model=self.model(job.dlsub_id, measured, batch),
        )
        return ScaledJob(job, view, measured, samples_batch)
