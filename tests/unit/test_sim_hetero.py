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

from dlsub.cli.main import main
from dlsub.policies.api import Allocation, Allocations, ClusterView, Decision, Jobs, Node
from dlsub.policies.registry import get_policy
from dlsub.sim import sia_setting
from dlsub.sim.apps import TraceError, load_application, profiled_types
from dlsub.sim.cluster_file import ClusterFileError, load_cluster
from dlsub.sim.engine import SimConfig, make_jobs, run_interval, simulate
from dlsub.sim.performance import performance_at
from dlsub.sim.workload import POLLUX_DIR, WorkloadError, WorkloadJob, read_workload

CIFAR = POLLUX_DIR / "traces" / "cifar10"


def _scaled_copy(source: Path, target: Path, factor: float) -> None:
    with source.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with target.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (float(v) * factor if k in ("step_time", "sync_time") else v) for k, v in row.items()})


@pytest.fixture()
def typed_traces(tmp_path: Path) -> Path:
    """traces/cifar10 with placements-<type>.csv and scalability-<type>.csv for types fast and slow (2x)."""
    app = tmp_path / "traces" / "cifar10"
    app.mkdir(parents=True)
    for path in CIFAR.glob("validation-*.csv"):
        shutil.copy(path, app / path.name)
    for kind in ("placements", "scalability"):
        _scaled_copy(CIFAR / f"{kind}.csv", app / f"{kind}-fast.csv", 1.0)
        _scaled_copy(CIFAR / f"{kind}.csv", app / f"{kind}-slow.csv", 2.0)
    return tmp_path / "traces"


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
    """goodput reads each job's one-GPU profile of every type (type_rates): its jobs' first start waits
    SimConfig.profile_s longer; sia and pollux are charged nothing (as Sia's artifact charges nothing)."""
    spec = [WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)]
    charged = {name: make_jobs(spec, typed_traces, get_policy(name), SimConfig(profile_s=45.0), two_types())[0]
               for name in ("goodput", "sia", "pollux")}
    assert {name: j.profile_s for name, j in charged.items()} == {"goodput": 45.0, "sia": 0.0, "pollux": 0.0}
    one_type = ClusterView((Node("f0", 4, gpu_type="fast"),))
    assert make_jobs(spec, typed_traces, get_policy("goodput"), SimConfig(), one_type)[0].profile_s == 0.0


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
