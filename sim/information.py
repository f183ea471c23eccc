"""What a policy in the simulator is told about a job: the oracle, or only what the live agent could see.

``oracle`` (the simulator's first mode, and what the baselines' papers gave
them): every job's measured performance at every placement and batch size
from its application's traces, and its remaining work.

``online`` (the default for a policy that learns, like ``goodput``): what a
job would have reported to the live agent by now, and nothing else. Each
interval a job runs, it reports the time of its optimiser step at the
configuration it ran (and its compute-only micro-step when it accumulates
gradients) and its gradient noise at the batch size it ran; the policy's
model is :mod:`dlsub.policies.perf_models.throughput_fit` fitted to those reports, as
the agent fits progress reports. (``pollux`` alone has every report carry
its compute time, as Pollux's simulator gave its jobs: see
:func:`information_for`.) Remaining work is told only when the
workload row declares the job's epochs; otherwise the policy sees the work
done so far; a row's ``stated_epochs`` (a user's statement, maybe
wrong) tells the remaining work it implies instead. The batch limits a
job declares (AdaptDL jobs declare them) are known in both modes. The job's own batch-size re-tuning between
epochs uses the same model the policy sees.

History across jobs (what earlier runs of the same command reported, at
configurations the job has not run, and their first gradient noise, as the
live agent keeps it: :mod:`dlsub.policies.perf_models.scaling_history`) is an explicit
option, off by default, because it needs a source a live scheduler would
have. In the simulator every job of an application is an exact clone (the
same traces, the same epochs), so history keyed on the application hands a
job the oracle's throughput at every configuration an earlier clone ran
(issue 22 counted 95% of the jobs at 1.0x load finding one). Sources:

- ``none`` (the default): each job knows only its own reports, as in
  Pollux's own simulator.
- ``columns``: the workload's ``user`` and ``command`` columns name whose
  a job is and what it runs (the agent's uid and command digest); a row
  that leaves either blank gets no history, and a workload that states
  neither column is refused.
- ``one-user``: an assumption, to be labelled wherever it is reported:
  the whole workload is one user's and a command is the row's application
  and batch size (what the simulator assumed before this option existed).

On a cluster with GPU types a policy that is ``type_aware`` (sia) is told
each job's model per type, fitted online to its reports on that type only
(the gradient noise, a property of the model, is shared), and each
type's one-GPU throughput of the job's application (a short profile, which
Sia bootstraps from); any other policy's online fit takes the job's
reports from every type as if they came from one kind of GPU, as Sia's
artifact ran Pollux. The oracle tells every type's true model.

Both are deterministic: no clocks, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from dlsub.policies.api import JobView, PerformanceModel
from dlsub.policies.perf_models.fitted_model import NO_GAIN, BatchLimits, FittedPerformance, GradientStats
from dlsub.policies.perf_models.scaling_history import ScalingHistory
from dlsub.policies.perf_models.throughput_fit import StepReport, ThroughputFit, fit
from dlsub.sim.apps import Application, BatchConfig, normalise

if TYPE_CHECKING:
    from dlsub.sim.engine import SimJob

MODES = ("online", "oracle")
HISTORY_SOURCES = ("none", "columns", "one-user")


class Information(Protocol):
    mode: ClassVar[str]

    def model(self, job: SimJob) -> PerformanceModel:
        """The model behind the job's view and its own batch-size choice."""
        ...

    def view(self, job: SimJob) -> JobView: ...

    def observe(self, job: SimJob) -> None:
        """The job ran this interval: take its report."""
        ...

    def observe_profile(self, job: SimJob, batches: int = 1) -> None:
        """Its one-GPU profile before its first start: keep the step on its fastest type as a report (at
        ``batches`` batch sizes: :func:`profile_batch_sizes`)."""
        ...


def profile_batch_sizes(first: int, largest: int, count: int) -> list[int]:
    """The batch sizes a one-GPU profile times: ``first`` (the job's first batch), then up to ``count`` in all,
    evenly spaced in logs, the last ``largest`` (the most one GPU holds). One step time tells a throughput fit
    nothing of how a step grows with the batch, so the fit's prior says it (half the step fixed), and goodput
    chose batches, and so sizes, off that guess until the job had run a second batch; a second size measured in
    the profile gives the fit its slope from the start, as Sia bootstraps its models from a few batch sizes on
    one GPU (issue 54). Fewer where ``largest`` leaves no room (repeats dropped)."""
    if count <= 1 or largest <= first:
        return [first]
    ratio = largest / first
    sizes = [round(first * ratio ** (k / (count - 1))) for k in range(count)]
    return sorted(set(sizes))


def _view(job: SimJob, model: PerformanceModel, remaining: float | None,
          type_models: dict[str, PerformanceModel] | None = None) -> JobView:
    return JobView(
        name=job.name,
        arrival_s=job.arrival_s,
        gpus=job.gpus,
        min_gpus=job.lo,
        max_gpus=job.hi,
        batch_size=job.batch_size,
        adaptive_batch=job.adaptive,
        attained_gpu_s=job.attained_gpu_s,
        running_since_s=job.running_since_s,
        waiting_since_s=job.waiting_since_s,
        remaining=remaining,
        progress=job.progress,
        restarts=max(job.starts - 1, 0),
        restart_s=job.told_restart_s,
        resize_s=job.told_resize_s,
        restarting_s=job.penalty_left if job.alloc is not None else 0.0,
        model=model,
        type_models=type_models,
        type_rates={t: app.one_gpu_throughput for t, app in job.apps.items()
                    if job.profiled is None or t in job.profiled} if job.apps else None,
    )


class OracleInformation:
    mode: ClassVar[str] = "oracle"

    def model(self, job: SimJob) -> PerformanceModel:
        # Imported here so that online mode never loads the oracle's model.
        from dlsub.sim.performance import performance_at

        return performance_at(job.app, job.epoch, None)

    def view(self, job: SimJob) -> JobView:
        from dlsub.sim.performance import performance_at

        types: dict[str, PerformanceModel] | None = None
        if job.apps:
            types = {t: performance_at(app, job.epoch, None) for t, app in job.apps.items()}
        return _view(job, self.model(job), job.remaining, types)

    def observe(self, job: SimJob) -> None:
        pass

    def observe_profile(self, job: SimJob, batches: int = 1) -> None:
        pass  # the oracle tells every type's model already


@dataclass
class _Reports:
    """One job's reports: the latest step time per configuration, and its latest gradient noise."""

    steps: dict[tuple[int, int, int, int], StepReport] = field(default_factory=dict)
    grads: GradientStats = NO_GAIN
    fitted: ThroughputFit | None = None
    fitted_on: int = -1  # how many configurations the fit has seen
    model: FittedPerformance | None = None


class OnlineInformation:
    mode: ClassVar[str] = "online"

    def __init__(self, history: str = "none", times_compute: bool = False, by_type: bool = False) -> None:
        if history not in HISTORY_SOURCES:
            raise ValueError(f"unknown history source {history!r}; valid: {', '.join(HISTORY_SOURCES)}")
        self.history = history
        # Whether every report carries the compute part of the step (see information_for).
        self.times_compute = times_compute
        # Whether a job's reports are kept (and fitted) apart per GPU type.
        self.by_type = by_type
        self._jobs: dict[tuple[str, str], _Reports] = {}
        self._grads: dict[str, GradientStats] = {}  # each job's latest gradient noise (any type)
        # What earlier runs of each command measured, as the agent keeps it.
        self._history = ScalingHistory()

    def observe(self, job: SimJob) -> None:
        if job.alloc is None or job.config is None:
            return
        self._record(job, job.gpu_type, job.app, normalise(job.placement), job.config)

    def observe_profile(self, job: SimJob, batches: int = 1) -> None:
        """The job's one-GPU profile before its first start (SimConfig.profile_report): its step on the type
        where it runs fastest, at its first batch, kept as its report there (only where reports are kept per
        type). The other types' profiles stay throughputs (JobView.type_rates): taken as reports too, each
        type would have a model of one step, and goodput did worse (module docstring of
        policies/goodput_types.py). ``batches``: a job that lets the policy choose its batch is timed there at
        that many batch sizes (:func:`profile_batch_sizes`, up to the most one GPU holds), each a report, in
        that order (the gradient noise it is told is the last one's, the largest batch's)."""
        if not self.by_type:
            return
        gpu_type = max(job.apps, key=lambda t: job.apps[t].one_gpu_throughput)
        app = job.apps[gpu_type]
        if not job.adaptive:
            self._record(job, gpu_type, app, (1,), app.batch_config(1, job.batch_size))
            return
        largest = min(app.max_local_bsz, app.max_batch_size)
        for batch in profile_batch_sizes(app.init_batch_size, largest, batches):
            self._record(job, gpu_type, app, (1,), app.batch_config(1, batch))

    def _record(self, job: SimJob, gpu_type: str, app: Application, placement: tuple[int, ...],
                config: BatchConfig) -> None:
        reports = self._jobs.setdefault(self._key(job, gpu_type), _Reports())
        # What the job's timers measure: its optimiser step, and a
        # compute-only micro-step when it accumulates gradients.
        step = app.step_time(placement, config)
        micro, sync = app.step_sync(placement, config.atomic)
        key = (len(placement), sum(placement), config.atomic, config.accum_steps)
        reports.steps[key] = StepReport(*key, step_s=step,
                                        compute_s=(micro - sync) if config.accum_steps or self.times_compute
                                        else None)
        sqr, var = app.grad_stats(config.total(sum(placement)), job.epoch)
        grads = GradientStats(sqr, var)
        command = self._command(job, gpu_type)
        if command is not None:
            self._history.record(command, job.name, [reports.steps[key]], grads)
        self._grads[job.name] = grads

    def _key(self, job: SimJob, gpu_type: str) -> tuple[str, str]:
        return job.name, gpu_type if self.by_type else ""

    def _command(self, job: SimJob, gpu_type: str = "") -> tuple[str, ...] | None:
        command = command_of(job, self.history)
        # Kept per type, earlier runs say what a command does on the type they ran on.
        return command + (gpu_type,) if command is not None and self.by_type else command

    def _limits(self, job: SimJob, gpu_type: str = "") -> BatchLimits:
        app = job.apps.get(gpu_type, job.app)
        return BatchLimits(app.init_batch_size, app.max_batch_size, app.min_local_bsz, app.max_local_bsz)

    def model(self, job: SimJob) -> PerformanceModel:
        return self.model_on(job, job.gpu_type)

    def model_on(self, job: SimJob, gpu_type: str) -> PerformanceModel:
        """The job's model from its reports (on ``gpu_type`` alone, when reports are kept per type)."""
        reports = self._jobs.setdefault(self._key(job, gpu_type), _Reports())
        grads_now = self._grads.get(job.name, NO_GAIN)
        if grads_now != reports.grads:
            reports.grads, reports.model = grads_now, None
        command = self._command(job, gpu_type)
        own = list(reports.steps.values())
        steps = own if command is None else self._history.reports_for(command, job.name, own)
        if reports.fitted is None or reports.fitted_on != len(steps):
            # Refit only when a configuration is new, the job's or its application's: a repeated one says the same.
            reports.fitted, reports.fitted_on = fit(steps), len(steps)
            reports.model = None
        if reports.model is None:
            grads = reports.grads
            if not reports.steps:  # it has reported nothing: its gradient noise is its command's first
                grads = (self._history.first_grads(command) if command is not None else None) or NO_GAIN
            reports.model = FittedPerformance(reports.fitted, self._limits(job, gpu_type), grads)
        return reports.model

    def view(self, job: SimJob) -> JobView:
        types = None
        if self.by_type and job.apps:
            # Only the types the job has reports from; a policy bootstraps the others (see JobView).
            types = {t: self.model_on(job, t) for t in job.apps
                     if self._jobs.get(self._key(job, t)) is not None and self._jobs[self._key(job, t)].steps}
        return _view(job, self.model(job), told_remaining(job), types)


def command_of(job: SimJob, history: str) -> tuple[str, ...] | None:
    """The key a job's earlier runs are shared under (the agent's uid and command digest), from the history
    source ``history``; None: no history."""
    if history == "columns":
        spec = job.spec
        return (spec.user, spec.command) if spec.user and spec.command else None
    if history == "one-user":
        # Assumed: the script (the application) and its arguments (the row's batch size), one user's.
        return job.app.name, str(job.spec.batch_size)
    return None


def told_remaining(job: SimJob) -> float | None:
    """The remaining work a job's user has told, online: what its stated epochs imply (as a share of its
    application's work, however far off), else its declared epochs' (exact), else None. A job that has
    run past its statement is told 0 left, as the live agent reads ``total_steps - step``."""
    stated = job.spec.stated_epochs
    if stated is not None:
        return max(job.app.total_progress * stated / job.app.epochs - job.progress, 0.0)
    return job.remaining if job.spec.epochs is not None else None


def information_for(mode: str, policy: object, history: str = "none") -> Information:
    """Online information for a policy that learns (``learns_online``); the
    baselines keep what their papers gave them (the oracle) in either mode.

    A policy whose ``times_compute`` is true has every report carry the
    compute part of its step (the step less its synchronisation), as
    Pollux's simulator gives its jobs (the traces' sync time, fitted on
    every step): pollux, so that it runs as Pollux ran. The live agent's
    jobs time compute alone only when they accumulate gradients."""
    if mode not in MODES:
        raise ValueError(f"unknown information mode {mode!r}; valid: {', '.join(MODES)}")
    if mode == "online" and getattr(policy, "learns_online", False):
        return OnlineInformation(history, times_compute=getattr(policy, "times_compute", False),
                                 by_type=getattr(policy, "type_aware", False))
    return OracleInformation()
