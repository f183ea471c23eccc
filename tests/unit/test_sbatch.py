"""Unit: batch-script rendering (pure) — a golden file, and the rendered
script run by bash with stand-in `podman`/`scontrol` to prove its quoting and
its resume protocol. No Slurm and no Podman involved."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from dlsub.containers.podman import ContainerSpec
from dlsub.slurm_plugins.sbatch import BatchSpec, render_sbatch

GOLDEN = Path(__file__).parent / "golden" / "train.sbatch"
NASTY_ARGS = ("--lr", "0.1", "a b", "it's", 'say "hi"', "x; touch /tmp/dlsub-pwned", "$(id)", "`id`", "*")


def spec(tmp: Path, script: Path, args: tuple[str, ...] = ("--epochs", "3"), gpus: int = 0) -> BatchSpec:
    container = ContainerSpec(
        image="localhost/dlsub-torch:2.13.0-cpu",
        script=script,
        script_args=args,
        job_dir=tmp / "home" / ".dlsub" / "jobs" / "0123abcd",
        workdir=script.parent,
        library_dir=Path("/opt/dlsub/venv/lib/python3.11/site-packages/dlsub"),
        nproc_per_node=max(1, gpus),
    )
    return BatchSpec(
        dlsub_id="0123abcd", job_name="train", partition="gpu", container=container,
        gpus_per_node=gpus, cpus_per_task=2, mem_mb=4096, time_limit_min=90, signal_grace_s=60,
        dlsub_version="0.1.0",
    )


def test_golden_batch_script() -> None:
    text = render_sbatch(spec(Path("/golden"), Path("/home/alice/proj/train.py"), gpus=2))
    if os.environ.get("DLSUB_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered script changed; review it, then DLSUB_UPDATE_GOLDEN=1 pytest"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_script(tmp_path: Path, script: Path, args: tuple[str, ...], container_rc: int) -> tuple[int, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.jsonl"
    # Stand-ins record their argv as JSON; python3 keeps the record exact.
    record = f'python3 -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$(basename "$0")" "$@" >> {log}\n'
    _stub(bin_dir, "podman", record + f'[ "$1" = rm ] && exit 0\nexit {container_rc}\n')
    _stub(bin_dir, "scontrol", record + "exit 0\n")
    text = render_sbatch(spec(tmp_path, script, args))
    batch = tmp_path / "job.sbatch"
    batch.write_text(text)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="77", SLURM_RESTART_COUNT="0",
               SLURM_JOB_PARTITION="gpu", XDG_RUNTIME_DIR=str(tmp_path / "xdg"))
    result = subprocess.run(["bash", str(batch)], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    return result.returncode, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_nasty_paths_and_arguments_reach_the_container_intact(tmp_path: Path) -> None:
    weird_dir = tmp_path / "my dir; it's \"quoted\""
    weird_dir.mkdir()
    script = weird_dir / "train me;.py"
    script.write_text("print('hi')\n")
    rc, log = _run_script(tmp_path, script, NASTY_ARGS, container_rc=0)
    assert rc == 0
    assert not Path("/tmp/dlsub-pwned").exists()
    run = next(c for c in _calls(log) if c[:1] == ["podman"] and "run" in c)
    # The script and its arguments are the last words, exactly as given.
    assert run[-len(NASTY_ARGS) - 1:] == [str(script), *NASTY_ARGS]
    assert f"{weird_dir}:{weird_dir}" in run
    assert "dlsub.slurm_job_id=77" in run and "dlsub.attempt=77-0" in run
    assert not any(c[:2] == ["scontrol", "requeue"] for c in _calls(log))


def test_resume_exit_code_requeues_the_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=85)
    assert rc == 0
    assert ["scontrol", "requeue", "77"] in _calls(log)
    attempts = (tmp_path / "home/.dlsub/jobs/0123abcd/attempts.jsonl").read_text().splitlines()
    assert json.loads(attempts[-1])["action"] == "requeue"


def test_failure_exit_code_is_kept_and_not_requeued(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc, log = _run_script(tmp_path, script, (), container_rc=3)
    assert rc == 3
    assert not any(c[:2] == ["scontrol", "requeue"] for c in _calls(log))
    assert any(c[:2] == ["podman", "rm"] for c in _calls(log)), "the EXIT trap removes the container"


def test_multi_node_is_refused_clearly(tmp_path: Path) -> None:
    s = spec(tmp_path, tmp_path / "t.py")
    with pytest.raises(ValueError, match="multi-node"):
        render_sbatch(BatchSpec(**{**s.__dict__, "nodes": 2}))
