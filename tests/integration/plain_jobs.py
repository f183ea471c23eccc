"""Plain batch jobs (``sbatch --wrap``, not dlsub's) that integration tests submit as a testbed user."""

from __future__ import annotations

from livebed import TestbedUser


def sbatch(user: TestbedUser, *options: str, ids: list[int] | None = None) -> int:
    """``sbatch --parsable OPTIONS`` as ``user``: the job's Slurm id, appended to ``ids`` too (a test's
    ``submitted``, which cancels them after it)."""
    out = user.run("sbatch", "--parsable", *options, check=True)
    job_id = int(out.stdout.strip().split(";")[0])
    if ids is not None:
        ids.append(job_id)
    return job_id
