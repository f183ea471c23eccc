"""Unit: the CLI's answers to bad input, against the fake Slurm.

Each bad request exits 2 with a message that says what was wrong and what to
do, submits nothing, and leaves no job directory or store entry behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.cli.submit_options import parse_mem
from dlsub.slurm_plugins.fake import FakeSlurm


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('training')\n")
    return path


def invoke(*args: str) -> CliRunner.invoke:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def assert_nothing_left(fake: FakeSlurm, tmp_path: Path) -> None:
    assert fake.submitted() == [], "a bad request must submit nothing"
    jobs_dir = tmp_path / "dlsub-home" / "jobs"
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir()), "no job directory may be left"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "-1"], "--gpus '-1': give a number (2) or an elastic range MIN:MAX (1:4)"),
        (["--gpus", "3", "--nodes", "2"], "--gpus 3 does not split evenly over 2 nodes"),
        (["--nodes", "2:1"], "an elastic range MIN:MAX needs MIN < MAX"),
        (["--nodes", "1:3"], "partition cpu has only 2 nodes; ask for at most 2"),
        (["--gpus-per-node", "-1"], "--gpus-per-node must be 0 or more, not -1"),
        (["--gpus", "9"], "the most one node offers is 4"),
        (["--time", "1h30"], "is not a time limit; use one of MM"),
        (["--partition", "bigmem"], "unknown partition 'bigmem'; this cluster has: cpu, gpu, gpu-dev"),
        (["--image", "pytorch:nope"], "image 'pytorch:nope' is not in your Podman storage"),
        (["--mem", "lots"], "is not a memory size"),
        (["--nodes", "3"], "needs 3 nodes"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message(cli_env: FakeSlurm, tmp_path: Path, script: Path, args: list[str],
                                                 message: str) -> None:
    result = invoke(*args, str(script))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert_nothing_left(cli_env, tmp_path)


def test_missing_script(cli_env: FakeSlurm, tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "nope.py"))
    assert result.exit_code == 2
    assert "does not exist" in result.output and "nope.py" in result.output
    assert_nothing_left(cli_env, tmp_path)


def test_unreadable_script(cli_env: FakeSlurm, tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root reads any file, so the permission check is driven directly here;
    # the integration tests run the same check as the unprivileged user.
    import dlsub.job.submit as submit

    monkeypatch.setattr(submit.os, "access", lambda path, mode: False)
    result = invoke(str(script))
    assert result.exit_code == 2 and "not readable" in result.output
    assert_nothing_left(cli_env, tmp_path)


def test_directory_instead_of_script(cli_env: FakeSlurm, tmp_path: Path) -> None:
    result = invoke(str(tmp_path))
    assert result.exit_code == 2 and "is not a file" in result.output


def test_slurmctld_unreachable(cli_env: FakeSlurm, tmp_path: Path, script: Path) -> None:
    cli_env.reachable = False
    result = invoke(str(script))
    assert result.exit_code == 2
    assert "could not be reached" in result.output or "not answering" in result.output
    assert "scontrol ping" in result.output
    assert_nothing_left(cli_env, tmp_path)


def test_sbatch_failure_leaves_nothing(cli_env: FakeSlurm, tmp_path: Path, script: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The partition vanishes between planning and sbatch: sbatch refuses.
    original = cli_env._sbatch

    def refusing(argv: list[str]):  # type: ignore[no-untyped-def]
        cli_env.partitions.pop("cpu", None)
        return original(argv)

    monkeypatch.setattr(cli_env, "_sbatch", refusing)
    result = invoke(str(script))
    assert result.exit_code == 1 and "invalid partition" in result.output
    assert_nothing_left(cli_env, tmp_path)
    assert json.loads(invoke("status", "--json").stdout) == []


def test_good_submit_json_and_status(cli_env: FakeSlurm, tmp_path: Path, script: Path) -> None:
    result = invoke("--gpus", "2", "--json", str(script), "--epochs", "3")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["slurm_job_id"] == cli_env.submitted()[0].job_id and out["partition"] == "gpu"
    job = cli_env.submitted()[0]
    assert job.options["gres"] == "gpu:2"
    # The fixture's script imports no dlsub library: submit tags it so.
    assert job.options["comment"] == f"dlsub:{out['id']};mode=immediate;ideal=gpu;gpus=2;script=plain"
    assert "--epochs 3" in Path(job.script).read_text()
    cli_env.set_job_state(job.job_id, "RUNNING", nodes="gpu1")
    status = json.loads(invoke("status", out["id"], "--json").stdout)
    for key in ("id", "slurm_job_id", "state", "partition", "nodes", "step", "epoch", "loss", "eta_s", "attempts"):
        assert key in status
    assert status["state"] == "RUNNING" and status["nodes"] == "gpu1"
    # The Slurm job id works as a handle too.
    assert json.loads(invoke("status", str(job.job_id), "--json").stdout)["id"] == out["id"]
    # Once Slurm has purged the finished job, its accounting (sacct) still says how it ended.
    cli_env.set_job_state(job.job_id, "FAILED", nodes="gpu1", exit_code=3)
    cli_env.purge(job.job_id)
    status = json.loads(invoke("status", out["id"], "--json").stdout)
    assert status["state"] == "FAILED" and status["nodes"] == "gpu1" and status["partition"] == "gpu"


def test_dry_run_prints_script_and_submits_nothing(cli_env: FakeSlurm, tmp_path: Path, script: Path) -> None:
    result = invoke("--dry-run", str(script))
    # The script on stdout; what dlsub says about it (this one uses no library: a note) on stderr.
    assert result.exit_code == 0 and result.stdout.startswith("#!/bin/bash")
    assert result.stderr.startswith("dlsub: note: train.py uses no dlsub library")
    assert_nothing_left(cli_env, tmp_path)


def test_cancel_marks_cancelled(cli_env: FakeSlurm, script: Path) -> None:
    out = json.loads(invoke("--json", str(script)).stdout)
    cli_env.set_job_state(out["slurm_job_id"], "RUNNING", nodes="cpu1")
    assert invoke("cancel", out["id"]).exit_code == 0
    assert cli_env.jobs[out["slurm_job_id"]].state == "CANCELLED"
    assert json.loads(invoke("status", out["id"], "--json").stdout)["state"] == "CANCELLED"


def test_requeue_signals_batch_shell_with_usr1(cli_env: FakeSlurm, script: Path) -> None:
    out = json.loads(invoke("--json", str(script)).stdout)
    assert invoke("requeue", out["id"]).exit_code == 2  # still pending: refused
    cli_env.set_job_state(out["slurm_job_id"], "RUNNING", nodes="cpu1")
    assert invoke("requeue", out["id"]).exit_code == 0
    assert cli_env.jobs[out["slurm_job_id"]].signals == ["USR1"]
    assert ["scancel", "--signal=USR1", "--batch", str(out["slurm_job_id"])] in cli_env.calls


def test_unknown_job_handle(cli_env: FakeSlurm) -> None:
    result = invoke("status", "deadbeef")
    assert result.exit_code == 2 and "no dlsub job 'deadbeef'" in result.output


def test_parse_mem() -> None:
    assert parse_mem("4G") == 4096 and parse_mem("512M") == 512 and parse_mem("2048") == 2048


def test_gpu_type_picks_the_model_and_an_unknown_one_submits_nothing(cli_env: FakeSlurm, tmp_path: Path,
                                                                      script: Path) -> None:
    """The CLI against the fake Slurm, gpu1's GPUs a100 and gpu2's v100: `dlsub --gpu-type v100 --gpus 1` asks
    Slurm for gres gpu:v100:1; a kind no node has (h100) exits 2 saying which kinds there are, and submits
    nothing."""
    cli_env.nodes["gpu1"].gpu_type, cli_env.nodes["gpu2"].gpu_type = "a100", "v100"
    result = invoke("--gpu-type", "v100", "--gpus", "1", "--json", str(script))
    assert result.exit_code == 0, result.output
    assert cli_env.submitted()[0].options["gres"] == "gpu:v100:1"
    result = invoke("--gpu-type", "h100", "--gpus", "1", str(script))
    assert result.exit_code == 2 and "gpu has no node with 1 h100 GPU(s) (GPU types there: a100, v100)" in \
        result.output, result.output
    assert len(cli_env.submitted()) == 1
