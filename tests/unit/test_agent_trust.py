"""Unit tests (no Slurm; files in a temp dir): what the agent trusts in users' job directories."""

from __future__ import annotations

import os
from pathlib import Path

from dlsub.agent.reconcile import trusted_job_dir
from dlsub.contract import Tags
from dlsub.slurm_plugins.models import SlurmJob


def slurm_job(out: str, user_id: int, comment: str = "dlsub:0123abcd;mode=immediate") -> SlurmJob:
    return SlurmJob.from_squeue({"job_id": 7, "user_name": "alice", "job_state": "RUNNING", "comment": comment,
                                 "standard_output": out, "user_id": user_id})


def test_trusts_only_the_users_own_real_job_directory(tmp_path: Path) -> None:
    job_dir = tmp_path / "0123abcd"
    job_dir.mkdir()
    me = os.getuid()
    assert trusted_job_dir(slurm_job(f"{job_dir}/slurm-%j.out", me)) == job_dir
    # Owned by someone else than the job's user: a user cannot point the agent at another's files.
    assert trusted_job_dir(slurm_job(f"{job_dir}/slurm-%j.out", me + 4242)) is None
    # A symlink to somewhere else, a directory not named after the job, a relative path: refused.
    link = tmp_path / "links" / "0123abcd"
    link.parent.mkdir()
    link.symlink_to(job_dir)
    assert trusted_job_dir(slurm_job(f"{link}/slurm-%j.out", me)) is None
    other = tmp_path / "feedbeef"
    other.mkdir()
    assert trusted_job_dir(slurm_job(f"{other}/slurm-%j.out", me)) is None
    assert trusted_job_dir(slurm_job("relative/0123abcd/slurm.out", me)) is None
    # Not a dlsub job at all.
    assert trusted_job_dir(slurm_job(f"{job_dir}/slurm-%j.out", me, comment="my own comment")) is None


def test_comment_tags_are_parsed_strictly() -> None:
    assert Tags.parse("dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1") == Tags("0123abcd", "immediate", "gpu", 1)
    # One bad tag rejects the whole comment: nothing is half-trusted.
    assert Tags.parse("dlsub:0123abcd;ideal=gpu $(id);gpus=1") is None
    assert Tags.parse("dlsub:0123abcd;gpus=1;gpus=2") is None
    assert Tags.parse("dlsub:0123abcd;gpus=99999999") is None
    assert Tags.parse("dlsub:0123abcd;colour=red") is None
    assert Tags.parse("dlsub:../../etc;mode=ideal") is None
    assert Tags.parse("something else;mode=immediate") is None
    assert slurm_job("/x", 0).dlsub_id == "0123abcd"
