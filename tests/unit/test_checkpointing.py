"""Unit: the checkpointing library — atomic saves, keep-K, fallback past
corrupt or truncated checkpoints, signals, exit_for_resume, and one
checkpoint restored by every rank of a torch.distributed group (real files,
real signals, real subprocesses; no Slurm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import NO_HANG_S, REPO, run_ranks

from dlsub import checkpointing
from dlsub.checkpointing.storage import checkpoint_files


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = checkpointing.init(tmp_path / "job", keep=2, total_steps=100)
    yield r
    r.uninstall_signal_handlers()


def test_save_restore_round_trip_with_tensors(run) -> None:  # type: ignore[no-untyped-def]
    state = {"step": 7, "w": torch.arange(5.0)}
    path = run.save(state, step=7)
    assert path is not None and path.exists()
    restored = run.restore()
    assert restored["step"] == 7 and torch.equal(restored["w"], state["w"])
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name], "no temp files left"


def test_keeps_only_last_k(run) -> None:  # type: ignore[no-untyped-def]
    for step in (1, 2, 3, 4):
        run.save({"step": step}, step=step)
    assert [seq for seq, _ in checkpoint_files(run.checkpoint_dir)] == [4, 3]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "no-checksum"])
def test_corrupt_newest_falls_back_to_previous(run, damage: str) -> None:  # type: ignore[no-untyped-def]
    run.save({"step": 10}, step=10)
    newest = run.save({"step": 20}, step=20)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "empty":
        newest.write_bytes(b"")
    else:
        newest.with_name(newest.name + ".sha256").unlink()
    assert run.restore() == {"step": 10}
    assert run.restored_from.name == "ckpt-00000010.pt"


def test_restore_none_when_nothing_saved(run) -> None:  # type: ignore[no-untyped-def]
    assert run.restore() is None


def test_report_appends_progress_events(run) -> None:  # type: ignore[no-untyped-def]
    run.report(step=5, epoch=0, loss=1.5, samples=320)
    events = [json.loads(line) for line in (run.job_dir / "progress.jsonl").read_text().splitlines()]
    last = events[-1]
    assert last["event"] == "progress" and last["step"] == 5 and last["loss"] == 1.5 and last["total_steps"] == 100


def test_signals_set_should_stop(run) -> None:  # type: ignore[no-untyped-def]
    assert not run.should_stop()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert run.should_stop() and run.stop_reason == "SIGUSR1"


def test_import_installs_no_signal_handlers() -> None:
    code = "import signal, dlsub.checkpointing; print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_non_dict_state_is_refused(run) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="dict"):
        run.save([1, 2, 3])  # type: ignore[arg-type]


TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    from dlsub import checkpointing
    run = checkpointing.init(os.environ["JOB"])
    state = run.restore() or {"step": 0}
    print("start", state["step"], flush=True)
    for step in range(state["step"], 10**6):
        if step == state["step"] + 3 and os.environ.get("SELF_SIGNAL"):
            os.kill(os.getpid(), signal.SIGUSR1)
        if run.should_stop():
            run.save({"step": step}, step=step)
            run.exit_for_resume()
        time.sleep(0.01)
    """
)


def test_exit_for_resume_exits_85_and_resumes_at_saved_step(tmp_path: Path) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    env = dict(os.environ, JOB=str(tmp_path / "job"), SELF_SIGNAL="1")
    first = subprocess.run([sys.executable, str(trainer)], env=env, capture_output=True, text=True, timeout=NO_HANG_S)
    assert first.returncode == checkpointing.RESUME_EXIT_CODE == 85
    assert first.stdout.split() == ["start", "0"]
    env.pop("SELF_SIGNAL")
    proc = subprocess.Popen([sys.executable, str(trainer)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().split() == ["start", "3"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=NO_HANG_S) == 85


EXITING_TRAINER = textwrap.dedent(
    """
    import atexit, gc, os, sys
    from dlsub import checkpointing
    job = os.environ["JOB"]
    log = open(os.path.join(job, "user.log"), "w")  # never closed: Python flushes it at exit
    log.write("written before the stop")
    atexit.register(lambda: open(os.path.join(job, "atexit"), "w").write(str(gc.get_freeze_count())))
    run = checkpointing.init(job)
    run.save({"step": 1}, step=1)
    run.exit_for_resume()
    """
)


def test_exit_for_resume_freezes_the_collector_and_keeps_the_users_exit(tmp_path: Path) -> None:
    """Unit (a real subprocess): a resize waits on every process's exit, and the collector's passes over
    torch's objects at exit cost about a second each; exit_for_resume freezes them first. The user's
    atexit handlers still run and a file left open is still flushed."""
    trainer = tmp_path / "trainer.py"
    trainer.write_text(EXITING_TRAINER)
    job = tmp_path / "job"
    job.mkdir()
    done = subprocess.run([sys.executable, str(trainer)], env=dict(os.environ, JOB=str(job), PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=NO_HANG_S)
    assert done.returncode == checkpointing.RESUME_EXIT_CODE, done.stderr
    assert int((job / "atexit").read_text()) > 0  # frozen before the user's handler ran
    assert (job / "user.log").read_text() == "written before the stop"


def _events(run, kind: str) -> list[dict]:  # type: ignore[no-untyped-def]
    lines = (run.job_dir / "progress.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_save_without_step_records_the_last_reported_step(run) -> None:  # type: ignore[no-untyped-def]
    run.report(step=41, loss=0.5)
    run.save({"w": 1})
    (event,) = _events(run, "checkpoint")
    assert event["step"] == 41 and isinstance(event["step"], int) and event["seq"] == 1


def test_save_without_step_or_report_records_the_sequence(run) -> None:  # type: ignore[no-untyped-def]
    run.save({"w": 1})
    run.save({"w": 2})
    assert [(e["step"], e["seq"]) for e in _events(run, "checkpoint")] == [(1, 1), (2, 2)]


def test_save_after_restore_records_the_restored_step(tmp_path: Path) -> None:
    first = checkpointing.init(tmp_path / "job", handle_signals=False)
    first.report(step=120)
    first.save({"w": 1})
    second = checkpointing.init(tmp_path / "job", handle_signals=False)
    assert second.restore() == {"w": 1}
    assert _events(second, "restore")[-1]["step"] == 120
    second.save({"w": 2})
    last = _events(second, "checkpoint")[-1]
    assert last["step"] == 120 and last["seq"] == 2


def test_init_without_arguments_uses_a_local_job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DLSUB_JOB_DIR", raising=False)
    r = checkpointing.init()
    try:
        r.save({"step": 1})
        assert r.restore() == {"step": 1}
        assert (tmp_path / "dlsub-run" / "progress.jsonl").exists()
    finally:
        r.uninstall_signal_handlers()


def test_pruning_keeps_the_newest_checkpoint_that_verifies(run) -> None:  # type: ignore[no-untyped-def]
    # The two newest (keep=2) are corrupt: the good checkpoint 1 is all a
    # restore has, so pruning must keep it.
    from dlsub.checkpointing import storage

    good = storage.save_checkpoint(run.checkpoint_dir, 1, {"step": 1}, keep=10)
    for step in (2, 3):
        storage.save_checkpoint(run.checkpoint_dir, step, {"step": step}, keep=10).write_bytes(b"garbage")
    storage.prune(run.checkpoint_dir, keep=2)
    assert good.exists(), "the only checkpoint that verifies is kept past keep=2"
    assert [seq for seq, _ in checkpoint_files(run.checkpoint_dir)] == [3, 2, 1]
    assert run.restore() == {"step": 1}
    # Once a newer good one exists, the old good one may go.
    run.save({"step": 4}, step=4)
    assert [seq for seq, _ in checkpoint_files(run.checkpoint_dir)] == [4, 3]
    assert storage.verifies(run.checkpoint_dir / "ckpt-00000004.pt")


def test_checkpoints_stay_owner_only(run) -> None:  # type: ignore[no-untyped-def]
    run.save({"step": 1})
    assert run.checkpoint_dir.stat().st_mode & 0o777 == 0o700


def test_the_start_event_names_the_command_by_its_script_and_arguments(tmp_path: Path) -> None:
    """The agent sizes another run of the same command on what this one measured (scaling_history)."""
    from dlsub.contract import application_digest

    trainer = tmp_path / "my trainer.py"
    trainer.write_text("import os\nfrom dlsub import checkpointing\ncheckpointing.init(os.environ['JOB'])\n")

    def started(job: str, *args: str) -> str:
        env = dict(os.environ, JOB=str(tmp_path / job))
        subprocess.run([sys.executable, str(trainer), *args], env=env, check=True, timeout=NO_HANG_S)
        events = [json.loads(line) for line in (tmp_path / job / "progress.jsonl").read_text().splitlines()]
        return str(next(e for e in events if e["event"] == "start")["application"])

    first = started("a", "--lr", "0.1; rm -rf x")
    assert first == application_digest(trainer.read_bytes(), ["--lr", "0.1; rm -rf x"])
    assert started("b", "--lr", "0.1; rm -rf x") == first, "another run of the same command"
    assert started("c", "--lr", "0.2") != first, "other arguments: another command"


@pytest.mark.parametrize(("env", "said"), [("a100", "a100"), ("", None), ("a100,v100", None), ("x\"y", None)])
def test_the_start_event_names_the_kind_of_gpu_the_batch_script_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, said: str | None
) -> None:
    """DLSUB_GPU_TYPE (the node's GRES type, from the batch script) goes into the start event: the agent keeps
    what a job measured on each kind apart. Not one name (a node of two kinds, garbage): left out."""
    monkeypatch.setenv("DLSUB_GPU_TYPE", env)
    r = checkpointing.init(tmp_path / "job")
    r.uninstall_signal_handlers()
    events = [json.loads(line) for line in (tmp_path / "job" / "progress.jsonl").read_text().splitlines()]
    assert next(e for e in events if e["event"] == "start").get("gpu_type") == said


# ---------------------------------------------------------------- every rank restores the same checkpoint

_LATE_RANK = textwrap.dedent("""
    import json, sys, time
    import torch.distributed as dist
    from dlsub import checkpointing
    dist.init_process_group("gloo")
    run = checkpointing.init(sys.argv[1], handle_signals=False)
    if run.rank == 1:
        time.sleep(2)  # a rank that starts late, as a worker node's do when they join a grown group
    state = run.restore()
    run.save({"step": 99}, step=99)  # at an epoch's end the training saves at once after restoring
    print(json.dumps([run.rank, state["step"], run.restored_from.name]))
    dist.destroy_process_group()
""")


def test_every_rank_restores_the_checkpoint_rank_0_picked_though_one_comes_late(tmp_path: Path) -> None:
    job = tmp_path / "job"
    first = checkpointing.init(job, handle_signals=False)
    first.save({"step": 7}, step=7)
    outs = sorted(json.loads(line) for line in run_ranks(_LATE_RANK, [str(job)], [{}, {}]))
    assert outs == [[0, 7, "ckpt-00000007.pt"], [1, 7, "ckpt-00000007.pt"]], \
        "the late rank read what rank 0 restored, not the checkpoint rank 0 saved after it"


# ---------------------------------------------------------------- why a rank stopped, when a peer asked

_ASKED_RANK = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from dlsub import checkpointing
    dist.init_process_group("gloo")
    run = checkpointing.init(sys.argv[1], handle_signals=False)
    if run.rank == 1:
        run.request_stop(sys.argv[2])
    print(json.dumps([run.rank, run.should_stop(), run.stop_reason]))
    dist.destroy_process_group()
""")


def test_a_peers_stop_tells_torchruns_restart_from_other_requests(tmp_path: Path) -> None:
    """Unit (a real gloo group of two processes): rank 1 stopped by its torchrun (SIGTERM: a restart for a
    member that joined) stops rank 0 as a peer's restart; any other request (a member leaving) as "peer"."""
    for asked, told in (("SIGTERM", checkpointing.run.STOP_PEER_RESTART), ("SIGUSR1", "peer")):
        outs = sorted(json.loads(line) for line in run_ranks(_ASKED_RANK, [str(tmp_path / asked), asked], [{}, {}]))
        assert outs == [[0, True, told], [1, True, asked]], outs


class _SignalledDuringTheAllReduce:
    """A group whose all-reduce this process's own torchrun interrupts with SIGTERM, while another member's
    SIGTERM makes the answer 2."""

    rank = 0

    def max(self, value: int) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return 2


def test_a_sigterm_that_comes_during_the_stop_all_reduce_is_this_processs_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (this process's own signal handler, a stand-in group): torchrun's SIGTERM that lands while the
    ranks agree to stop is not taken for a peer's restart, which would wait 15 s for a SIGTERM already here."""
    monkeypatch.setattr(checkpointing.run, "collectives", _SignalledDuringTheAllReduce)
    run = checkpointing.init(tmp_path / "job")
    try:
        assert run.should_stop() is True
        assert run.stop_reason == "SIGTERM"
    finally:
        run.uninstall_signal_handlers()


_RESTARTED_RANK = textwrap.dedent("""
    import os, sys, time
    from dlsub import checkpointing
    run = checkpointing.init(os.environ["JOB"])
    run.stop_reason = checkpointing.run.STOP_PEER_RESTART
    print("stopping", flush=True)
    run.exit_for_resume()
""")


@pytest.mark.parametrize("elastic", [True, False])
def test_a_rank_stopped_by_a_peers_restart_leaves_on_its_own_torchruns_sigterm(tmp_path: Path, elastic: bool) -> None:
    """Unit (a real subprocess): in an elastic group a process stopped by another member's restart waits for
    its own torchrun's SIGTERM before it exits (exiting first, it would look finished to its torchrun, which
    would then wait at its exit barrier while the others re-form). Elsewhere it exits at once."""
    trainer = tmp_path / "trainer.py"
    trainer.write_text(_RESTARTED_RANK)
    env = dict(os.environ, JOB=str(tmp_path / "job"), PYTHONPATH=str(REPO))
    env.pop("DLSUB_NNODES", None)
    if elastic:
        env["DLSUB_NNODES"] = "1:4"
    proc = subprocess.Popen([sys.executable, str(trainer)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stopping"
    if elastic:
        time.sleep(1.5)
        assert proc.poll() is None, "left before its own torchrun stopped it"
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=NO_HANG_S) == checkpointing.RESUME_EXIT_CODE
