"""Unit, against the fake Slurm: `dlsub status` lists jobs alive or ended in the last day by default,
`--all` every job, `--since DATE` from a date, and a named JOB however old; the progress bar."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.job.status_window import SinceError, fraction_done, parse_since, progress_bar
from dlsub.job.user_store import JobStore
from dlsub.job_progress import Progress
from dlsub.slurm_plugins.fake import FakeSlurm


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def ids(*args: str) -> list[str]:
    result = invoke("status", "--json", *args)
    assert result.exit_code == 0, result.output
    return [row["id"] for row in json.loads(result.stdout)]


@pytest.fixture
def three_jobs(cli_env: FakeSlurm, tmp_path: Path) -> dict[str, str]:
    """A running job, one that ended an hour ago and one that ended three days ago (by the store's record)."""
    script = tmp_path / "main.py"
    script.write_text("print('training')\n")
    made = {}
    for name in ("running", "recent", "old"):
        out = json.loads(invoke("--json", "-J", name, str(script)).stdout)
        made[name] = out["id"]
        cli_env.set_job_state(out["slurm_job_id"], "RUNNING" if name == "running" else "COMPLETED", nodes="cpu1")
    store = JobStore(tmp_path / "dlsub-home" / "dlsub.db")
    now = time.time()
    store.observe(made["recent"], "COMPLETED", now=now - 3600)
    store.observe(made["old"], "COMPLETED", now=now - 3 * 86400)
    store.update(made["old"], submitted_at=now - 4 * 86400)
    return made


def test_default_shows_alive_and_ended_in_the_last_day(three_jobs: dict[str, str]) -> None:
    shown = ids()
    assert three_jobs["running"] in shown and three_jobs["recent"] in shown
    assert three_jobs["old"] not in shown


def test_all_and_since_and_a_named_job(three_jobs: dict[str, str]) -> None:
    assert sorted(ids("--all")) == sorted(three_jobs.values())
    assert three_jobs["old"] in ids("--since", "5d")
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() - 5 * 86400))
    assert three_jobs["old"] in ids("--since", day)
    assert three_jobs["recent"] not in ids("--since", "30m")
    named = json.loads(invoke("status", three_jobs["old"], "--json").stdout)
    assert named["id"] == three_jobs["old"] and named["state"] == "COMPLETED"


def test_table_says_how_to_see_older_jobs(cli_env: FakeSlurm, three_jobs: dict[str, str]) -> None:
    result = invoke("status", "--since", "1m")
    assert result.exit_code == 0
    assert three_jobs["running"] in result.stdout and three_jobs["old"] not in result.stdout


def test_bad_since_exits_2_with_what_to_write(cli_env: FakeSlurm) -> None:
    result = CliRunner().invoke(main, ["status", "--since", "last tuesday"])
    assert result.exit_code == 2 and "2026-11-20" in result.output and "12h" in result.output
    result = CliRunner().invoke(main, ["status", "--since", "1d", "--all"])
    assert result.exit_code == 2 and "not both" in result.output


def test_parse_since() -> None:
    now = 1_800_000_000.0
    assert parse_since("12h", now) == now - 12 * 3600
    assert parse_since("2d", now) == now - 2 * 86400
    assert parse_since("2026-11-20T00:00:00+00:00", now) == 1_795_132_800.0
    with pytest.raises(SinceError):
        parse_since("yesterday", now)


def test_progress_bar_and_fraction() -> None:
    assert fraction_done(Progress(step=25, total_steps=100)) == 0.25
    assert fraction_done(Progress(epoch=1.0, total_epochs=4)) == 0.25
    assert fraction_done(Progress(step=25)) is None
    assert fraction_done(Progress(finished=True)) == 1.0
    assert progress_bar(0.25, width=8) == "[##------]  25%"
    assert progress_bar(None) == "-"


def test_a_job_slurm_stopped_for_its_memory_says_so_and_what_to_ask_for(tmp_path: Path) -> None:
    """Pure: Slurm's OUT_OF_MEMORY (task/cgroup's memory limit) is FAILED with the reason and the --mem to ask
    for, in the JSON and under the table."""
    from dlsub.job.status import job_status, render_table
    from dlsub.job.user_store import JobRecord
    from dlsub.slurm_plugins.models import SlurmJob

    (tmp_path / "job").mkdir()
    record = JobRecord("0123abcd", "t", "me", "t.py", [], str(tmp_path / "job"), "cpu", 0, 1, 2, 700, None, "img",
                       slurm_job_id=9)
    slurm = SlurmJob(job_id=9, name="t", user="me", state="OUT_OF_MEMORY", partition="cpu", nodes="cpu1",
                     comment="", restart_count=0, reason="OutOfMemory", time_limit_min=None, start_time=0,
                     submit_time=0, exit_code=None)
    row = job_status(record, slurm)
    assert row.state == "FAILED"
    assert row.reason.startswith("out of memory: the job used more than the 700 MB it asked for (--mem)")
    assert "--mem 2G" in row.reason
    assert render_table([row]).splitlines()[-1] == f"0123abcd: {row.reason}"
    finished = job_status(record, dataclasses.replace(slurm, state="COMPLETED", reason="None"))
    assert len(render_table([finished]).splitlines()) == 2, "no failure line for a job that did not fail"


def test_the_gpu_type_is_the_newest_attempts(tmp_path: Path) -> None:
    """Pure: the GPU type in the status is the one the newest attempt's start records name (its main job's and
    its workers' since), shown in the GPU column; an attempt on a CPU node names none."""
    from dlsub.job.status import job_status, render_table
    from dlsub.job.user_store import JobRecord
    from dlsub.slurm_plugins.models import SlurmJob

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    t0 = 1_790_000_000.0  # (a time of this decade: attempt records outside it are refused)
    record = JobRecord("0123abcd", "t", "me", "t.py", [], str(job_dir), "gpu", 1, 1, 2, 700, None, "img",
                       slurm_job_id=9)
    slurm = SlurmJob(job_id=9, name="t", user="me", state="RUNNING", partition="gpu", nodes="gpu1",
                     comment="", restart_count=1, reason="None", time_limit_min=None, start_time=0,
                     submit_time=0, exit_code=None)
    starts = [{"time": t0 + 100, "node": "cpu1", "gpu_type": ""},  # a first attempt on a CPU node
              {"time": t0 + 200, "node": "gpu2", "gpu_type": "v100"},
              {"time": t0 + 300, "node": "gpu1", "gpu_type": "a100"},  # moved: the newest attempt
              {"time": t0 + 310, "node": "gpu2", "gpu_type": "v100", "role": "worker"}]
    (job_dir / "attempts.jsonl").write_text("".join(json.dumps({
        "event": "start", "slurm_job_id": 9, "restart": i, "partition": "gpu", **s}) + "\n"
        for i, s in enumerate(starts)))
    row = job_status(record, slurm)
    assert row.gpu_type == "a100,v100" and row.to_json()["gpu_type"] == "a100,v100"
    header, line = render_table([row]).splitlines()
    assert line.split()[header.split().index("GPU")] == "a100,v100"
    (job_dir / "attempts.jsonl").write_text(json.dumps({"event": "start", "time": t0 + 100, "slurm_job_id": 9,
                                                         "node": "cpu1", "gpu_type": ""}) + "\n")
    assert job_status(record, slurm).gpu_type is None


def test_a_superseded_attempts_late_end_does_not_fail_a_completed_job(tmp_path: Path) -> None:
    """Pure (fencing, issue 53): Slurm has forgotten the job; its newer attempt completed, then the older
    attempt's batch launcher, its node back, recorded its own end (exit 86, superseded). The job completed."""
    from dlsub.contract import ACTION_SUPERSEDED, SUPERSEDED_EXIT_CODE
    from dlsub.job.status import job_status
    from dlsub.job.user_store import JobRecord

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    t0 = 1_790_000_000.0
    record = JobRecord("0123abcd", "t", "me", "t.py", [], str(job_dir), "gpu", 1, 1, 2, 700, None, "img",
                       slurm_job_id=9)
    events = [{"event": "start", "time": t0, "restart": 0, "node": "gpu1"},
              {"event": "start", "time": t0 + 100, "restart": 1, "node": "gpu2"},
              {"event": "end", "time": t0 + 200, "restart": 1, "node": "gpu2", "rc": 0},
              {"event": "end", "time": t0 + 300, "restart": 0, "node": "gpu1", "rc": SUPERSEDED_EXIT_CODE,
               "action": ACTION_SUPERSEDED}]
    (job_dir / "attempts.jsonl").write_text("".join(json.dumps({"slurm_job_id": 9, "partition": "gpu", "role": "main",
                                                                **e}) + "\n" for e in events))
    assert job_status(record, None).state == "COMPLETED"


def test_a_job_that_failed_at_its_start_says_what_dlsub_said(tmp_path: Path) -> None:
    """Pure (a job directory in tmp_path): a job whose node lacks dlsub's installation (an uninstall with the job
    still queued, or a node the site missed) fails at its start with the batch script's own line; `dlsub status`
    gives that line as the reason, not Slurm's NonZeroExitCode, and nothing else the output printed."""
    from dlsub.contract import output_file
    from dlsub.job.status import ERROR_SHOWN_CHARS, job_status
    from dlsub.job.user_store import JobRecord
    from dlsub.slurm_plugins.models import SlurmJob

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    record = JobRecord("0123abcd", "t", "me", "t.py", [], str(job_dir), "cpu", 0, 1, 2, 700, None, "img",
                       slurm_job_id=9)
    slurm = SlurmJob(job_id=9, name="t", user="me", state="FAILED", partition="cpu", nodes="cpu1",
                     comment="", restart_count=0, reason="NonZeroExitCode", time_limit_min=None, start_time=0,
                     submit_time=0, exit_code=1)
    assert job_status(record, slurm).reason == "NonZeroExitCode", "no output file: Slurm's reason"
    said = ("/opt/dlsub/venv/bin/python, the Python of dlsub's installation that runs this job's launcher, is not "
            "on node cpu1; the site installs dlsub on a shared software path")
    output_file(job_dir, 9).write_text("x" * 70_000 + "\nstep 1\ndlsub: error: an older one\n"
                                       f"dlsub: error: {said}\x1b[31m\nTraceback (most recent call last):\n")
    assert job_status(record, slurm).reason == said + "[31m", "the last one, control characters dropped"
    output_file(job_dir, 9).write_text("dlsub: error: " + "y" * 1000 + "\n")
    assert job_status(record, slurm).reason == "y" * ERROR_SHOWN_CHARS
    running = dataclasses.replace(slurm, state="RUNNING", reason="None")
    assert job_status(record, running).reason == "", "only a failed job's reason is read from its output"
