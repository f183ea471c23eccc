"""Integration tests (live testbed: real slurmctld with slurm_plugins/job_submit.lua): the submit record.

A dlsub job's request is frozen into its AdminComment at submit, where its
user cannot rewrite it; the agent reads it with contract.SubmitRecord.parse.
"""

from __future__ import annotations

import secrets

from plain_jobs import sbatch

from dlsub.contract import SubmitRecord, Tags
from livebed import TestbedUser, slurm_job

#: Held: the record is written at submit; the job never needs to run.
HELD = ("--hold", "--mem=50", "-J", "it-record", "--wrap", "true")


def test_a_dlsub_job_carries_a_record_of_its_request(user: TestbedUser, submitted: list[int]) -> None:
    dlsub_id = secrets.token_hex(4)
    comment = f"dlsub:{dlsub_id};mode=immediate;ideal=gpu;gpus=1"
    job_id = sbatch(user, *HELD, "-p", "gpu", "--gres=gpu:1", "--time=5", f"--comment={comment}", ids=submitted)
    record = SubmitRecord.parse((slurm_job(job_id) or {}).get("admin_comment"))
    assert record == SubmitRecord(user.uid, "gpu", 5, 1, Tags(dlsub_id, "immediate", "gpu", 1))


def test_no_partition_time_or_gres_is_recorded_as_none(user: TestbedUser, submitted: list[int]) -> None:
    dlsub_id = secrets.token_hex(4)
    job_id = sbatch(user, *HELD, f"--comment=dlsub:{dlsub_id};mode=ideal;gpus=0", ids=submitted)
    record = SubmitRecord.parse((slurm_job(job_id) or {}).get("admin_comment"))
    assert record is not None and record.uid == user.uid
    assert (record.partition, record.time_limit_min, record.gpus_per_node) == (None, None, 0)


def test_its_user_can_rewrite_the_comment_but_not_the_record(user: TestbedUser, submitted: list[int]) -> None:
    dlsub_id = secrets.token_hex(4)
    job_id = sbatch(user, *HELD, "-p", "cpu", "--time=5", f"--comment=dlsub:{dlsub_id};mode=immediate;gpus=0",
                    ids=submitted)
    before = (slurm_job(job_id) or {}).get("admin_comment")
    forged = f"dlsub-submit:v1;uid={user.uid};partition=gpu;time=;tres=gres:gpu:4|dlsub:{dlsub_id};gpus=4"
    denied = user.run("scontrol", "update", f"jobid={job_id}", f"AdminComment={forged}")
    assert denied.returncode != 0, denied.stdout
    rewritten = user.run("scontrol", "update", f"jobid={job_id}", f"Comment=dlsub:{dlsub_id};mode=immediate;gpus=4")
    assert rewritten.returncode == 0, rewritten.stderr
    after = slurm_job(job_id) or {}
    assert after.get("comment", "").endswith("gpus=4"), "the comment is the user's"
    assert after.get("admin_comment") == before
    record = SubmitRecord.parse(after.get("admin_comment"))
    assert record is not None and record.gpus_per_node == 0 and record.tags.gpus == 0 and record.partition == "cpu"


def test_other_jobs_get_no_record(user: TestbedUser, submitted: list[int]) -> None:
    job_id = sbatch(user, *HELD, "--comment=my own notes", ids=submitted)
    assert SubmitRecord.parse((slurm_job(job_id) or {}).get("admin_comment")) is None
    assert not str((slurm_job(job_id) or {}).get("admin_comment") or "").startswith("dlsub-submit:")
