"""Unit: the in-container launcher with real processes (no Slurm, no Podman).

A signal to the launcher must reach the training process as SIGUSR1 once it
handles it, and the launcher must exit 85 when the training asked to resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from dlsub import checkpointing
    time.sleep(float(os.environ.get("DELAY_INIT", "0")))   # not yet handling signals
    run = checkpointing.init()
    print("ready", flush=True)
    step = 0
    while not run.should_stop():
        step += 1
        time.sleep(0.01)
    run.save({"step": step}, step=step)
    run.exit_for_resume()
    """
)


def _launch(tmp_path: Path, extra_env: dict[str, str], *command: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DLSUB_JOB_DIR=str(tmp_path / "job"), SLURM_JOB_ID="5", SLURM_RESTART_COUNT="0", **extra_env)
    return subprocess.Popen(
        [sys.executable, "-m", "dlsub.checkpointing.launch", "--grace", "5", "--", *command],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_usr1_reaches_worker_late_and_launcher_exits_85(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    # The signal arrives before the worker installs its handler; the launcher
    # must wait for it rather than kill it with an unhandled SIGUSR1.
    proc = _launch(tmp_path, {"DELAY_INIT": "1.5"}, sys.executable, str(worker))
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 85, err
    assert "ready" in out
    assert (tmp_path / "job" / "attempts" / "5-0.resume").exists()
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.pt"))


def test_exit_code_passes_through(tmp_path: Path) -> None:
    proc = _launch(tmp_path, {}, sys.executable, "-c", "raise SystemExit(3)")
    proc.communicate(timeout=30)
    assert proc.returncode == 3


def test_term_stops_unresponsive_command_after_grace(tmp_path: Path) -> None:
    # Like torchrun over a worker that installs dlsub's handler but never
    # looks at should_stop(): the command (sleep) dies of the SIGTERM.
    code = "import time; from dlsub import checkpointing; checkpointing.init(); print('up', flush=True); time.sleep(20)"
    proc = _launch(tmp_path, {}, "sh", "-c", '"$0" -c "$1" & exec sleep 600', sys.executable, code)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert 4.5 < time.monotonic() - started < 15, "the grace (5 s) first, then SIGTERM"
    _, err = proc.communicate(timeout=30)  # the orphaned worker keeps the pipes for its 20 s
    assert "did not stop within 5 s" in err


def test_term_stops_a_script_that_ignores_the_library_at_once(tmp_path: Path) -> None:
    # A plain script that never calls checkpointing.init(): nothing would use
    # the grace (5 s here, 30 s in jobs), so SIGTERM takes effect at once.
    proc = _launch(tmp_path, {}, sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - started < 2, "no grace for a script that does not handle the signal"
    assert "no training process handles it" in err and "runs on" not in err


def test_term_keeps_the_grace_for_a_script_that_checkpoints(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = _launch(tmp_path, {}, sys.executable, str(worker))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 85, err
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.pt"))
    assert "no training process handles" not in err, "the worker handled it, then left"


def test_unhandled_usr1_is_logged_and_ignored(tmp_path: Path) -> None:
    proc = _launch(tmp_path, {}, sys.executable, "-c",
                   "import time; print('up', flush=True); time.sleep(1.5); print('still running', flush=True)")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "still running" in out
    assert "no training process handles SIGUSR1" in err


def _group_member(tmp_path: Path, runs: Path, main_reforms: bool) -> list[str]:
    """A stand-in for torchrun: each run counts itself; the first checkpoints for the group (the resume
    marker) and exits 0, as a member does when the group stops for a node that left; with ``main_reforms``
    it also leaves the main job's mark, as the main job's launcher would. The second run finishes."""
    attempts = tmp_path / "job" / "attempts"
    script = textwrap.dedent(f"""
        import pathlib, time
        runs = pathlib.Path({str(runs)!r})
        runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
        # As checkpointing.init() does: a run answers the stop request that led to it.
        (pathlib.Path({str(attempts)!r}) / "5-0.resume").unlink(missing_ok=True)
        if len(runs.read_text()) == 1:
            (pathlib.Path({str(attempts)!r}) / "5-0.resume").touch()
            if {main_reforms!r}:
                (pathlib.Path({str(attempts)!r}) / "5-0.reform").touch()
            time.sleep(1.5)  # the marks are this run's, older than the next run's start
        """)
    return [sys.executable, "-c", script]


def test_a_worker_re_forms_with_its_main_job_and_only_then(tmp_path: Path, monkeypatch: Any) -> None:
    """In-process launcher, real child processes: a worker (``--follow``) whose group stopped re-forms when
    the main job marks that it re-forms, and otherwise goes back to the pool (exit 85) after a short wait."""
    from dlsub.checkpointing import launch

    (tmp_path / "job" / "attempts").mkdir(parents=True)
    monkeypatch.setenv("DLSUB_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("DLSUB_ATTEMPT", "5-0")
    monkeypatch.setattr(launch, "FOLLOW_WAIT_S", 1.0)
    runs = tmp_path / "runs-followed"
    assert launch.Launcher(_group_member(tmp_path, runs, True), 5, elastic=True, follow=True).run() == 0
    assert runs.read_text() == "xx", "re-formed once, then finished with the group"
    for marker in (tmp_path / "job" / "attempts").iterdir():
        marker.unlink()
    runs = tmp_path / "runs-alone"
    assert launch.Launcher(_group_member(tmp_path, runs, False), 5, elastic=True, follow=True).run() == 85
    assert runs.read_text() == "x", "no mark from the main job: back to the pool, not a second run"
    # The main job's launcher leaves the mark itself when it re-forms.
    for marker in (tmp_path / "job" / "attempts").iterdir():
        marker.unlink()
    runs = tmp_path / "runs-main"
    assert launch.Launcher(_group_member(tmp_path, runs, False), 5, elastic=True).run() == 0
    assert runs.read_text() == "xx" and (tmp_path / "job" / "attempts" / "5-0.reform").exists()
