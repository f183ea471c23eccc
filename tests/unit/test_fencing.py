"""Unit: fencing (issue 53). An attempt that is no longer its job's newest publishes nothing, its launcher stops
its training, and what it wrote after the newer attempt began is never restored. The rule (dlsub/contract.py)
as pure functions; the library and the container's launcher with real processes writing into one job directory
at once, the newer attempt's start recorded as the batch launcher records it; no Slurm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import NO_HANG_S, REPO

from dlsub import contract
from dlsub.checkpointing import fence, sealed, storage
from dlsub.checkpointing.storage import (
    checkpoint_files,
    checkpoint_meta,
    prune,
    restore_latest,
    save_checkpoint,
)

SLURM_ID = 4100
OLD, NEW = f"{SLURM_ID}-0", f"{SLURM_ID}-1"


def start_record(restart: int, when: float, role: str = "main", job: int = SLURM_ID) -> dict[str, object]:
    """An attempt's start line as the batch launcher writes it (slurm_plugins/launcher/records.py)."""
    return {"event": "start", "time": when, "slurm_job_id": job, "restart": restart, "node": "gpu1",
            "partition": "gpu", "role": role}


def record_start(job_dir: Path, restart: int, when: float | None = None) -> float:
    when = time.time() if when is None else when
    with open(job_dir / contract.ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps(start_record(restart, when)) + "\n")
    return when


# ---------------------------------------------------------------- the rule (pure)
@pytest.mark.parametrize(("name", "order"), [
    ("4100-0", (4100, 0)), ("4100-12", (4100, 12)), ("local", None), ("4100", None), ("-1-0", None),
    ("4100-0\n", None), (4100, None), ("", None),
])
def test_an_attempts_name_orders_by_slurm_id_then_restart(name: object, order: tuple[int, int] | None) -> None:
    """Unit (pure)."""
    assert contract.attempt_order(name) == order


def test_only_a_newer_main_attempts_start_supersedes() -> None:
    """Unit (pure): its own start, older attempts, a worker array task's start (a larger Slurm id, role
    worker), an end record and junk supersede nothing; the first newer main start does, with its time."""
    records = [start_record(0, 100.0), start_record(0, 101.0, role="worker", job=SLURM_ID + 7),
               {"event": "end", "time": 102.0, "slurm_job_id": SLURM_ID, "restart": 3, "role": "main"},
               {"event": "start", "time": "soon", "slurm_job_id": SLURM_ID, "restart": 5, "role": "main"},
               {"event": "start", "time": 103.0, "slurm_job_id": True, "restart": 5, "role": "main"}]
    assert contract.superseded_since(OLD, records) is None
    records += [start_record(2, 110.0), start_record(1, 105.0)]
    assert contract.superseded_since(OLD, records) == (NEW, 105.0)
    assert contract.superseded_since(NEW, records) == (f"{SLURM_ID}-2", 110.0)
    assert contract.superseded_since("local", records) is None


def test_a_checkpoint_written_after_a_newer_attempt_began_is_not_the_jobs() -> None:
    """Unit (pure)."""
    records = [start_record(0, 100.0), start_record(1, 200.0)]
    assert contract.written_after_superseded({"attempt": OLD, "time": 150.0}, records) is None
    late = contract.written_after_superseded({"attempt": OLD, "time": 250.0}, records)
    assert late is not None and NEW in late and OLD in late
    assert contract.written_after_superseded({"attempt": NEW, "time": 250.0}, records) is None
    assert contract.written_after_superseded({"step": 3}, records) is None  # an older dlsub's: no attempt


# ---------------------------------------------------------------- the library, in this process
@pytest.fixture
def job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job directory whose first attempt (OLD) has started; this process is that attempt."""
    job = tmp_path / "job"
    job.mkdir()
    record_start(job, 0, time.time() - 60)
    monkeypatch.setenv(contract.ENV_JOB_DIR, str(job))
    monkeypatch.setenv(contract.ENV_ATTEMPT, OLD)
    return job


def test_a_superseded_attempt_publishes_no_checkpoint_and_no_seal(job_dir: Path) -> None:
    """Unit (real files): saved while the newest, a checkpoint records its writer; once a newer attempt has
    started, a save and a seal raise Superseded (exit 86) and leave nothing that counts."""
    checkpoints = job_dir / contract.CHECKPOINT_DIR
    first = save_checkpoint(checkpoints, 1, {"step": 1}, keep=3, step=1)
    assert checkpoint_meta(first)["attempt"] == OLD
    framework_file = job_dir / "framework.ckpt"
    framework_file.write_bytes(b"weights")
    record_start(job_dir, 1)
    with pytest.raises(fence.Superseded) as stopped:
        save_checkpoint(checkpoints, 2, {"step": 2}, keep=3, step=2)
    assert stopped.value.code == contract.SUPERSEDED_EXIT_CODE and NEW in stopped.value.message
    assert [seq for seq, _ in checkpoint_files(checkpoints)] == [1]
    with pytest.raises(fence.Superseded):
        sealed.seal(framework_file, step=2)
    assert sealed.problem(framework_file) is not None  # never sealed: never restored


def test_the_newer_attempt_passes_over_a_late_write_and_pruning_keeps_the_jobs_checkpoint(
        job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (real files): a cut-off node's attempt wrote checkpoints after the newer attempt began, and they
    landed late (the newer start was not yet visible to it). The newer attempt restores the last one written
    before it began, says why it passed over the others; pruning keeps that one; its own saves count."""
    checkpoints = job_dir / contract.CHECKPOINT_DIR
    save_checkpoint(checkpoints, 1, {"step": 1}, keep=3, step=1)
    began = time.time()
    save_checkpoint(checkpoints, 2, {"step": 2}, keep=3, step=2)  # written after `began`: late
    save_checkpoint(checkpoints, 3, {"step": 3}, keep=3, step=3)
    record_start(job_dir, 1, began)
    monkeypatch.setenv(contract.ENV_ATTEMPT, NEW)
    state, path, skipped = restore_latest(checkpoints)
    assert state == {"step": 1} and path is not None and path.name == "ckpt-00000001.pt"
    assert len(skipped) == 2 and all("late write" in reason for reason in skipped), skipped
    prune(checkpoints, keep=2)  # the two newest are the late ones: the job's newest good one stays
    assert restore_latest(checkpoints)[0] == {"step": 1}
    save_checkpoint(checkpoints, 2, {"step": 2, "by": NEW}, keep=2, step=2)  # the newer attempt saves on
    assert restore_latest(checkpoints)[0] == {"step": 2, "by": NEW}


def test_a_late_write_never_replaces_the_newer_attempts_checkpoint_of_the_same_number(
        job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (real files): the cut-off attempt's save passed its check before it could see the newer attempt's
    start, and its files land after the newer attempt saved the same number. They take the next number (and a
    restore passes over them as late); the newer attempt's checkpoint is never replaced, even when the late
    writer looked before the newer file was there and then took the name at once (the link refuses it)."""
    checkpoints = job_dir / contract.CHECKPOINT_DIR
    save_checkpoint(checkpoints, 1, {"step": 1}, keep=5, step=1)
    record_start(job_dir, 1)
    monkeypatch.setenv(contract.ENV_ATTEMPT, NEW)
    newer = save_checkpoint(checkpoints, 2, {"step": 2, "by": NEW}, keep=5, step=2)
    # The older attempt, its check already passed: first with a look that sees the newer file, then with one
    # that missed it.
    monkeypatch.setenv(contract.ENV_ATTEMPT, OLD)
    monkeypatch.setattr(fence, "check", lambda what: None)
    late = save_checkpoint(checkpoints, 2, {"step": 2, "by": OLD}, keep=5, step=2)
    missed = iter([[]])
    real_files = storage.checkpoint_files
    monkeypatch.setattr(storage, "checkpoint_files", lambda d: next(missed, None) or real_files(d))
    later = save_checkpoint(checkpoints, 2, {"step": 2, "by": OLD}, keep=5, step=2)
    assert (newer.name, late.name, later.name) == ("ckpt-00000002.pt", "ckpt-00000003.pt", "ckpt-00000004.pt")
    monkeypatch.setenv(contract.ENV_ATTEMPT, NEW)
    state, path, skipped = restore_latest(checkpoints)
    assert state == {"step": 2, "by": NEW} and path == newer, (path, skipped)
    assert len(skipped) == 2 and all("late write" in reason for reason in skipped), skipped
    assert not [p for p in checkpoints.iterdir() if ".tmp-" in p.name], "no temp files left"


def test_a_late_seal_is_a_problem(job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit (real files): a framework's checkpoint sealed by the old attempt after the newer one began."""
    began = time.time()
    checkpoint = job_dir / "epoch=3.ckpt"
    checkpoint.write_bytes(b"weights")
    sealed.seal(checkpoint, step=3)
    assert sealed.problem(checkpoint) is None
    record_start(job_dir, 1, began)
    monkeypatch.setenv(contract.ENV_ATTEMPT, NEW)
    trouble = sealed.problem(checkpoint)
    assert trouble is not None and "late write" in trouble


# ---------------------------------------------------------------- two attempts alive at once (real processes)
TRAINER = textwrap.dedent(
    """
    import os, sys, time
    from dlsub import checkpointing
    run = checkpointing.init(os.environ["DLSUB_JOB_DIR"])
    state = run.restore() or {"step": 0}
    print("start", state["step"], flush=True)
    for step in range(state["step"] + 1, 10**6):
        run.report(step=step, loss=1.0 / step)
        if step % 5 == 0:
            run.save({"step": step}, step=step)
        time.sleep(0.02)
    """
)


def _attempt_env(job: Path, attempt: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), **{contract.ENV_JOB_DIR: str(job), contract.ENV_ATTEMPT: attempt})


def test_two_attempts_writing_at_once_the_old_one_stops_and_nothing_it_wrote_after_counts(tmp_path: Path) -> None:
    """Unit (two real training processes in one job directory): the old attempt trains and saves; the newer
    one's start is recorded and it starts training from the old one's checkpoint. The old one stops at its
    next record (exit 86, saying why), and every progress record and checkpoint it published was written
    before the newer attempt began."""
    job = tmp_path / "job"
    job.mkdir()
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    record_start(job, 0, time.time() - 1)
    old = subprocess.Popen([sys.executable, str(script)], env=_attempt_env(job, OLD), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert old.stdout is not None and old.stdout.readline().split() == ["start", "0"]
        deadline = time.monotonic() + 30
        while not checkpoint_files(job / contract.CHECKPOINT_DIR) and time.monotonic() < deadline:
            time.sleep(0.05)
        began = record_start(job, 1)
        new = subprocess.Popen([sys.executable, str(script)], env=_attempt_env(job, NEW), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            assert old.wait(timeout=NO_HANG_S) == contract.SUPERSEDED_EXIT_CODE
            assert new.stdout is not None
            resumed = int(new.stdout.readline().split()[1])
            assert resumed >= 5  # from a checkpoint the old attempt wrote while it was the newest
            time.sleep(1.0)  # the newer attempt saves on
            assert new.poll() is None, new.stderr.read() if new.stderr else ""
        finally:
            new.kill()
            new.wait()
        _, old_err = old.communicate()
        assert f"superseded by attempt {NEW}" in old_err, old_err
    finally:
        old.kill()
        old.wait()
    events = [json.loads(line) for line in (job / contract.PROGRESS_FILE).read_text().splitlines()]
    assert events and all(e["time"] < began + 0.001 for e in events if e["attempt"] == OLD), "the old wrote on"
    assert any(e["attempt"] == NEW and e["event"] == "restore" for e in events)
    for _, path in checkpoint_files(job / contract.CHECKPOINT_DIR):
        meta = checkpoint_meta(path)
        assert meta["attempt"] == NEW or meta["time"] < began, (path.name, meta)


# A rank that writes its start and then nothing (a long step, a hung collective): only its launcher stops it.
LONG_RANK = textwrap.dedent(
    """
    import time
    from dlsub import checkpointing
    run = checkpointing.init()
    time.sleep(600)
    """
)


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
@pytest.mark.wall_clock
def test_the_launcher_stops_a_superseded_attempts_training_within_seconds(tmp_path: Path) -> None:
    """Unit (the container's launcher as it runs there, real torchrun and two ranks): once a newer attempt's
    start is recorded, the launcher kills the training without a checkpoint and exits 86, and no rank is
    left."""
    from dlsub.checkpointing import launch

    job = tmp_path / "job"
    job.mkdir()
    record_start(job, 0, time.time() - 1)
    script = tmp_path / "rank.py"
    script.write_text(LONG_RANK)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = _attempt_env(job, OLD)
    env.pop("PYTHONSAFEPATH", None)
    launcher = subprocess.Popen(
        [sys.executable, "-P", "-m", "dlsub.checkpointing.launch", "--grace", "5", "--nproc-per-node", "2", "--",
         torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", "2", *launch.ENTRY_POINT, str(script)],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # both ranks up: each wrote its start (rank 0) or polls
        while time.monotonic() < deadline and not (job / contract.PROGRESS_FILE).exists():
            time.sleep(0.1)
        assert (job / contract.PROGRESS_FILE).exists(), "the ranks never started"
        record_start(job, 1)
        began = time.monotonic()
        code = launcher.wait(timeout=NO_HANG_S)
        took = time.monotonic() - began
        out = launcher.stdout.read() if launcher.stdout else ""
        assert code == contract.SUPERSEDED_EXIT_CODE, out
        assert took < launch.FENCE_CHECK_S + 5, took
        assert f"attempt {NEW} of this job began elsewhere" in out, out
        assert not checkpoint_files(job / contract.CHECKPOINT_DIR)
        leftover = running(script)
        assert not leftover, f"training processes of the attempt left: {leftover}"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
        launcher.wait()
        for pid in running(script):  # torchrun starts each rank in a session of its own: not in the group
            os.kill(pid, 9)


def running(script: Path) -> list[int]:
    """The processes whose command line names ``script`` (the ranks, wherever they were reparented)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(script).encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue  # ended while we looked
    return found
