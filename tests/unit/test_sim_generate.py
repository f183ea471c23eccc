"""Unit tests (pure; no Slurm): workloads generated as the Pollux paper built its own, and users' stated lengths."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.sim.apps import EPOCHS, load_application
from dlsub.sim.engine import SimJob
from dlsub.sim.generate import Statements, TraceJob, application_for, generate, read_philly
from dlsub.sim.information import told_remaining
from dlsub.sim.workload import POLLUX_DIR, WorkloadError, WorkloadJob, read_workload, write_workload

PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def trace(count: int = 400) -> list[TraceJob]:
    rng = random.Random(0)
    # GPU-times spread over every class, a tenth of them XLarge.
    return [TraceJob(rng.randrange(8 * 3600), 3600.0 * 10 ** rng.uniform(-1, 3)) for _ in range(count)]


def test_the_philly_window_is_two_to_ten_each_day(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(PHILLY_HEAD + "2017-10-09 01:59:59,1,1,60,c\n2017-10-09 02:00:05,1,1,60,c\n"
                    "2017-11-01 09:59:00,1,2,7200,c\n2017-10-09 10:00:00,1,1,60,c\n")
    assert read_philly(path) == [TraceJob(5, 60.0), TraceJob(8 * 3600 - 60, 7200.0)]
    (tmp_path / "none.csv").write_text(PHILLY_HEAD + "2017-10-09 12:00:00,1,1,60,c\n")
    with pytest.raises(WorkloadError, match="no job submitted between 02:00 and 10:00"):
        read_philly(tmp_path / "none.csv")


def test_classes_by_gpu_hours_as_the_paper_gives_them() -> None:
    rng = random.Random(1)
    assert {application_for(0.5 * 3600, rng) for _ in range(50)} == {"cifar10", "ncf"}
    assert {application_for(5 * 3600, rng) for _ in range(50)} == {"bert", "deepspeech2"}
    assert application_for(50 * 3600, rng) == "yolov3"
    assert application_for(500 * 3600, rng) == application_for(5000 * 3600, rng) == "imagenet"


def test_load_scales_the_jobs_in_one_window_and_a_seed_is_one_workload() -> None:
    jobs = {load: generate(trace(), load, seed=3) for load in (0.5, 1.0, 2.0)}
    assert [len(jobs[load]) for load in (0.5, 1.0, 2.0)] == [80, 160, 320]
    assert generate(trace(), 1.0, seed=3) == jobs[1.0] != generate(trace(), 1.0, seed=4)
    arrivals = [job.arrival_s for job in jobs[2.0]]
    assert arrivals == sorted(arrivals) and 0 <= arrivals[0] and arrivals[-1] < 8 * 3600
    assert len({job.name for job in jobs[2.0]}) == 320
    with pytest.raises(WorkloadError, match="the window has 400"):
        generate(trace(), 3.0, seed=1)


def test_stated_lengths_are_missing_for_a_share_and_off_by_at_most_the_error() -> None:
    jobs = generate(trace(), 2.0, seed=5, statements=Statements(missing=0.5, error=2.0))
    stated = [job for job in jobs if job.stated_epochs is not None]
    assert 0.35 < len(stated) / len(jobs) < 0.65
    ratios = [job.stated_epochs / EPOCHS[job.application] for job in stated]  # type: ignore[operator]
    assert min(ratios) >= 0.49 and max(ratios) <= 2.01 and min(ratios) < 0.7 and max(ratios) > 1.4
    exact = generate(trace(), 2.0, seed=5, statements=Statements(missing=0.0, error=1.0))
    assert all(job.stated_epochs == EPOCHS[job.application] for job in exact)
    # The statements do not change which jobs arrive when.
    unstated = generate(trace(), 2.0, seed=5, statements=None)
    assert [(j.name, j.arrival_s) for j in unstated] == [(j.name, j.arrival_s) for j in jobs]
    assert all(job.stated_epochs is None for job in unstated)


def test_a_generated_workload_reads_back_and_the_cli_writes_one(tmp_path: Path) -> None:
    jobs = generate(trace(), 0.5, seed=2)
    write_workload(jobs, tmp_path / "w.csv")
    assert read_workload(tmp_path / "w.csv") == jobs
    philly = tmp_path / "philly.csv"
    philly.write_text(PHILLY_HEAD + "".join(f"2017-10-09 0{2 + i % 8}:00:{i % 60:02d},1,1,{600 * (i + 1)},c\n"
                                            for i in range(100)))
    result = CliRunner().invoke(main, ["generate-workload", str(tmp_path / "g.csv"), "--load", "0.25",
                                       "--seed", "7", "--philly", str(philly)])
    assert result.exit_code == 0, result.output
    assert len(read_workload(tmp_path / "g.csv")) == 40
    result = CliRunner().invoke(main, ["generate-workload", str(tmp_path / "g.csv"), "--load", "2",
                                       "--philly", str(philly)])
    assert result.exit_code != 0 and "the window has 100" in result.output


def test_a_statement_tells_the_work_it_implies_and_nothing_below_zero() -> None:
    app = load_application(POLLUX_DIR / "traces" / "cifar10")
    spec = WorkloadJob("a", 0.0, "cifar10", 1, 128, stated_epochs=EPOCHS["cifar10"] / 2)
    job = SimJob(spec, app, 0.0, 1, 1, 1, 128, True)
    assert told_remaining(job) == pytest.approx(app.total_progress / 2)
    job.progress = app.total_progress * 0.75
    assert told_remaining(job) == 0.0
    assert told_remaining(SimJob(WorkloadJob("b", 0.0, "cifar10", 1, 128), app, 0.0, 1, 1, 1, 128, True)) is None
