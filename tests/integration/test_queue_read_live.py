"""Integration test (live testbed: real slurmctld of the version that is up): the agent's brief read
of the queue (squeue --format, slurm_plugins/dialects.QUEUE_FORMAT) says what Slurm's own JSON says,
for held, running, requeued-held, GPU, array and 2-node jobs, and the QueueReader lists each once."""

from __future__ import annotations

import subprocess

from plain_jobs import sbatch

from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.queue_reader import QueueReader
from livebed import TestbedUser, wait_for

#: What every job here asks for, before its own options.
JOB = ("--mem=50", "-J", "it-queue|read", "--comment=a | b")


def test_the_brief_queue_says_what_slurms_json_says(user: TestbedUser, submitted: list[int]) -> None:
    client = SlurmClient()
    running = sbatch(user, *JOB, "-p", "cpu", "--time=5", "--wrap", "sleep 300", ids=submitted)
    # --requeue: the testbed's JobRequeue=0 makes a job that does not ask for it not requeueable.
    requeued = sbatch(user, *JOB, "-p", "cpu", "--time=5", "--requeue", "--wrap", "sleep 300", ids=submitted)
    sbatch(user, *JOB, "--hold", "-p", "cpu", "--wrap", "true", ids=submitted)
    sbatch(user, *JOB, "--hold", "-p", "gpu", "--gres=gpu:2", "--wrap", "true", ids=submitted)
    sbatch(user, *JOB, "--hold", "-p", "cpu", "--array=0-2", "--wrap", "true", ids=submitted)
    sbatch(user, *JOB, "--hold", "-p", "cpu", "-N", "2", "--wrap", "true", ids=submitted)
    wait_for("both sleepers to run", lambda: all(
        j.state == "RUNNING" for j in client.jobs(job_ids=[running, requeued])), timeout=60)
    subprocess.run(["scontrol", "requeuehold", str(requeued)], check=True)
    # Until its old run is cleaned up, the JSON says PENDING with a COMPLETING flag where %T says COMPLETING
    # (both live to the agent); compare once Slurm is done with it.
    wait_for("the requeued job to be held, its old run cleaned up", lambda: client.jobs(job_ids=[requeued])[0].held
             and [j.state for j in client.queue() if j.job_id == requeued] == ["PENDING"], timeout=60)

    mine = set(submitted)
    whole = {j.job_id: j for j in client.jobs() if j.job_id in mine or j.array_job_id in mine}
    brief = {j.job_id: j for j in client.queue() if j.job_id in whole or j.array_job_id in mine}
    assert set(brief) == set(whole)
    assert len(whole) >= len(submitted)
    for job_id, job in brief.items():
        full = whole[job_id]
        said = (job.user_id, job.state, job.reason, job.partition, job.node_count, job.gpus_per_node,
                job.array_job_id, job.held)
        assert said == (full.user_id, full.state, full.reason, full.partition, full.node_count,
                        full.gpus_per_node, full.array_job_id, full.held), job_id
        # The reader's key for "seen before"; after a requeue the text and the JSON may be a second apart.
        assert abs(job.submit_time - full.submit_time) <= 2, job_id
    assert whole[requeued].held and whole[running].state == "RUNNING"
    assert {j.gpus_per_node for j in whole.values()} == {0, 2}
    assert any(j.node_count == 2 for j in whole.values())

    listed = [j.job_id for j in QueueReader(client).read()]
    assert len(listed) == len(set(listed)) and set(whole) <= set(listed)
