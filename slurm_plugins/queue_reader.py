"""The agent's read of the whole queue each tick, at a cluster's scale.

``squeue --json`` prints every job slurmctld holds at several KB each (7.7 KB
a job on 24.11): 77 MB and 3 s of squeue alone at 10,000 queued jobs, more to
parse, every tick. The tick needs two things of the queue:

- every job, for who uses how many GPUs and what waits for them: ids, uid,
  state, reason, partition, node count, GRES. :meth:`SlurmClient.queue` gives
  that in one short text line a job (about 65 bytes);
- the whole record (comment, submit record, array task, exit code, ...) of
  the jobs that are dlsub's, which are few.

Which jobs are dlsub's is known only from their whole record (the submit
record job_submit.lua wrote, or a dlsub comment), so each job is read whole
once, the first time it is seen, and remembered by its id and submit time
(an id Slurm reuses comes with a new submit time). From then on only dlsub's
jobs, and those the caller follows, are read whole. A job's comment that a
user edits into dlsub's shape later is not noticed: the agent trusts the
tags it saw first anyway (:mod:`dlsub.agent.reconcile`).

At most :attr:`QueueReader.first_reads` unseen jobs are read whole a tick,
newest first, so that an agent starting beside a long queue keeps its ticks
short and finds a new submission at once; the rest wait for later ticks and
count, meanwhile, as the brief lines say (not dlsub's).
"""

from __future__ import annotations

from collections.abc import Collection

from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.models import SlurmJob

#: Unseen jobs read whole in one tick (about 0.4 s of squeue and parsing per 500 on this machine).
FIRST_READS = 500

_Key = tuple[int, int]  # (job id, submit time)


def _key(job: SlurmJob) -> _Key:
    return job.job_id, job.submit_time


def is_dlsub_shaped(job: SlurmJob) -> bool:
    """A whole record that claims to be dlsub's: a submit record, or a comment in dlsub's shape."""
    return job.submit_record is not None or job.tags is not None


class QueueReader:
    """Reads the queue brief and dlsub's jobs whole; remembers which jobs were which."""

    def __init__(self, client: SlurmClient, first_reads: int = FIRST_READS) -> None:
        self.client = client
        self.first_reads = first_reads
        self._dlsub: set[_Key] = set()
        self._other: set[_Key] = set()
        #: Jobs of the last read not yet read whole (left for later ticks).
        self.unseen = 0

    def read(self, follow: Collection[int] = ()) -> list[SlurmJob]:
        """Every job: whole for dlsub's jobs, those in ``follow`` and newly seen ones; brief for the rest.

        In squeue's order; a job submitted between the two reads comes last."""
        brief = self.client.queue()
        keys = {_key(job) for job in brief}
        self._dlsub &= keys
        self._other &= keys
        unseen = [job for job in brief if _key(job) not in self._dlsub and _key(job) not in self._other]
        unseen.sort(key=lambda job: (job.submit_time, job.job_id), reverse=True)
        first = unseen[: self.first_reads]
        self.unseen = len(unseen) - len(first)
        wanted = {job.job_id for job in brief if job.job_id in follow or _key(job) in self._dlsub}
        wanted.update(job.job_id for job in first)
        whole = {job.job_id: job for job in self.client.jobs_by_id(wanted)}
        for job in first:
            found = whole.get(job.job_id)
            if found is not None:
                # The brief line's key: after a requeue, squeue's text and JSON submit times can differ by 1 s.
                (self._dlsub if is_dlsub_shaped(found) else self._other).add(_key(job))
        jobs = [whole.pop(job.job_id, job) for job in brief]
        return jobs + list(whole.values())
