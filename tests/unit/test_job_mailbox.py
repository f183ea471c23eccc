"""Unit tests (no Slurm, real files in tmp_path): the agent's mailbox in a job directory.

``publish_batch`` writes the batch size the agent picked into a directory
its hostile owner controls, so each test plays the owner's trick and checks
that nothing is written through it; ``make_job_dir`` makes the mailbox only
where ACLs can keep it the agent's and the owner's; the progress reader
range-checks what the training says about its batch.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dlsub.agent import job_mailbox
from dlsub.agent.job_mailbox import MailboxError, publish_batch
from dlsub.contract import AGENT_MAILBOX_DIR, BATCH_FILE, MAILBOX_MAX_BYTES, batch_file
from dlsub.job.private_files import AgentAccess, make_job_dir
from dlsub.jobdir import check_progress_event

ME = os.getuid()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "jobs" / "0123abcd"
    (directory / AGENT_MAILBOX_DIR).mkdir(parents=True)
    return directory


def _leftovers(job_dir: Path) -> list[str]:
    return sorted(p.name for p in (job_dir / AGENT_MAILBOX_DIR).iterdir() if p.name != BATCH_FILE)


def test_publishes_a_readable_message_and_replaces_the_last(job_dir: Path) -> None:
    old_umask = os.umask(0o077)  # the agent's umask must not make the file unreadable to the job's user
    try:
        publish_batch(job_dir, ME, 256, 2, "grew to 2 nodes")
        publish_batch(job_dir, ME, 512, 1, "grew to 4 nodes\nsecond line")
    finally:
        os.umask(old_umask)
    path = batch_file(job_dir)
    message = json.loads(path.read_text())
    assert message["batch_size"] == 512 and message["accumulation_steps"] == 1
    assert message["reason"] == "grew to 4 nodes second line" and message["time"] > 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.stat().st_size <= MAILBOX_MAX_BYTES
    assert _leftovers(job_dir) == []


def test_a_symlinked_batch_file_is_replaced_never_written_through(job_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "agent-secret"
    target.write_text("precious")
    batch_file(job_dir).symlink_to(target)
    publish_batch(job_dir, ME, 256, 1, "r")
    assert target.read_text() == "precious"
    assert not batch_file(job_dir).is_symlink() and json.loads(batch_file(job_dir).read_text())["batch_size"] == 256


@pytest.mark.parametrize("trick", ["symlink", "file", "missing"])
def test_a_mailbox_that_is_not_a_real_directory_is_refused(job_dir: Path, tmp_path: Path, trick: str) -> None:
    mailbox = job_dir / AGENT_MAILBOX_DIR
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mailbox.rmdir()
    if trick == "symlink":
        mailbox.symlink_to(elsewhere)
    elif trick == "file":
        mailbox.write_text("")
    with pytest.raises(MailboxError, match="mailbox"):
        publish_batch(job_dir, ME, 256, 1, "r")
    assert list(elsewhere.iterdir()) == []


def test_a_mailbox_or_job_dir_owned_by_someone_else_is_refused(job_dir: Path) -> None:
    with pytest.raises(MailboxError, match="owned by uid"):
        publish_batch(job_dir, ME + 4242, 256, 1, "r")  # the job's user is not who owns the directories
    if ME != 0:
        pytest.skip("giving the mailbox to another uid needs root")
    os.chown(job_dir / AGENT_MAILBOX_DIR, 4242, 4242)
    with pytest.raises(MailboxError, match="owned by uid 4242"):
        publish_batch(job_dir, ME, 256, 1, "r")
    assert list((job_dir / AGENT_MAILBOX_DIR).iterdir()) == []


def test_a_symlinked_job_dir_is_refused(job_dir: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(job_dir)
    with pytest.raises(MailboxError, match="symlink"):
        publish_batch(link, ME, 256, 1, "r")


def test_a_failed_write_leaves_the_old_message_and_no_temporary_file(job_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    publish_batch(job_dir, ME, 256, 1, "first")

    def fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job_mailbox.os, "fsync", fsync)
    with pytest.raises(MailboxError, match="No space left"):
        publish_batch(job_dir, ME, 512, 1, "second")
    assert json.loads(batch_file(job_dir).read_text())["batch_size"] == 256
    assert _leftovers(job_dir) == []


def test_a_directory_in_the_batch_files_place_fails_cleanly(job_dir: Path) -> None:
    batch_file(job_dir).mkdir()
    with pytest.raises(MailboxError, match=BATCH_FILE):
        publish_batch(job_dir, ME, 256, 1, "r")
    assert _leftovers(job_dir) == []


@pytest.mark.parametrize("batch, steps", [(0, 1), (256, 0), (True, 1), (256.0, 1), (10**10, 1)])
def test_impossible_values_are_refused_before_anything_is_written(job_dir: Path, batch: object, steps: int) -> None:
    with pytest.raises(ValueError, match="whole number"):
        publish_batch(job_dir, ME, batch, steps, "r")  # type: ignore[arg-type]
    assert not batch_file(job_dir).exists()


# ---------------------------------------------------------------- the mailbox at submit


def test_make_job_dir_gives_the_agent_a_mailbox_only_with_acls(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    granted: list[tuple[str, str]] = []

    def setfacl(self: AgentAccess, path: Path, perms: str) -> str | None:
        granted.append((path.name, perms))
        return None

    monkeypatch.setattr(AgentAccess, "_setfacl", setfacl)
    with_acls = tmp_path / "a" / "jobs" / "0123abcd"
    make_job_dir(with_acls, AgentAccess("nobody"))
    mailbox = with_acls / AGENT_MAILBOX_DIR
    assert mailbox.is_dir() and stat.S_IMODE(mailbox.stat().st_mode) == 0o700
    assert (AGENT_MAILBOX_DIR, "rwx") in granted and [p for n, p in granted if n == "0123abcd"] == ["x"]

    monkeypatch.setattr(AgentAccess, "_setfacl", lambda self, path, perms: "Operation not supported")
    without = tmp_path / "b" / "jobs" / "0123abcd"
    access = AgentAccess("nobody")
    make_job_dir(without, access)
    assert not (without / AGENT_MAILBOX_DIR).exists()
    assert len(access.warnings) == 1 and "no mailbox" in access.warnings[0]


# ---------------------------------------------------------------- what the training says about its batch

LIMITS = {"init": 128, "max": 4096, "local_min": 1, "local_max": 256}


def _start(**fields: object) -> dict[str, object]:
    return {"event": "start", "time": 1.8e9, **fields}


def test_progress_reader_keeps_valid_batch_fields() -> None:
    checked = check_progress_event(_start(batch_limits=LIMITS, batch_size=256, accumulation_steps=2,
                                          batch_from="agent"))
    assert checked is not None and checked["batch_limits"] == LIMITS and checked["batch_from"] == "agent"
    report = check_progress_event({"event": "progress", "time": 1.8e9, "step": 3, "grad_sqr": 0.5, "grad_var": 0})
    assert report is not None and report["grad_sqr"] == 0.5 and report["grad_var"] == 0


@pytest.mark.parametrize("fields", [
    {"batch_limits": {**LIMITS, "init": 8192}},  # init above max
    {"batch_limits": {**LIMITS, "local_min": 512}},  # local_min above local_max
    {"batch_limits": {k: v for k, v in LIMITS.items() if k != "max"}},
    {"batch_limits": {**LIMITS, "extra": 1}},
    {"batch_limits": {**LIMITS, "max": "4096"}},
    {"batch_limits": {**LIMITS, "local_min": True}},
    {"batch_limits": {**LIMITS, "max": 10**30}},
    {"batch_limits": [128, 4096, 1, 256]},
    {"batch_size": 0},
    {"batch_size": 12.5},
    {"accumulation_steps": 0},
    {"batch_from": "me"},
    {"grad_sqr": -1.0},
    {"grad_var": "0.1"},
    {"grad_var": 1e400},  # JSON's overflow to infinity
])
def test_progress_reader_refuses_events_with_bad_batch_fields(fields: dict[str, object]) -> None:
    assert check_progress_event(_start(**fields)) is None
