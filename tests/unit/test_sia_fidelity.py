"""Unit (no Slurm, no data): benchmarks/sia_fidelity.py runs sia as Sia's paper priced it, every change of a job's
GPUs a restart, when it compares sia with the paper's figures (issue 54 item 4), and gives each application's
figures with --by-app."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dlsub.sim.engine import JobResult, SimConfig, SimResult

REPO = Path(__file__).resolve().parents[2]

# One workload's jobs: two of cifar10, one of imagenet (JCT 600 s, 1,200 s; 36,000 s).
JOBS = [JobResult("cifar10-0", "cifar10", 0.0, 60.0, 600.0, 3, 3600.0),
        JobResult("cifar10-1", "cifar10", 0.0, 60.0, 1200.0, 1, 7200.0),
        JobResult("imagenet-2", "imagenet", 0.0, 60.0, 36000.0, 15, 360000.0)]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    folder = str(REPO / "benchmarks")
    if folder not in sys.path:
        monkeypatch.syspath_prepend(folder)
    return importlib.import_module("sia_fidelity")


def run(bench: ModuleType, monkeypatch: pytest.MonkeyPatch, *flags: str) -> list[SimConfig]:
    """The benchmark's main on one workload with every simulation faked; the configs it ran them with."""
    told: list[SimConfig] = []

    def simulate(jobs: Any, traces: Any, policy: Any, cluster: Any, config: SimConfig) -> SimResult:
        told.append(config)
        return SimResult(policy.name, "w", 64, list(JOBS))

    monkeypatch.setattr(bench, "simulate", simulate)
    monkeypatch.setattr(bench, "read_workload", lambda path: [])
    monkeypatch.setattr(sys, "argv", ["sia_fidelity.py", "--workloads", "1", "--policies", "sia", *flags])
    bench.main()
    return told


def test_sia_is_compared_with_the_paper_at_the_papers_pricing_every_change_a_restart(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert SimConfig().resize_penalty_s is not None  # the simulator's default prices a resize as dlsub's
    (config,) = run(bench, monkeypatch)
    assert config.resize_penalty_s is None and config.calibration == "sia"
    assert "sia (online, every change a restart)" in capsys.readouterr().out


def test_a_resize_cost_is_run_only_when_asked(bench: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (config,) = run(bench, monkeypatch, "--resize-penalty", "10")
    assert config.resize_penalty_s == 10.0
    assert "sia (online, resize 10 s)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run(bench, monkeypatch, "--resize-penalty", "-1")


def test_by_app_gives_each_applications_jobs_jct_gpu_hours_and_restarts(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run(bench, monkeypatch, "--by-app")
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["cifar10"], ["imagenet"])}
    assert rows == {"cifar10": ["2", "0.250", "1.50", "2.00"], "imagenet": ["1", "10.000", "100.00", "15.00"]}


def test_the_homogeneous_setting_runs_on_64_t4_against_table_4_with_its_restarts_a_job(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clusters: list[Any] = []
    real = bench.load_cluster

    def load_cluster(path: Path) -> Any:
        clusters.append(real(path))
        return clusters[-1]

    monkeypatch.setattr(bench, "load_cluster", load_cluster)
    run(bench, monkeypatch, "--setting", "homogeneous")
    (cluster,) = clusters
    assert {(node.gpu_type, node.gpus) for node in cluster.nodes} == {("aws", 4)} and len(cluster.nodes) == 16
    out = capsys.readouterr().out
    assert "restarts a job 6.33" in out  # (3 + 1 + 15) / 3
    paper = next(line for line in out.splitlines() if line.split()[:1] == ["paper"])
    assert paper.split()[1:4] == ["1.900", "18.10", "8.40"] and paper.endswith("restarts a job 2.6")
