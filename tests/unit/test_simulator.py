"""Unit tests (pure; no Slurm): the trace-driven simulator, its fidelity to the
published Pollux baselines, determinism, the gang scenario and `dlsub simulate`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.policies.api import ClusterView
from dlsub.policies.registry import get_policy
from dlsub.sim.apps import load_application
from dlsub.sim.cluster_file import ClusterFileError, load_cluster
from dlsub.sim.engine import SimConfig, SimResult, simulate
from dlsub.sim.published import PUBLISHED_AVG_JCT_S
from dlsub.sim.workload import POLLUX_DIR, SCENARIOS_DIR, WorkloadError, read_workload

TRACES = POLLUX_DIR / "traces"
WORKLOAD_6 = POLLUX_DIR / "workloads" / "workload-6.csv"


def run(policy: str, workload: Path = WORKLOAD_6, cluster: ClusterView | None = None, **config: object):
    return simulate(read_workload(workload), TRACES, get_policy(policy), cluster or ClusterView.uniform(16, 4),
                    SimConfig(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["tiresias", "optimus"])
def test_fidelity_on_workload_6_within_ten_percent_of_published(policy: str) -> None:
    published = PUBLISHED_AVG_JCT_S["1.0"][policy][5]
    summary = run(policy).summary()
    assert summary["completed"] == 160
    assert abs(summary["avg_jct_s"] / published - 1) <= 0.10, (summary, published)  # type: ignore[operator]


def test_goodput_completes_workload_6_and_reports_every_field() -> None:
    summary = run("goodput").summary()
    assert summary["completed"] == 160 and not summary["stalled"]
    for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization", "restarts"):
        assert summary[key] is not None
    assert summary["p50_jct_s"] <= summary["p99_jct_s"] <= summary["makespan_s"]  # type: ignore[operator]
    assert 0 < summary["gpu_utilization"] <= 1  # type: ignore[operator]


def test_simulation_is_deterministic_for_a_seed() -> None:
    # The first 15 jobs of a workload (the whole of it took 78 s of CI for three runs; determinism is the same).
    jobs = read_workload(POLLUX_DIR / "workloads-0.5" / "workload-3.csv")[:15]

    def run(seed: int) -> SimResult:
        return simulate(jobs, TRACES, get_policy("goodput"), ClusterView.uniform(16, 4),
                        SimConfig(seed=seed, arrival_jitter_s=120))

    a, b, c = run(7), run(7), run(8)
    assert a.jobs == b.jobs and [s.__dict__ for s in a.timeline] == [s.__dict__ for s in b.timeline]
    assert a.jobs != c.jobs, "another seed jitters arrivals differently"


def test_gang_scenario_per_worker_placement_deadlocks_gang_does_not() -> None:
    cluster = load_cluster(SCENARIOS_DIR / "gang-cluster.toml")
    greedy = run("worker-greedy", SCENARIOS_DIR / "gang.csv", cluster, stall_limit_s=3600)
    assert greedy.stalled and greedy.summary()["completed"] == 0
    assert all(sample.allocated_gpus == cluster.total_gpus for sample in greedy.timeline), "GPUs held, none used"
    gang = run("gang", SCENARIOS_DIR / "gang.csv", cluster)
    assert not gang.stalled and gang.summary()["completed"] == 4


def test_a_job_that_waits_pays_the_restart_penalty_once_per_allocation() -> None:
    result = run("fifo", SCENARIOS_DIR / "gang.csv", load_cluster(SCENARIOS_DIR / "gang-cluster.toml"))
    assert [j.restarts for j in result.jobs] == [0, 0, 0, 0]
    first, third = result.jobs[0], result.jobs[2]
    # Allocated at the first tick after arrival; the third job at the first tick after a job ends.
    assert first.start_s == 60 and third.start_s == math.ceil(first.completion_s / 60) * 60
    # Same job, same GPUs: the same time from start to end, 30 s penalty included.
    assert third.completion_s - third.start_s == first.completion_s - first.start_s
    no_penalty = run("fifo", SCENARIOS_DIR / "gang.csv", load_cluster(SCENARIOS_DIR / "gang-cluster.toml"),
                     restart_penalty_s=0)
    assert no_penalty.jobs[0].completion_s == first.completion_s - 30


def test_application_model_basics() -> None:
    app = load_application(TRACES / "cifar10")
    assert app.epochs == 100 and app.init_batch_size == 128 and app.max_batch_size == 4096
    assert app.efficiency(app.init_batch_size, 0) == pytest.approx(1.0)
    assert 1.0 < app.efficiency(1024, 0) < 1024 / 128
    assert app.progress_at(0) == 0 and app.progress_at(1) < app.progress_at(2) <= app.total_progress
    yolo = load_application(TRACES / "yolov3")
    assert yolo.max_local_bsz == 8
    config = yolo.batch_config(2, 64)
    assert config.atomic <= 8 and config.total(2) >= 64 - 2


def test_workload_errors_say_what_to_fix(tmp_path: Path) -> None:
    bad = tmp_path / "w.csv"
    bad.write_text("name,time,application\na,0,cifar10\n")
    with pytest.raises(WorkloadError, match="missing column.*num_replicas"):
        read_workload(bad)
    bad.write_text("name,time,application,num_replicas,batch_size\na,0,resnet,1,128\n")
    with pytest.raises(WorkloadError, match="no traces for application 'resnet'.*cifar10"):
        run("fifo", bad)
    with pytest.raises(WorkloadError, match="cannot read"):
        read_workload(tmp_path / "nope.csv")


def test_cluster_file_rejects_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("nodes = 2\ngpu_per_node = 4\n")
    with pytest.raises(ClusterFileError, match="unknown key.*gpu_per_node.*valid keys: .*gpus_per_node"):
        load_cluster(path)
    path.write_text('[[group]]\npartition = "gpu"\nnodes = 2\ngpus_per_node = 8\n'
                    '[[group]]\npartition = "dev"\nnodes = 1\n')
    cluster = load_cluster(path)
    assert cluster.total_gpus == 2 * 8 + 4 and {n.partition for n in cluster.nodes} == {"gpu", "dev"}


def test_cli_simulate_json_out_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "out dir; 'q'"
    result = CliRunner().invoke(main, ["simulate", str(SCENARIOS_DIR / "gang.csv"), "--policy", "gang",
                                       "--cluster", str(SCENARIOS_DIR / "gang-cluster.toml"),
                                       "--json", "--out", str(out), "--plot"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization", "restarts"):
        assert key in summary
    assert (out / "jobs.csv").read_text().count("\n") == 5
    assert json.loads((out / "summary.json").read_text())["completed"] == 4
    assert (out / "gang-gang.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_simulate_finds_the_shipped_pollux_workloads_by_name(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["simulate", "pollux/workloads-0.5/workload-5.csv", "--policy", "tiresias",
                                       "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["workload"] == "workload-5" and summary["completed"] == 80
    assert abs(summary["avg_jct_s"] / PUBLISHED_AVG_JCT_S["0.5"]["tiresias"][4] - 1) <= 0.10


def test_cli_simulate_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["simulate", str(WORKLOAD_6), "--policy", "sjf"])
    assert result.exit_code == 2 and "valid policies: " in result.output and "tiresias" in result.output
    result = runner.invoke(main, ["simulate", str(tmp_path / "missing.csv")])
    assert result.exit_code == 2 and "cannot read workload" in result.output
    result = runner.invoke(main, ["simulate", str(SCENARIOS_DIR / "gang.csv"), "--policy", "worker-greedy",
                                  "--cluster", str(SCENARIOS_DIR / "gang-cluster.toml")])
    assert result.exit_code == 3 and "stalled" in result.output
