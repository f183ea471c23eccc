"""What earlier runs of the same command measured, for a new job's throughput fit to start from.

A job that has reported nothing is fitted to the optimistic prior and may be
trusted with only a few GPUs (:data:`~dlsub.policies.perf_models.fitted_model.TRUSTED_FACTOR`
times the most it has run on): its first interval runs at its minimum, and
every step up the trust ramp is a restart. On a real cluster most jobs are
another run of a script that has run before, on the same hardware, and
throughput is a property of the code and the hardware, not of the run. So a
job's fit takes its own reports and, at configurations it has not run yet,
what earlier jobs of its application measured: a new job starts at the size
its application scales to, and its own reports take over configuration by
configuration. Until a job reports its gradient noise, it is taken to be
what the first of its application's jobs reported first: the noise at the
start of the same training. (Without it a new job is sized as if a bigger
batch gained nothing, and its first interval is spent at the smallest.)

What counts as one application (a command) is the caller's key: the
simulator's (application, batch size) of a workload row; the live agent's
(uid, partition, digest of the script and its arguments from the library's
start event), so that one user's jobs never shape another's sizing. An
earlier job whose step time, at a configuration the new job has run, is not
within :data:`AGREEMENT` of the new job's own (a different model behind the
same key) is left out.

Bounded: at most ``max_keys`` applications (the least recently recorded is
dropped), the latest ``max_jobs`` jobs of each and ``max_configs``
configurations of each job.
Pure: values in, values out; no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from dlsub.policies.perf_models.fitted_model import GradientStats
from dlsub.policies.perf_models.throughput_fit import StepReport

#: A configuration: nodes, replicas, per-replica (atomic) batch, accumulation steps.
Config = tuple[int, int, int, int]

#: How far (as a ratio) a job's own step time may be from an earlier job's at
#: the same configuration before that job is taken for another model's. Runs
#: of one script on one kind of node measure within a few percent of each other.
AGREEMENT = 1.5


def config_of(report: StepReport) -> Config:
    return (report.nodes, report.replicas, report.atomic_batch, report.accum_steps)


class ScalingHistory:
    """Each application's recent jobs and the step time each measured at each configuration (its latest),
    and the gradient noise its jobs first reported."""

    # The bounds keep the worst case (users submitting many commands, each job reporting many made-up
    # sizes) to about 260,000 reports, tens of MB; a full history costs the commands dropped only their
    # head start. (A Pollux workload has about ten commands, some of thirty jobs.)
    def __init__(self, max_keys: int = 128, max_jobs: int = 32, max_configs: int = 64) -> None:
        self.max_keys = max_keys
        self.max_jobs = max_jobs
        self.max_configs = max_configs
        self._jobs: OrderedDict[Hashable, OrderedDict[Hashable, dict[Config, StepReport]]] = OrderedDict()
        self._version: dict[Hashable, int] = {}
        # Versions come from one counter, so an application dropped and recorded again never repeats a version
        # an answer was cached under (_merged).
        self._clock = 0
        self._grads: dict[Hashable, GradientStats] = {}
        # (application, job) -> (version, own reports, merged): a job asks each decision, the answer
        # changes only when its application's history or its own reports do.
        self._merged: dict[tuple[Hashable, Hashable], tuple[int, tuple[StepReport, ...], list[StepReport]]] = {}

    def record(self, key: Hashable, job: Hashable, reports: Iterable[StepReport],
               grads: GradientStats | None = None) -> None:
        """Take what ``job``, one of the application's jobs, measured (its latest word per configuration)
        and the gradient noise it reported, if the application has none yet. A job that measured nothing
        makes no entry: it would only push out an application that lends something."""
        reports = tuple(reports)
        jobs = self._jobs.get(key)
        if jobs is None and not reports and grads is None:
            return
        if jobs is None:
            jobs = self._jobs[key] = OrderedDict()
            while len(self._jobs) > self.max_keys:
                dropped, _ = self._jobs.popitem(last=False)
                self._version.pop(dropped, None)
                self._grads.pop(dropped, None)
        self._jobs.move_to_end(key)
        steps = jobs.get(job)
        if steps is None:
            steps = jobs[job] = {}
            while len(jobs) > self.max_jobs:
                jobs.popitem(last=False)
        changed = False
        for report in reports:
            config = config_of(report)
            if steps.get(config) != report:
                steps.pop(config, None)
                steps[config] = report
                changed = True
        while len(steps) > self.max_configs:
            del steps[next(iter(steps))]
        if changed:
            self._clock += 1
            self._version[key] = self._clock
        if grads is not None:
            self._grads.setdefault(key, grads)

    def first_grads(self, key: Hashable) -> GradientStats | None:
        """The gradient noise the application's jobs reported first (None: none has reported any)."""
        return self._grads.get(key)

    def reports_for(self, key: Hashable, job: Hashable, own: Sequence[StepReport]) -> list[StepReport]:
        """``job``'s own reports, then what the application's other jobs measured at configurations it has
        not run, newest job first; a job whose step times disagree with its own where both ran is left out."""
        version = self._version.get(key, 0)
        mine = tuple(own)
        cached = self._merged.get((key, job))
        if cached is not None and cached[0] == version and cached[1] == mine:
            return list(cached[2])
        merged = list(mine)
        by_config = {config_of(r): r for r in mine}
        covered = set(by_config)
        for source, steps in reversed(self._jobs.get(key, {}).items()):
            if source == job or not all(_agree(report, steps.get(config)) for config, report in by_config.items()):
                continue
            for config, report in steps.items():
                if config not in covered:
                    covered.add(config)
                    merged.append(report)
        if len(self._merged) >= 16 * self.max_keys:
            self._merged.clear()  # the jobs asking come and go: start afresh now and then
        self._merged[(key, job)] = (version, mine, merged)
        return list(merged)


def _agree(mine: StepReport, theirs: StepReport | None) -> bool:
    return theirs is None or 1 / AGREEMENT <= mine.step_s / theirs.step_s <= AGREEMENT
