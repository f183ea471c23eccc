"""Each elastic job's view for an elastic policy, built from what the job measured (the live side of issue 10).

The agent folds every job's progress reports into the rates it measured at
each size it has run (:class:`~dlsub.job_progress.ProgressSummary`). Here
those become the step-time reports that :func:`dlsub.policies.perf_models.throughput_fit.fit`
takes (the same fit the simulator's online mode uses), and the fit becomes
the job's :class:`~dlsub.policies.perf_models.fitted_model.FittedPerformance`: the
``PerformanceModel`` of the :class:`~dlsub.policies.api.JobView` that the
policy sees. At the sizes a job has not run, the fit takes what the same
user's earlier runs of the same command (script and arguments, as the
library's start event digests them) on the same partition measured
(:class:`~dlsub.policies.perf_models.scaling_history.ScalingHistory`, kept in memory
across jobs), unless their step times disagree with the job's own; and until
it reports its gradient noise, the noise they reported first.
A job that declared its batch limits
(``init(batch_size=BatchSizes(...))``) has the policy choose its batch among
them, with the gradient noise it last reported (none reported: a bigger
batch is assumed to gain nothing). Any other job keeps the global batch it
runs at: as its reports say, else samples-per-second over steps-per-second,
else the model counts in steps of a nominal batch. Remaining work is the
job's declared total steps less its step; unknown otherwise (the policy then
guesses it).

A fit costs tens of milliseconds; it is redone only when what the job
measured has moved at two significant figures (:meth:`LiveModels.model`).
Rates no training has are left out of the fit, and a fit that fails falls
back to the prior: a job's reports are its own word.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from dlsub.agent.observe import KindRun
from dlsub.batch_split import BatchLimits
from dlsub.job_progress import MeasuredConfig, Progress, measured_sizes
from dlsub.policies.actions.goodput_resize_rules import ScaledJob
from dlsub.policies.actions.resize_rules import ElasticJob
from dlsub.policies.api import JobView, Policy
from dlsub.policies.goodput import GoodputPolicy
from dlsub.policies.goodput_types import TypedGoodputPolicy
from dlsub.policies.perf_models.fitted_model import NO_GAIN, FittedPerformance, GradientStats
from dlsub.policies.perf_models.scaling_history import ScalingHistory, config_of
from dlsub.policies.perf_models.throughput_fit import StepReport, fit
from dlsub.site_config.policy_file import AgentPolicy

#: The batch a model counts in when a job's reports give no samples (its rates are then steps/s).
NOMINAL_BATCH = 1024
#: Measured rates outside these bounds (a step a day, or ten thousand a second) are not fitted.
MIN_STEPS_PER_S, MAX_STEPS_PER_S = 1e-5, 1e4

log = logging.getLogger("dlsub.agent")


def sizing_policy(policy: AgentPolicy) -> Policy | None:
    """The policy that sizes elastic jobs live, or None when policy.toml names one that does not learn
    from reports. It is the simulator's ``goodput`` class; its restart margin is the site's: a resize must
    save what a restart costs (``moves.restart_cost_s``) plus ``moves.min_saving_s``. With ``[goodput]
    across_gpu_types`` it is the class the simulator runs as ``goodput`` (:class:`TypedGoodputPolicy`: on a
    partition of one kind the same decisions), which chooses a job's kind and size together; without it, the
    homogeneous class, as before the key was."""
    if policy.policy != GoodputPolicy.name:
        return None
    restart = policy.moves.restart_cost_s + policy.moves.min_saving_s
    if policy.goodput.across_gpu_types:
        return TypedGoodputPolicy(restart_penalty_s=restart, restart_weight=1.0)
    return GoodputPolicy(restart_penalty_s=restart, restart_weight=1.0)


def config_batch(config: MeasuredConfig) -> int | None:
    """Samples in one optimiser step of this configuration: as reported, else samples/s over steps/s."""
    if config.batch:
        return config.batch
    if config.samples_per_s is not None and config.steps_per_s > 0:
        return max(1, round(config.samples_per_s / config.steps_per_s))
    return None


def step_reports(configs: Sequence[MeasuredConfig], default_batch: int) -> list[StepReport]:
    """One report per configuration run: its step time, and each replica's share of its batch per micro-step."""
    out = []
    for c in configs:
        if not MIN_STEPS_PER_S <= c.steps_per_s <= MAX_STEPS_PER_S:
            continue  # no training steps like that: a clock jump, or a report made up
        batch = config_batch(c) or default_batch
        micro = c.accumulation_steps or 1
        atomic = max(1, math.ceil(batch / (c.replicas * micro) - 1e-8))
        out.append(StepReport(c.nodes, c.replicas, atomic, micro - 1, 1.0 / c.steps_per_s))
    return out


def _rounded(x: float) -> float:
    return float(f"{x:.2g}") if x > 0 and math.isfinite(x) else 0.0


#: The commands of one user whose earlier runs are kept to lend their figures (the least recent dropped).
HISTORY_COMMANDS_PER_USER = 64


def command_key(uid: int, partition: str, application: str, kind: str | None) -> Hashable:
    """Where a user's runs of one command on one partition and kind of GPU are kept in their history: the one
    key every run is recorded under and every job looks up, elastic or not."""
    return (uid, partition, application, kind)


class LiveModels:
    """Fitted models of the elastic jobs the agent follows, by dlsub id, refitted when their rates change."""

    def __init__(self) -> None:
        self._fits: dict[str, tuple[Hashable, FittedPerformance]] = {}
        # What earlier runs lend, one history per user: kept when jobs end (that is its use); in memory, so an
        # agent restart starts it afresh. Apart per user because each is bounded (least recently recorded
        # dropped): one user's many commands push out only their own.
        self._histories: dict[int, ScalingHistory] = {}

    def history(self, uid: int) -> ScalingHistory:
        """The user's history of earlier runs (made empty on first use)."""
        return self._histories.setdefault(uid, ScalingHistory(max_keys=HISTORY_COMMANDS_PER_USER))

    def model(self, dlsub_id: str, reports: Sequence[StepReport], batch: int, limits: BatchLimits | None,
              grads: GradientStats) -> FittedPerformance:
        # Step times to two significant figures: a refit only when they move.
        key = (tuple((config_of(r), _rounded(r.step_s)) for r in reports), batch, limits,
               (_rounded(grads.sqr), _rounded(grads.var)))
        cached = self._fits.get(dlsub_id)
        if cached is None or cached[0] != key:
            fixed = BatchLimits(init_batch=batch, max_batch=batch, min_local=1, max_local=batch)
            try:
                fitted = fit(reports)
            except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
                # The job's reports are its own: whatever they say, the others' sizing goes on.
                log.warning("job %s: its throughput reports could not be fitted (%s); using the prior", dlsub_id, exc)
                fitted = fit([])
            cached = (key, FittedPerformance(fitted, limits or fixed, grads))
            self._fits[dlsub_id] = cached
        return cached[1]

    def learn(self, runs: Sequence[KindRun]) -> None:
        """Take what followed jobs that are not elastic measured on each named kind (``Observation.kind_runs``)
        into their users' histories, as an elastic job's runs are taken: a `dlsub estimate` profile of a
        partition's kinds (the same command, arguments and batch as ``dlsub submit --from-estimate`` runs) is
        then what the command's elastic jobs are told of a kind they have not run on (:meth:`per_kind`), the
        one-GPU profile the typed policy bootstraps that kind from, and where a waiting one is placed."""
        for run in runs:
            grads = None if run.grads is None else GradientStats(*run.grads)
            for kind in dict.fromkeys(c.gpu_type for c in run.configs if c.gpu_type):
                configs = [c for c in run.configs if c.gpu_type == kind]
                # The batch it ran there, as an elastic job's own reports are read (LiveModels.scaled).
                reports = step_reports(configs, config_batch(configs[-1]) or NOMINAL_BATCH)
                self.history(run.uid).record(command_key(run.uid, run.partition, run.application, kind),
                                             run.dlsub_id, reports, grads)

    def forget_except(self, live: set[str]) -> None:
        # A job's models per kind are kept as "<dlsub id>@<kind>" (per_kind).
        self._fits = {k: v for k, v in self._fits.items() if k.partition("@")[0] in live}

    def per_kind(self, job: ElasticJob, progress: Progress, here: str | None, kinds: Sequence[str], batch: int,
                 limits: BatchLimits | None, grads: GradientStats, current: FittedPerformance,
                 where: Mapping[str, str] | None = None) -> tuple[dict[str, FittedPerformance], dict[str, float]]:
        """What the typed policy is told of the job on each of ``kinds``, as the simulator tells it
        (``JobView.type_models`` and ``type_rates``): its model on each kind it has reports from (its kind
        now: ``current``, the model it is sized on; another: its own reports there, with what this user's
        earlier runs of the same command measured there), and its samples per second on one GPU of each kind
        it has a model for or that those earlier runs measured (the one-GPU profile the policy bootstraps a
        kind the job has not run on from, Sia's bootstrap). A kind with neither is left out: the policy then
        never puts the job there. ``where``: the partition of each kind, where the site has a partition per
        model (a user's runs are kept per partition and kind); else the job's own."""
        models: dict[str, FittedPerformance] = {}
        profiles: dict[str, FittedPerformance] = {}
        for kind in kinds:
            if kind == here:
                models[kind] = current
                continue
            own = step_reports([c for c in progress.configs if c.gpu_type == kind], batch)
            reports = own
            if progress.application is not None:
                application = command_key(job.uid, (where or {}).get(kind, job.partition), progress.application,
                                          kind)
                reports = self.history(job.uid).reports_for(application, job.dlsub_id, own)
                if own:
                    self.history(job.uid).record(application, job.dlsub_id, own, None)
            if reports:
                (models if own else profiles)[kind] = self.model(f"{job.dlsub_id}@{kind}", reports, batch, limits,
                                                                 grads)
        rates = {}
        for kind, model in {**profiles, **models}.items():
            step = model.step_time((1,), batch)
            if step > 0 and math.isfinite(step):
                rates[kind] = batch / step
        return {k: m for k, m in models.items() if k in rates}, rates

    def scaled(self, job: ElasticJob, progress: Progress, now: float, headroom_gpus: int | None,
               kinds: Sequence[str] = (), where: Mapping[str, str] | None = None) -> ScaledJob:
        """The job as the policy sees it. ``headroom_gpus``: what its user may still add (None: no limit).
        ``kinds``: the GPU kinds of its partition, where the policy chooses among them (its view then has its
        model and one-GPU rate on each kind it has reports from, :meth:`per_kind`); ``where``: each kind's
        partition, where the site has a partition per model.

        A job that declared batch limits (it lets dlsub choose its batch) has the policy pick its batch
        among them, with the gradient noise it last reported; any other keeps the batch it runs."""
        per_node = job.gpus_per_worker  # the policy sizes it in steps of one worker
        limits = BatchLimits.from_event(progress.batch_limits)
        grads = GradientStats(*progress.grads) if progress.grads is not None else NO_GAIN
        # The kind it runs on: Slurm's where its GRES names one (the start event's is the job's word), else its
        # latest start event's.
        here = job.gpu_type if job.gpu_type is not None else progress.gpu_type
        # What it measured on that kind (all of it on untyped GPUs): a fit across kinds would average two speeds
        # of the same job. Right after a move onto another kind (requeued onto gres:gpu:KIND, its first start
        # there not yet read) its latest start still names the kind it left: none of its reports are of this
        # kind yet, and taking them for it would record the old kind's speed as this kind's in its command's
        # history, what the command's next job is placed by. (A start that names no kind, an older library's, is
        # taken to be on Slurm's.)
        if progress.gpu_type is not None and progress.gpu_type != here:
            configs = tuple(c for c in progress.configs if c.gpu_type == here)
        else:
            configs = progress.configs_here
        # The batch it runs, wherever it last measured it: a move does not change it.
        latest = config_batch(progress.configs_here[-1]) if progress.configs_here else None
        samples_known = any(c.samples_per_s is not None or c.batch for c in progress.configs_here)
        batch = latest or (limits.init_batch if limits else NOMINAL_BATCH)
        current = job.gpus_now
        most = job.max_gpus
        if headroom_gpus is not None:
            most = min(most, current + max(0, headroom_gpus) // per_node * per_node)
        remaining = None
        if progress.total_steps is not None and progress.step is not None:
            remaining = float(max(0, progress.total_steps - progress.step))
        ran = progress.ran_s or 0.0
        own = step_reports(configs, batch)
        reports = own
        if progress.application is not None:
            # What this user's earlier runs of the same command measured on this partition and kind of GPU;
            # until the job reports its gradient noise, the noise they reported first (the same training's start).
            application = command_key(job.uid, job.partition, progress.application, here)
            history = self.history(job.uid)
            reports = history.reports_for(application, job.dlsub_id, own)
            history.record(application, job.dlsub_id, own, None if progress.grads is None else grads)
            if progress.grads is None:
                grads = history.first_grads(application) or NO_GAIN
        model = self.model(job.dlsub_id, reports, batch, limits, grads)
        type_models, type_rates = self.per_kind(job, progress, here, kinds, batch, limits, grads, model, where) \
            if kinds else (None, None)
        view = JobView(
            name=job.dlsub_id, arrival_s=job.submit_time, gpus=current,
            min_gpus=job.main_gpus, max_gpus=max(most, job.main_gpus),
            batch_size=batch, adaptive_batch=limits is not None, attained_gpu_s=ran * current,
            remaining=remaining, progress=float(progress.step or 0), restarts=progress.restarts,
            model=model, type_models=type_models, type_rates=type_rates,
        )
        return ScaledJob(job, view, measured_sizes(configs), batch if samples_known else None, limits,
                         borrowed=len(reports) - len(own), gpu_type=here)
