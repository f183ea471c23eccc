"""Unit tests (pure; no Slurm): clusters with GPU types in the simulator.

The typed traces are made here from the shipped Pollux traces of cifar10:
type ``fast`` runs at its step times, type ``slow`` at exactly twice them,
so every figure below can be checked by hand.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner
from typed_traces import write_typed_traces

from dlsub.cli.main import main
from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, Jobs, Node
from dlsub.policies.registry import get_policy
from dlsub.sim import sia_setting
from dlsub.sim.apps import TraceError, load_application, profiled_types
from dlsub.sim.cluster_file import ClusterFileError, load_cluster
from dlsub.sim.engine import SimConfig, make_jobs, run_interval, simulate
from dlsub.sim.information import profile_batch_sizes
from dlsub.sim.performance import performance_at
from dlsub.sim.workload import POLLUX_DIR, WorkloadError, WorkloadJob, read_workload

CIFAR = POLLUX_DIR / "traces" / "cifar10"


@pytest.fixture()
def typed_traces(tmp_path: Path) -> Path:
    """traces/cifar10 with placements-<type>.csv and scalability-<type>.csv for types fast and slow (2x)."""
    return write_typed_traces(tmp_path)


def two_types(fast_nodes: int = 1, slow_nodes: int = 1, per_node: int = 4) -> ClusterView:
    return ClusterView(tuple(Node(f"f{i}", per_node, gpu_type="fast") for i in range(fast_nodes))
                       + tuple(Node(f"s{i}", per_node, gpu_type="slow") for i in range(slow_nodes)))


# -- readers ------------------------------------------------------------------


def test_cluster_file_reads_gpu_types_and_refuses_half_typed(tmp_path: Path) -> None:
    good = tmp_path / "c.toml"
    good.write_text('[[group]]\nnodes = 2\ngpus_per_node = 4\ngpu_type = "aws"\n'
                    '[[group]]\npartition = "big"\nnodes = 1\ngpus_per_node = 8\ngpu_type = "dgx-ext"\n')
    cluster = load_cluster(good)
    assert cluster.gpu_types() == ["aws", "dgx-ext"] and cluster.total_gpus == 16
    assert [n.gpu_type for n in cluster.nodes] == ["aws", "aws", "dgx-ext"]
    half = tmp_path / "half.toml"
    half.write_text('[[group]]\nnodes = 2\ngpu_type = "aws"\n[[group]]\nnodes = 1\n')
    with pytest.raises(ClusterFileError, match="some groups name a gpu_type"):
        load_cluster(half)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[group]]\nnodes = 2\ngpu_type = 3\n')
    with pytest.raises(ClusterFileError, match="gpu_type must be"):
        load_cluster(bad)


def test_typed_traces_read_per_type(typed_traces: Path) -> None:
    fast = load_application(typed_traces / "cifar10", "fast")
    slow = load_application(typed_traces / "cifar10", "slow")
    assert profiled_types(typed_traces / "cifar10") == ["fast", "slow"]
    config = fast.batch_config(4, 512)
    assert slow.step_time((4,), config) == pytest.approx(2 * fast.step_time((4,), config))
    assert slow.one_gpu_throughput == pytest.approx(fast.one_gpu_throughput / 2)
    assert fast.one_gpu_throughput > 0
    with pytest.raises(TraceError, match="profiled types: fast, slow"):
        load_application(typed_traces / "cifar10", "tpu")


def test_sia_workload_with_decimal_arrivals_reads(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,107.25,cifar10,2,256\n")
    assert read_workload(path)[0].arrival_s == 107.25


def test_a_type_the_traces_lack_is_a_clear_workload_error(typed_traces: Path) -> None:
    cluster = ClusterView((Node("t0", 4, gpu_type="tpu"),))
    with pytest.raises(WorkloadError, match="not profiled on GPU type 'tpu'"):
        simulate([WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)], typed_traces, get_policy("sia"), cluster)


# -- the engine -----------------------------------------------------------------


class _Scripted:
    """A policy that puts the one job on these nodes until ``switch_s``, then on those."""

    name: ClassVar[str] = "scripted"
    elastic: ClassVar[bool] = True

    def __init__(self, before: tuple[str, ...], after: tuple[str, ...], switch_s: float) -> None:
        self.before, self.after, self.switch_s = before, after, switch_s

    def decide(self, jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations) -> Decision:
        nodes = self.before if now < self.switch_s else self.after
        return {job.name: Allocation(nodes) for job in jobs}


def _one_job(typed_traces: Path, policy: object, cluster: ClusterView, **config: object) -> tuple[float, int]:
    result = simulate([WorkloadJob("cifar10-0", 0.0, "cifar10", 4, 512, epochs=10)], typed_traces,
                      policy, cluster, SimConfig(**config))  # type: ignore[arg-type]
    job = result.jobs[0]
    assert job.jct_s is not None
    return job.jct_s, job.restarts


def test_a_job_runs_at_its_types_speed_and_a_type_change_restarts_it(typed_traces: Path) -> None:
    cluster = two_types()
    fast, restarts_fast = _one_job(typed_traces, _Scripted(("f0",) * 4, ("f0",) * 4, 1e9), cluster)
    slow, restarts_slow = _one_job(typed_traces, _Scripted(("s0",) * 4, ("s0",) * 4, 1e9), cluster)
    assert restarts_fast == restarts_slow == 0
    # Both start at the first tick (60 s) and pay one start (30 s); the slow type's steps take twice as long.
    assert slow - 90 == pytest.approx(2 * (fast - 90), rel=0.02)
    moved, restarts = _one_job(typed_traces, _Scripted(("f0",) * 4, ("s0",) * 4, 180), cluster)
    assert restarts == 1  # the change of type restarted it
    assert fast < moved < slow  # from its checkpoint: the work done on the fast type was kept
    no_penalty, _ = _one_job(typed_traces, _Scripted(("f0",) * 4, ("s0",) * 4, 180), cluster, restart_penalty_s=0)
    # Two starts of 30 s: the first costs 30 s of fast work (60 s on the slow type it finishes on), the second 30 s.
    assert moved - no_penalty == pytest.approx(90, abs=2)


def test_a_decision_across_types_keeps_the_type_holding_most(typed_traces: Path) -> None:
    cluster = two_types()
    split, _ = _one_job(typed_traces, _Scripted(("f0",) * 3 + ("s0",), ("f0",) * 3 + ("s0",), 1e9), cluster)
    three_fast, _ = _one_job(typed_traces, _Scripted(("f0",) * 3, ("f0",) * 3, 1e9), cluster)
    assert split == three_fast  # the slow GPU was dropped: the job ran on the 3 fast ones alone


def test_calibration_sia_slows_progress_and_sets_restart_penalties(typed_traces: Path) -> None:
    cluster = two_types()
    plain, _ = _one_job(typed_traces, _Scripted(("f0",) * 4, ("f0",) * 4, 1e9), cluster)
    calibrated, _ = _one_job(typed_traces, _Scripted(("f0",) * 4, ("f0",) * 4, 1e9), cluster, calibration="sia")
    # cifar10: 1.8x slower, and a 50 s start instead of 30 s (after the first tick, 60 s).
    assert calibrated - 110 == pytest.approx(1.8 * (plain - 90), rel=0.02)


def test_type_unaware_policies_are_capped_at_the_smallest_type(typed_traces: Path) -> None:
    cluster = two_types(fast_nodes=1, slow_nodes=3)
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    pollux = make_jobs(spec, typed_traces, get_policy("pollux"), SimConfig(), cluster)[0]
    sia = make_jobs(spec, typed_traces, get_policy("sia"), SimConfig(), cluster)[0]
    assert pollux.hi == 4 and sia.hi > 4


def test_simulate_command_runs_a_typed_cluster(typed_traces: Path, tmp_path: Path) -> None:
    workload = tmp_path / "w.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\n"
                        "cifar10-0,0.5,cifar10,2,256\ncifar10-1,90.25,cifar10,2,256\n")
    cluster = tmp_path / "c.toml"
    cluster.write_text('[[group]]\nnodes = 1\ngpus_per_node = 4\ngpu_type = "fast"\n'
                       '[[group]]\nnodes = 1\ngpus_per_node = 4\ngpu_type = "slow"\n')
    for policy in ("sia", "pollux", "goodput"):
        result = CliRunner().invoke(main, ["simulate", str(workload), "--policy", policy, "--cluster", str(cluster),
                                           "--traces", str(typed_traces), "--json"])
        assert result.exit_code == 0, result.output
        assert '"completed": 2' in result.output


def test_sia_is_told_models_only_for_the_types_a_job_has_reported_from(typed_traces: Path) -> None:
    cluster = two_types()
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    job = make_jobs(spec, typed_traces, get_policy("sia"), SimConfig(), cluster)[0]
    assert job.view().type_models == {}  # nothing reported yet: sia gives it one GPU of any type
    job.reallocate(Allocation(("f0", "f0")), 0.0, 30.0, "fast")
    job.advance(0.0, 60.0)
    job.info.observe(job)
    view = job.view()
    assert view.type_models is not None and set(view.type_models) == {"fast"}
    assert view.type_rates is not None and view.type_rates["fast"] == pytest.approx(2 * view.type_rates["slow"])
    # pollux is told no types: one pool, one model fitted to every report.
    unaware = make_jobs(spec, typed_traces, get_policy("pollux"), SimConfig(), cluster)[0]
    assert unaware.view().type_models is None


def test_native_writes_to_stdout_go_to_stderr_while_simulating() -> None:
    """HiGHS (sia's solver) sometimes prints a diagnostic line on descriptor 1 (seen on Philly workload-1);
    `dlsub simulate --json` must still print JSON alone. A real subprocess, so that native writes are real."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = ("import os\nfrom dlsub.cli.simulate_command import _native_stdout_to_stderr\n"
            "with _native_stdout_to_stderr():\n    os.write(1, b'native noise\\n')\nprint('{}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         timeout=120)
    assert out.stdout == "{}\n" and "native noise" in out.stderr


def test_goodput_pays_for_the_profile_of_every_type_it_reads(typed_traces: Path) -> None:
    """Unit: goodput reads each job's one-GPU profile of every type (type_rates). Profiled "before" its first
    start (the default), that start waits longer (charged flat here: SimConfig.profile_s; the modelled charge:
    tests/unit/test_sim_profile_cost.py); profiled "beside", no start waits and
    the profiles are still owed. sia and pollux are charged nothing (as Sia's artifact charges nothing)."""
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    before = SimConfig(profile_s=45.0, profile_cost="flat")
    charged = {name: make_jobs(spec, typed_traces, get_policy(name), before, two_types())[0]
               for name in ("goodput", "sia", "pollux")}
    assert {name: j.profile_s for name, j in charged.items()} == {"goodput": 45.0, "sia": 0.0, "pollux": 0.0}
    assert all(j.profiled is None for j in charged.values())  # every type's profile known from arrival
    beside = {name: make_jobs(spec, typed_traces, get_policy(name), SimConfig(profile_s=45.0, profile="beside"),
                              two_types())[0]
              for name in ("goodput", "sia")}
    assert beside["goodput"].profile_s == 0.0 and beside["goodput"].profiled == frozenset()
    assert beside["goodput"].view().type_rates == {}  # told no type's profile yet
    assert beside["sia"].profiled is None and set(beside["sia"].view().type_rates or {}) == {"fast", "slow"}
    one_type = ClusterView((Node("f0", 4, gpu_type="fast"),))
    assert make_jobs(spec, typed_traces, get_policy("goodput"), before, one_type)[0].profile_s == 0.0
    assert make_jobs(spec, typed_traces, get_policy("goodput"), SimConfig(profile="beside"), one_type)[0].profiled \
        is None


def test_a_profile_beside_the_job_takes_an_idle_gpu_of_its_type_and_never_delays_the_job(
        typed_traces: Path) -> None:
    """Unit: SimConfig.profile "beside". The type a job starts on is its own first run; another type is
    profiled on one of its GPUs the decision left idle (its GPU-seconds the job's), and told from the next
    decision on; a type with no idle GPU waits for a decision that leaves one."""
    from dlsub.sim.engine import start_profiles

    cluster = two_types(per_node=2)
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128), WorkloadJob("cifar10-1", 1.0, "cifar10", 1, 128),
            WorkloadJob("cifar10-2", 2.0, "cifar10", 1, 128)]
    beside = SimConfig(profile_s=45.0, profile="beside")
    first, second, third = make_jobs(spec, typed_traces, get_policy("goodput"), beside, cluster)
    first.reallocate(Allocation(("f0",)), 0.0, 30.0, "fast")
    assert first.penalty_left == 30.0  # the restart alone: no profile to wait for
    assert first.profiled == {"fast"}
    second.reallocate(Allocation(("s0", "s0")), 0.0, 30.0, "slow")  # every slow GPU taken
    start_profiles([first, second, third], cluster, cluster.type_of(), 45.0)
    assert first.profiled == {"fast"} and first.attained_gpu_s == 0.0  # no idle slow GPU: not yet
    assert second.profiled == {"fast", "slow"} and second.attained_gpu_s == 45.0
    assert third.profiled == frozenset() and third.view().type_rates == {}  # the one idle fast GPU went to second
    second.reallocate(None, 60.0, 30.0)
    start_profiles([first, second, third], cluster, cluster.type_of(), 45.0)
    assert first.profiled == {"fast", "slow"} and first.attained_gpu_s == 45.0
    assert third.profiled == {"fast", "slow"} and third.attained_gpu_s == 90.0
    assert set(third.view().type_rates or {}) == {"fast", "slow"}


def test_profiles_from_history_are_the_types_a_commands_earlier_runs_ran_on(typed_traces: Path) -> None:
    """Unit: SimConfig.profile "history", as the live agent learns a kind: a job is told a type's profile once
    it, or an earlier run of its command, ran there (from the decision after); nothing is charged; a job of
    another command learns nothing from them."""
    from dlsub.sim.engine import share_profiles

    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128), WorkloadJob("cifar10-1", 1.0, "cifar10", 1, 128),
            WorkloadJob("cifar10-2", 2.0, "cifar10", 1, 64)]  # one-user: another batch is another command
    config = SimConfig(profile="history", history="one-user")
    first, second, other = make_jobs(spec, typed_traces, get_policy("goodput"), config, two_types())
    assert first.profile_s == 0.0 and first.profiled == frozenset()
    ran_on: dict[tuple[str, ...], set[str]] = {}
    first.reallocate(Allocation(("s0",)), 0.0, 30.0, "slow")
    share_profiles([first, second, other], ran_on, "one-user")
    assert first.profiled == {"slow"} and second.profiled == frozenset()  # told from the next decision on
    share_profiles([first, second, other], ran_on, "one-user")
    assert second.profiled == {"slow"} and set(second.view().type_rates or {}) == {"slow"}
    assert other.profiled == frozenset()
    assert first.attained_gpu_s == second.attained_gpu_s == 0.0
    with pytest.raises(WorkloadError, match="needs a history source"):
        simulate(spec, typed_traces, get_policy("goodput"), two_types(), SimConfig(profile="history"))


def test_the_profile_on_the_fastest_type_is_the_jobs_first_report_there(typed_traces: Path) -> None:
    """Unit: SimConfig.profile_report (profiled "before", the default). The profile's one-GPU step on the type
    where the job runs fastest is kept as its report there before its first start, so goodput may start it
    on more than one GPU; without it the first start is on one GPU, as a job with no reports gets."""
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    job = make_jobs(spec, typed_traces, get_policy("goodput"), SimConfig(information="online"), two_types())[0]
    assert job.view().type_models == {}
    job.info.observe_profile(job)
    assert set(job.view().type_models or {}) == {"fast"}  # the slow type stays a throughput (type_rates)
    first: dict[bool, int] = {}
    for kept in (True, False):
        policy = get_policy("goodput")
        decide = policy.decide
        seen: list[int] = []

        def record(jobs: Jobs, cluster: ClusterView, now: float, previous: Allocations,
                   decide: object = decide, seen: list[int] = seen) -> Decision:
            decision = decide(jobs, cluster, now, previous)  # type: ignore[operator]
            if not seen and decision.get("cifar10-0") is not None:
                seen.append(decision["cifar10-0"].gpus)
            return decision

        policy.decide = record  # type: ignore[method-assign]
        result = simulate(spec, typed_traces, policy, two_types(),
                          SimConfig(information="online", profile_report=kept))
        assert result.jobs[0].completion_s is not None
        first[kept] = seen[0]
    assert first[False] == 1 and first[True] > 1


def test_profile_batch_sizes_run_from_the_first_batch_to_the_most_one_gpu_holds_evenly_in_logs() -> None:
    assert profile_batch_sizes(128, 1024, 1) == [128]
    assert profile_batch_sizes(128, 1024, 2) == [128, 1024]
    assert profile_batch_sizes(128, 1024, 4) == [128, 256, 512, 1024]
    assert profile_batch_sizes(128, 128, 3) == [128]  # no room: one
    assert profile_batch_sizes(128, 130, 4) == [128, 129, 130]  # repeats dropped


def test_a_profile_of_two_batch_sizes_gives_the_fit_the_step_at_the_largest_and_costs_its_steps(
        typed_traces: Path) -> None:
    """Unit: a policy whose profile_batches is 2 has the one-GPU profile on the job's fastest type timed at its
    first batch and at the most one GPU holds, both kept as reports: its model there then predicts the large
    batch's step as measured, where one report left it to the fit's prior. The job's first start waits
    SimConfig.profile_batch_s longer for it."""
    from dlsub.policies.goodput_types import TypedGoodputPolicy

    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    config = SimConfig(information="online", profile_s=60.0, profile_batch_s=20.0, profile_cost="flat")
    errors = {}
    for batches in (1, 2):
        policy = TypedGoodputPolicy(profile_batches=batches)
        job = make_jobs(spec, typed_traces, policy, config, two_types())[0]
        assert job.profile_s == 60.0 + 20.0 * (batches - 1)
        job.info.observe_profile(job, batches)
        app = job.apps["fast"]
        largest = min(app.max_local_bsz, app.max_batch_size)
        true = app.step_time((1,), app.batch_config(1, largest))
        model = (job.view().type_models or {})["fast"]
        errors[batches] = abs(model.step_time((1,), largest) / true - 1.0)
    assert errors[2] < 0.02 < errors[1]


def test_a_profile_beside_the_job_must_end_by_the_next_decision(typed_traces: Path) -> None:
    """Unit: a profile longer than an interval would hold a GPU the next decision hands out; refused, as is
    a mode the simulator does not know."""
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    with pytest.raises(WorkloadError, match="at most one interval"):
        simulate(spec, typed_traces, get_policy("goodput"), two_types(), SimConfig(profile_s=90.0, profile="beside"))
    with pytest.raises(WorkloadError, match="unknown profile mode 'after'"):
        simulate(spec, typed_traces, get_policy("goodput"), two_types(), SimConfig(profile="after"))


def test_in_sias_setting_an_adaptive_job_re_tunes_its_batch_after_every_interval(typed_traces: Path) -> None:
    """Unit: Sia's artifact has every adaptive job pick its batch size again after each interval it ran, on
    what it has reported; elsewhere the batch waits for the epoch's end (or a change of GPUs)."""
    assert sia_setting.retunes_each_interval("sia") and not sia_setting.retunes_each_interval("none")
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    totals = {}
    for retune in (False, True):
        job = make_jobs(spec, typed_traces, get_policy("sia"), SimConfig(), two_types())[0]
        job.epoch, job.progress = 20, job.app.progress_at(20)  # resumed at epoch 20, where noise favours more
        job.reallocate(Allocation(("f0", "f0")), 0.0, 0.0, "fast")
        assert job.config is not None and job.config.total(2) == 128  # nothing reported: the smallest batch
        assert run_interval(job, 0.0, 5.0, retune) and job.epoch == 20  # 5 s: inside the epoch
        assert job.config is not None
        totals[retune] = job.config.total(2)
    # Its first report (gradient noise, step time) makes a larger batch worth it at once, or at the epoch's end.
    assert totals[False] == 128 and totals[True] > 128


def test_yolov3s_local_batch_of_8_holds_for_pollux_traces_not_for_a_typed_profile(tmp_path: Path) -> None:
    """Unit: Pollux's yolov3 runs at most 8 samples a GPU (its README), whatever its placements show; Sia's
    artifact sets no such limit on its per-type traces: each type's largest profiled local batch is its."""
    source = POLLUX_DIR / "traces" / "yolov3"
    app = tmp_path / "yolov3"
    app.mkdir()
    for path in source.glob("validation-*.csv"):
        shutil.copy(path, app / path.name)
    for kind in ("placements", "scalability"):
        shutil.copy(source / f"{kind}.csv", app / f"{kind}-aws.csv")
    largest = max(int(float(row["local_bsz"])) for row in csv.DictReader((source / "placements.csv").open()))
    assert largest > 8
    assert load_application(source).max_local_bsz == 8
    assert load_application(app, "aws").max_local_bsz == largest


def test_the_oracles_model_capped_searches_batches_up_to_the_cap_or_a_replicas_least() -> None:
    """Unit: AppPerformance.batch_capped, the oracle's side of sia's valuation at the job's own batch."""
    app = load_application(CIFAR)
    model = performance_at(app, 10)
    assert model.best_batch((4,))[0] > app.init_batch_size
    capped = model.batch_capped(app.init_batch_size, 4)
    assert capped.best_batch((4,))[0] == app.init_batch_size
    least = app.min_local_bsz * 16
    assert least > app.init_batch_size and model.batch_capped(app.init_batch_size, 16).best_batch((4,) * 4)[0] == least
    assert model.batch_capped(app.max_batch_size, 4) is model
