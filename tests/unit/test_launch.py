"""Unit: the in-container launcher with real processes (no Slurm, no Podman).

A signal to the launcher must reach the training process as SIGUSR1 once it
handles it, and the launcher must exit 85 when the training asked to resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_HANG_S, REPO

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from dlsub import checkpointing
    if os.environ.get("DELAY_INIT"):
        print("started", flush=True)
        time.sleep(float(os.environ["DELAY_INIT"]))   # not yet handling signals
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
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"  # the launcher runs it
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 85, err
    assert "ready" in out
    assert (tmp_path / "job" / "attempts" / "5-0.resume").exists()
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.pt"))


_LEAVES_IN_PROCESS = textwrap.dedent(
    """
    import signal, sys, time
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append("SIGUSR1"))
    signal.signal(signal.SIGUSR2, lambda *_: asked.append("SIGUSR2"))  # as Run.regroup_in_process installs it
    print("ready", flush=True)
    while not asked:
        time.sleep(0.01)
    print(asked[0], flush=True)
    """
)


def test_a_leave_request_reaches_a_training_that_leaves_in_process_as_itself_and_any_other_as_a_checkpoint(
        tmp_path: Path) -> None:
    """contract.LEAVE_SIGNAL (a worker told to leave, issue 52): SIGUSR2 to a training that catches it; to one that
    only catches SIGUSR1 (no in-process re-formation), SIGUSR1: it checkpoints and asks to be resumed."""
    code, out, err = _signalled_once_ready(tmp_path, _LEAVES_IN_PROCESS, signal.SIGUSR2)
    assert (code, out.split()) == (0, ["SIGUSR2"]), err
    assert "asking the training processes to leave the group" in err

    code, _, err = _signalled_once_ready(tmp_path, WORKER, signal.SIGUSR2)
    assert code == 85, err
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.pt")), "it checkpointed, as for SIGUSR1"


def _signalled_once_ready(tmp_path: Path, script: str, signum: int) -> tuple[int, str, str]:
    """Launch ``script`` (it prints "ready" once it handles signals), send the launcher ``signum`` then; its exit
    status and the rest of its output."""
    path = tmp_path / "training.py"
    path.write_text(script)
    proc = _launch(tmp_path, {}, sys.executable, str(path))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=NO_HANG_S)
    return proc.returncode, out, err


def test_the_launcher_records_its_exit_status_for_the_batch_script(tmp_path: Path, monkeypatch: Any) -> None:
    """Unit, in process: record_exit writes the status whole where contract.exit_record says, for a container
    name of the batch script's shape only (the name comes from the environment: never a path)."""
    from dlsub import contract
    from dlsub.checkpointing.launch import record_exit

    monkeypatch.setenv("DLSUB_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("DLSUB_CONTAINER", "dlsub-0123abcd-77-0-trainer0")
    assert record_exit(85) == 85
    assert contract.exit_record(tmp_path / "job", "dlsub-0123abcd-77-0-trainer0").read_text() == "85\n"
    for bad in ("../../escape", "", ".hidden", "a/b"):
        monkeypatch.setenv("DLSUB_CONTAINER", bad)
        assert record_exit(3) == 3
    assert sorted(p.name for p in (tmp_path / "job" / "attempts").iterdir()) == ["dlsub-0123abcd-77-0-trainer0.exit"]
    assert not (tmp_path / "escape.exit").exists()


def test_exit_code_passes_through(tmp_path: Path) -> None:
    proc = _launch(tmp_path, {}, sys.executable, "-c", "raise SystemExit(3)")
    proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 3


@pytest.mark.wall_clock
def test_term_stops_unresponsive_command_after_grace(tmp_path: Path) -> None:
    # Like torchrun over a worker that installs dlsub's handler but never
    # looks at should_stop(): the command (sleep) dies of the SIGTERM.
    code = "import time; from dlsub import checkpointing; checkpointing.init(); print('up', flush=True); time.sleep(10)"
    proc = _launch(tmp_path, {}, "sh", "-c", '"$0" -c "$1" & exec sleep 600', sys.executable, code)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=NO_HANG_S) == 128 + signal.SIGTERM
    assert 4.5 < time.monotonic() - started < 15, "the grace (5 s) first, then SIGTERM"
    _, err = proc.communicate(timeout=NO_HANG_S)  # the orphaned worker keeps the pipes for its 10 s
    assert "did not stop within 5 s" in err


@pytest.mark.wall_clock
def test_term_stops_a_script_that_ignores_the_library_at_once(tmp_path: Path) -> None:
    # A plain script that never calls checkpointing.init(): nothing would use
    # the grace (5 s here, 30 s in jobs), so SIGTERM takes effect at once.
    proc = _launch(tmp_path, {}, sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - started < 2, "no grace for a script that does not handle the signal"
    assert "no training process handles it" in err and "runs on" not in err


def test_term_keeps_the_grace_for_a_script_that_checkpoints(tmp_path: Path) -> None:
    code, _, err = _signalled_once_ready(tmp_path, WORKER, signal.SIGTERM)
    assert code == 85, err
    assert list((tmp_path / "job" / "checkpoints").glob("ckpt-*.pt"))
    assert "no training process handles" not in err, "the worker handled it, then left"


@pytest.mark.wall_clock
def test_unhandled_usr1_is_logged_and_ignored(tmp_path: Path) -> None:
    proc = _launch(tmp_path, {}, sys.executable, "-c",
                   "import time; print('up', flush=True); time.sleep(1.5); print('still running', flush=True)")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode == 0 and "still running" in out
    assert "no training process handles SIGUSR1" in err


def _group_member(tmp_path: Path, runs: Path, main_reforms: bool) -> list[str]:
    """A stand-in for torchrun: each run counts itself; the first checkpoints for the group (the resume
    marker) and exits 0, as a member does when the group stops for a node that left; with ``main_reforms``
    it also leaves the main job's mark, as the main job's launcher would. The second run finishes (rank 0's
    "finished" record, as checkpointing.Run.finish writes it)."""
    attempts = tmp_path / "job" / "attempts"
    progress = tmp_path / "job" / "progress.jsonl"
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
        else:
            with open({str(progress)!r}, "a") as f:
                f.write('{{"event": "finished", "attempt": "5-0"}}\\n')
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


@pytest.mark.parametrize(("progress", "finished"), [
    ('{"event":"finished","attempt":"5-0","step":5}\n', True),  # compact JSON, as any writer may make it
    ('{"event": "checkpoint", "attempt": "5-0"}\n{"event": "finished", "attempt": "5-0"}\n', True),
    ('not json\n{"event": "finished", "attempt": "4-0"}\n{"attempt": "5-0", "event": "checkpoint"}\n', False),
    ('["event", "finished", "attempt", "5-0"]\n', False),
    (None, False),
])
def test_a_worker_whose_torchrun_exits_0_is_done_only_when_its_attempt_finished(
        tmp_path: Path, monkeypatch: Any, progress: str | None, finished: bool) -> None:
    """In-process launcher, a real child: a worker's (``--follow``) torchrun also exits 0 when its group ended
    without it; the launcher exits 0 only when the progress file holds its attempt's "finished" record (read as
    JSON, whatever its spacing), else 85: the worker's batch script sends it back to the pool. The main job's
    launcher passes the 0 through as before."""
    from dlsub.checkpointing import launch

    (tmp_path / "job").mkdir()
    if progress is not None:
        (tmp_path / "job" / "progress.jsonl").write_text(progress)
    monkeypatch.setenv("DLSUB_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("DLSUB_ATTEMPT", "5-0")
    ok = [sys.executable, "-c", "pass"]
    assert launch.Launcher(ok, 5, elastic=True, follow=True).run() == (0 if finished else 85)
    assert launch.Launcher(ok, 5, elastic=True).run() == 0


REFORMING_RANK = textwrap.dedent(
    """
    import os, pathlib
    from dlsub import checkpointing
    out = pathlib.Path(os.environ["OUT"])
    parent = pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\\0")
    run = checkpointing.init()
    state = run.restore()
    with open(out / "runs", "a") as f:  # which torchrun started this run, and what stdin the rank has
        f.write(f"{b'--from-stdin' in parent} {os.readlink('/proc/self/fd/0')}\\n")
    if state is None:
        run.request_stop("peer")  # as when the group stops for a member that left
        run.save({"step": 1}, step=1)
        run.exit_for_resume()
    run.finish()
    """
)


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
def test_a_re_formed_group_starts_from_the_torchrun_started_while_the_old_one_stopped(tmp_path: Path) -> None:
    """Real torchrun and launcher, no Slurm: the group stops for a member that left (rank 0's stop reason is
    the peer's); the launcher starts the next torchrun as it stops and hands it its arguments when the group
    re-forms. The re-formed run is that torchrun's, its rank reads /dev/null as before, and it finishes."""
    script = tmp_path / "rank.py"
    script.write_text(REFORMING_RANK)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = dict(os.environ, DLSUB_JOB_DIR=str(tmp_path / "job"), SLURM_JOB_ID="5", SLURM_RESTART_COUNT="0",
               DLSUB_ATTEMPT="5-0", OUT=str(tmp_path), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "dlsub.checkpointing.launch", "--grace", "5", "--elastic", "--",
         torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", "1", str(script)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs").read_text().splitlines() == ["False /dev/null", "True /dev/null"], done.stderr[-3000:]
    assert "re-forming it" in done.stderr


def test_no_standby_when_torchrun_itself_restarts_the_group(tmp_path: Path, monkeypatch: Any) -> None:
    """In-process launcher: a group that stopped on torchrun's SIGTERM (a member joined: torchrun
    re-rendezvouses by itself) gets no standby torchrun; one that stopped for a peer does, once."""
    from dlsub.checkpointing import launch

    monkeypatch.setenv("DLSUB_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    marker = tmp_path / "job" / "attempts" / "5-0.resume"
    marker.parent.mkdir(parents=True)
    launcher = launch.Launcher(["torchrun", "--standalone", "x.py"], 5, elastic=True)
    started = time.time()
    marker.write_text(json.dumps({"reason": "SIGTERM"}))
    launcher._maybe_start_standby(started)
    assert launcher.standby is None
    marker.write_text(json.dumps({"reason": "peer"}))
    os.utime(marker, (started + 5, started + 5))
    launcher._maybe_start_standby(started)
    try:
        assert launcher.standby is not None and launcher.standby.poll() is None
        first = launcher.standby
        launcher._maybe_start_standby(started)
        assert launcher.standby is first
    finally:
        launcher._drop_standby()
    assert first.returncode is not None and launcher.standby is None


def test_torchrun_main_refuses_a_command_line_it_cannot_read() -> None:
    done = subprocess.run([sys.executable, "-m", "dlsub.checkpointing.torchrun_main", "--from-stdin"],
                          input="not json\n", capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2 and "no command line came on standard input" in done.stderr


def test_without_labels_a_group_still_runs_through_the_entry_point(monkeypatch: Any) -> None:
    """Unit (no Slurm, no Podman): where the output's labelling cannot be set up, a job of several processes
    keeps dlsub's entry point (unlabelled): its processes need it for more than labels (a Horovod script's
    hvd.init() joins torchrun's group there); a process alone still runs its script directly."""
    from dlsub.checkpointing import launch

    started: list[list[str]] = []

    class FakeLauncher:
        def __init__(self, command: list[str], *args: Any, **kwargs: Any) -> None:
            started.append(command)
            assert len(args) < 3 and kwargs.get("output") is None

        def run(self) -> int:
            return 0

    def no_socket(self: Any) -> Any:
        raise OSError("no private temporary directory")

    monkeypatch.setattr(launch, "Launcher", FakeLauncher)
    monkeypatch.setattr(launch.OutputMux, "start", no_socket)
    monkeypatch.delenv("DLSUB_NNODES", raising=False)
    monkeypatch.delenv("DLSUB_WATCH_NO_GPU", raising=False)
    command = ["torchrun", "--nproc-per-node", "2", *launch.ENTRY_POINT, "train.py"]
    assert launch.main(["--nproc-per-node", "2", "--", *command]) == 0
    assert launch.main(["--nproc-per-node", "1", "--", *command]) == 0
    assert started == [command, launch.without_entry_point(command)]


def _launch_as_the_container_does(tmp_path: Path, work: Path, script: Path,
                                  nproc: int) -> subprocess.CompletedProcess[str]:
    """The launcher as the container starts it (``python3 -P -m``, in the submit directory ``work``), over real
    torchrun and dlsub's entry point, ``nproc`` processes; no PYTHONSAFEPATH of the caller's."""
    from dlsub.checkpointing import launch

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = dict(os.environ, DLSUB_JOB_DIR=str(tmp_path / "job"), SLURM_JOB_ID="5", SLURM_RESTART_COUNT="0",
               DLSUB_ATTEMPT="5-0", PYTHONPATH=str(REPO))
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.launch", "--grace", "5", "--nproc-per-node", str(nproc),
         "--", torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), *launch.ENTRY_POINT,
         str(script)],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)


SHADOWED_RANK = textwrap.dedent(
    """
    import json, os, sys
    import dlsub
    from dlsub import checkpointing
    run = checkpointing.init()
    print(json.dumps({"dlsub": dlsub.__file__, "path0": sys.path[0], "cwd_first": sys.path[0] in ("", os.getcwd()),
                      "safe": os.environ.get("PYTHONSAFEPATH"), "marker": os.environ.get("DLSUB_SAFE_PATH_SET")}))
    run.finish()
    """
)


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
def test_a_dlsub_folder_in_the_working_directory_never_stands_in_for_dlsub(tmp_path: Path) -> None:
    """Real launcher, torchrun and entry point, no Slurm: the container starts them with ``python3 -P -m`` in the
    submit directory; a folder named dlsub there (a clone of dlsub, a user's own package) is not imported in
    their place. The script then runs as ``python SCRIPT`` would: its own folder first, the environment as given
    (no PYTHONSAFEPATH of dlsub's for its subprocesses)."""
    work = tmp_path / "submit dir"
    (work / "dlsub").mkdir(parents=True)
    (work / "dlsub" / "__init__.py").write_text("raise ImportError('the submit directory shadowed dlsub')\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    script = scripts / "rank.py"
    script.write_text(SHADOWED_RANK)
    done = _launch_as_the_container_does(tmp_path, work, script, nproc=2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = [json.loads(line.split(":", 1)[1]) for line in done.stdout.splitlines() if '"dlsub"' in line]
    assert len(seen) == 2, done.stdout
    for rank in seen:
        assert rank["dlsub"] == str(REPO / "dlsub" / "__init__.py"), rank
        assert rank["path0"] == str(scripts) and not rank["cwd_first"], rank
        assert rank["safe"] is None and rank["marker"] is None, "the script's environment is the one it was given"


SIBLING_RANK = textwrap.dedent(
    """
    import os, sys
    import helper_beside_me  # a module in the script's own folder, as users keep their model code
    print("sibling", helper_beside_me.VALUE, os.environ.get("PYTHONSAFEPATH"), flush=True)
    """
)


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
def test_a_process_alone_finds_the_modules_beside_its_script(tmp_path: Path) -> None:
    """Real launcher and torchrun, no Slurm: a job of one process runs its script without dlsub's entry point
    (torchrun starts it), in the submit directory; the script imports a module from its own folder, as
    ``python SCRIPT`` lets it, and gets no PYTHONSAFEPATH of dlsub's."""
    work = tmp_path / "submit"
    work.mkdir()
    scripts = tmp_path / "code"
    scripts.mkdir()
    (scripts / "helper_beside_me.py").write_text("VALUE = 42\n")
    script = scripts / "train.py"
    script.write_text(SIBLING_RANK)
    done = _launch_as_the_container_does(tmp_path, work, script, nproc=1)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "sibling 42 None" in done.stdout, done.stdout + done.stderr[-2000:]
