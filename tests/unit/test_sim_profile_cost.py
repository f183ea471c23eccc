"""Unit tests (pure; no Slurm, no GPU): what goodput's one-GPU profile of every type costs in the simulator
(issue 54, ``sim/profile_cost.py``, ``SimConfig.profile_cost``).

The typed traces are made here from the shipped Pollux traces of cifar10: type ``fast`` runs at its step
times, type ``slow`` at exactly twice them, so each wait can be checked against the traces by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typed_traces import write_typed_traces

from dlsub.policies.api import Allocation, ClusterView, Node
from dlsub.policies.goodput_types import TypedGoodputPolicy
from dlsub.policies.registry import get_policy
from dlsub.sim.apps import load_application
from dlsub.sim.engine import SimConfig, make_jobs, simulate
from dlsub.sim.profile_cost import PROFILE_MIN_S, PROFILE_STEPS, modelled_profile_s, timed_s
from dlsub.sim.workload import POLLUX_DIR, WorkloadError, WorkloadJob

SPEC = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]


@pytest.fixture()
def traces(tmp_path: Path) -> Path:
    return write_typed_traces(tmp_path)


def two_types() -> ClusterView:
    return ClusterView((Node("f0", 4, gpu_type="fast"), Node("s0", 4, gpu_type="slow")))


def _step(traces: Path, gpu_type: str, batch: int) -> float:
    app = load_application(traces / "cifar10", gpu_type)
    return app.step_time((1,), app.batch_config(1, batch))


def test_a_profile_times_dlsub_estimates_steps_at_the_jobs_own_step_and_at_least_its_seconds(traces: Path) -> None:
    """Unit: one type's timed part is PROFILE_STEPS of the job's one-GPU step from the traces (slowed by the
    calibration), and never under PROFILE_MIN_S (dlsub estimate's stop rule)."""
    fast = load_application(traces / "cifar10", "fast")
    step = _step(traces, "fast", 128)
    assert timed_s(fast, 128, PROFILE_STEPS, 0.0) == pytest.approx(PROFILE_STEPS * step)
    assert timed_s(fast, 128, PROFILE_STEPS, 0.0, slowdown=1.8) == pytest.approx(PROFILE_STEPS * step * 1.8)
    assert timed_s(fast, 128, 1, PROFILE_MIN_S) == PROFILE_MIN_S  # one step of cifar10 is far under 2 s
    assert step < PROFILE_MIN_S


def test_the_types_are_profiled_side_by_side_so_the_job_waits_for_the_slowest(traces: Path) -> None:
    """Unit: the wait is the start-up plus the slowest type's timed steps: here the slow type's, twice the fast
    one's step, so scaling by the type's speed shows."""
    apps = {t: load_application(traces / "cifar10", t) for t in ("fast", "slow")}
    wait = modelled_profile_s(apps, 128, True, 1, startup_s=25.0, batch_startup_s=0.0, min_s=0.0)
    assert wait == pytest.approx(25.0 + PROFILE_STEPS * _step(traces, "slow", 128))
    assert _step(traces, "slow", 128) == pytest.approx(2 * _step(traces, "fast", 128))
    only_fast = modelled_profile_s({"fast": apps["fast"]}, 128, True, 1, startup_s=25.0, batch_startup_s=0.0,
                                   min_s=0.0)
    assert only_fast < wait
    assert modelled_profile_s({}, 128, True, 1, startup_s=25.0, batch_startup_s=0.0) == 0.0


def test_each_further_batch_size_adds_its_start_up_and_its_steps_on_the_fastest_type(traces: Path) -> None:
    """Unit: a second batch size (the most one GPU holds) is timed on the fast type after its first: the job
    waits for whichever run is longer, and only an adaptive job times it."""
    apps = {t: load_application(traces / "cifar10", t) for t in ("fast", "slow")}
    fast = apps["fast"]
    largest = min(fast.max_local_bsz, fast.max_batch_size)
    wait = modelled_profile_s(apps, 128, True, 2, startup_s=25.0, batch_startup_s=7.0, min_s=0.0)
    fastest_run = 25.0 + PROFILE_STEPS * (_step(traces, "fast", 128) + _step(traces, "fast", largest)) + 7.0
    slowest_run = 25.0 + PROFILE_STEPS * _step(traces, "slow", 128)
    assert fastest_run > slowest_run  # the largest batch's step is the longer here
    assert wait == pytest.approx(fastest_run)
    rigid = modelled_profile_s(apps, 128, False, 2, startup_s=25.0, batch_startup_s=7.0, min_s=0.0)
    assert rigid == pytest.approx(slowest_run)


def test_goodput_alone_is_charged_the_modelled_wait_and_flat_still_charges_the_old_constants(traces: Path) -> None:
    """Unit: SimConfig.profile_cost "steps" charges goodput's first start the modelled wait; sia and pollux
    are charged nothing, as Sia's artifact charges them nothing; "flat" gives back 60 s and 20 s a further
    batch size, as every figure before the measurement was run."""
    steps = SimConfig(profile_cost="steps", profile_startup_s=25.0, profile_batch_startup_s=7.0)
    apps = {t: load_application(traces / "cifar10", t) for t in ("fast", "slow")}
    charged = {name: make_jobs(SPEC, traces, get_policy(name), steps, two_types())[0] for name in ("goodput", "sia",
                                                                                                    "pollux")}
    expected = modelled_profile_s(apps, apps["fast"].init_batch_size, True, 1, startup_s=25.0, batch_startup_s=7.0)
    assert charged["goodput"].profile_s == pytest.approx(expected)
    assert charged["goodput"].profile_s != 60.0
    assert charged["sia"].profile_s == 0.0 and charged["pollux"].profile_s == 0.0
    two = make_jobs(SPEC, traces, TypedGoodputPolicy(profile_batches=2), steps, two_types())[0]
    assert two.profile_s == pytest.approx(modelled_profile_s(apps, apps["fast"].init_batch_size, True, 2,
                                                             startup_s=25.0, batch_startup_s=7.0))
    flat = SimConfig(profile_cost="flat", profile_s=60.0, profile_batch_s=20.0)
    assert make_jobs(SPEC, traces, TypedGoodputPolicy(profile_batches=2), flat, two_types())[0].profile_s == 80.0
    one_type = ClusterView((Node("f0", 4, gpu_type="fast"),))  # one type: nothing to profile
    assert make_jobs(SPEC, traces, get_policy("goodput"), steps, one_type)[0].profile_s == 0.0


def test_the_first_start_waits_its_restart_and_the_modelled_profile(traces: Path) -> None:
    """Unit: the modelled wait is paid at the first start, after which the job holds its GPUs without
    progress; a later restart pays the restart alone."""
    config = SimConfig(profile_cost="steps", profile_startup_s=25.0)
    job = make_jobs(SPEC, traces, get_policy("goodput"), config, two_types())[0]
    job.reallocate(Allocation(("f0",)), 0.0, 30.0, "fast")
    assert job.penalty_left == pytest.approx(30.0 + job.profile_s)
    job.reallocate(Allocation(("s0",)), 60.0, 30.0, "slow")
    assert job.penalty_left == 30.0


def test_an_unknown_profile_cost_is_refused() -> None:
    with pytest.raises(WorkloadError, match="unknown profile cost 'guess'"):
        simulate(SPEC, POLLUX_DIR / "traces", get_policy("goodput"), two_types(), SimConfig(profile_cost="guess"))


def test_by_default_the_wait_is_the_testbeds_measured_start_up_and_end_plus_the_slowest_types_steps(
        traces: Path) -> None:
    """Unit: SimConfig's defaults charge the modelled wait with the testbed's measured start-up (5.7 s) and end
    (0.6 s), and nothing but its steps for a further batch size (timed in the run already started)."""
    job = make_jobs(SPEC, traces, get_policy("goodput"), SimConfig(), two_types())[0]
    fast = load_application(traces / "cifar10", "fast")
    slow_steps = max(PROFILE_STEPS * _step(traces, "slow", fast.init_batch_size), PROFILE_MIN_S)
    assert job.profile_s == pytest.approx(5.7 + 0.6 + slow_steps)
    assert SimConfig().profile_batch_startup_s == 0.0


def test_the_simulated_stop_rule_is_dlsub_estimates() -> None:
    """Unit: the simulator cannot import dlsub.estimate (it is the layer below it), so it keeps the profiling stop
    rule's two figures itself; they must stay those `dlsub estimate` runs with."""
    from dlsub.estimate.estimator import PROFILE_SECONDS
    from dlsub.estimate.estimator import PROFILE_STEPS as ESTIMATE_STEPS

    assert (PROFILE_STEPS, PROFILE_MIN_S) == (ESTIMATE_STEPS, PROFILE_SECONDS)
