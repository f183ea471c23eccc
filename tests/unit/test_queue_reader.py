"""The agent's brief read of the queue and its whole read of dlsub's jobs (QueueReader).

Unit tests with the stateful fake Slurm (each version's shape); the live testbed's
tests/integration/test_queue_read_live.py checks the brief lines against real Slurm's JSON.
"""

from __future__ import annotations

import pytest

from dlsub.contract import HELD_AFTER_FAILED_LAUNCH, SUBMIT_RECORD_PREFIX
from dlsub.slurm_plugins.client import SlurmClient
from dlsub.slurm_plugins.dialects import QUEUE_FORMAT, SlurmParseError, SlurmVersion, dialect_for
from dlsub.slurm_plugins.fake import FakeSlurm
from dlsub.slurm_plugins.fake import testbed_cluster as cluster
from dlsub.slurm_plugins.queue_reader import QueueReader

VERSIONS = ("22.05.8", "24.11.5", "26.05.0")


def plain(job_id: int, *, uid: int = 2001, state: str = "PENDING", submit: int = 1_700_000_000,
          comment: str = "a plain sbatch job", **more: object) -> dict[str, object]:
    return {"job_id": job_id, "user_id": uid, "user_name": f"u{uid}", "job_state": state, "partition": "gpu",
            "state_reason": "Resources", "node_count": 1, "tres_per_node": "gres:gpu:2", "comment": comment,
            "submit_time": submit, "admin_comment": "", "array_job_id": 0, **more}


def whole_reads(fake: FakeSlurm) -> list[set[int]]:
    """The ids of each ``squeue --json --jobs`` call so far."""
    return [{int(x) for x in argv[argv.index("--jobs") + 1].split(",")}
            for argv in fake.calls if argv[:2] == ["squeue", "--json"] and "--jobs" in argv]


@pytest.mark.parametrize("version", VERSIONS)
def test_brief_lines_say_what_the_json_says(version: str) -> None:
    fake = cluster(version=version)
    client = SlurmClient(runner=fake)
    fake.add_raw_jobs([plain(5, state="RUNNING"), plain(6, uid=2002, state_reason="JobHeldUser"),
                       plain(7, array_job_id=7, array_task_id=3, tres_per_node=""),
                       # Requeued held by Slurm after a failed launch, as 24.11 says it (squeue's %r: the description).
                       plain(8, state_reason="JobHeldUser", state_description="launch failed requeued held")])
    brief = {j.job_id: j for j in client.queue()}
    whole = {j.job_id: j for j in client.jobs()}
    assert set(brief) == set(whole) == {5, 6, 7, 8}
    for job_id, job in brief.items():
        full = whole[job_id]
        assert (job.user_id, job.state, job.reason, job.partition, job.node_count, job.gpus_per_node,
                job.array_job_id, job.submit_time, job.held) == \
               (full.user_id, full.state, full.reason, full.partition, full.node_count, full.gpus_per_node,
                full.array_job_id, full.submit_time, full.held)
        assert job.extra["brief"] and job.comment == "" and job.submit_record is None
    assert brief[6].held and brief[5].gpus_per_node == 2 and brief[7].array_job_id == 7
    assert brief[8].held and brief[8].reason == whole[8].reason == HELD_AFTER_FAILED_LAUNCH != brief[6].reason


def test_a_line_not_shaped_as_the_format_names_field_and_version() -> None:
    dialect = dialect_for(SlurmVersion.parse("slurm 24.11.5"))
    with pytest.raises(SlurmParseError, match=r"Slurm 24\.11\.5: squeue line 12 field 'user_id' is 'root'"):
        dialect.queue_record("12|12|N/A|root|PENDING|None|cpu|1|N/A|2026-11-25T02:14:39")
    with pytest.raises(SlurmParseError, match="10 fields joined by"):
        dialect.queue_record("12|12|N/A")
    assert QUEUE_FORMAT.count("%") == 10


def test_what_users_write_is_not_in_the_brief_read() -> None:
    """A name or comment with a newline and '|' cannot forge a line: neither is in the format."""
    fake = cluster(version="24.11.5")
    forged = "x\n99|99|N/A|0|PENDING|Resources|gpu|2|gres/gpu:4|2026-11-25T02:14:39"
    fake.add_raw_jobs([plain(5, comment=forged, name=forged)])
    assert [j.job_id for j in SlurmClient(runner=fake).queue()] == [5]


def test_each_job_is_read_whole_once_and_dlsubs_every_tick() -> None:
    fake = cluster(version="24.11.5")
    comment = "dlsub:0123abcd;mode=immediate;ideal=gpu;gpus=1"
    fake.add_raw_jobs([plain(5), plain(6, comment=comment,
                                        admin_comment=f"{SUBMIT_RECORD_PREFIX}uid=2001;partition=;time=;tres=|{comment}"),
                       plain(7, comment="dlsub:89abcdef")])
    reader = QueueReader(SlurmClient(runner=fake))
    first = {j.job_id: j for j in reader.read()}
    assert first[6].submit_record is not None and first[7].dlsub_id == "89abcdef"
    assert "brief" not in first[5].extra, "read whole the first time it is seen"
    second = {j.job_id: j for j in reader.read(follow={5, 404})}
    third = {j.job_id: j for j in reader.read()}
    assert whole_reads(fake) == [{5, 6, 7}, {5, 6, 7}, {6, 7}]
    assert "brief" not in second[5].extra and third[5].extra["brief"], "followed: whole; else brief"
    assert third[6].submit_record is not None and third[7].dlsub_id == "89abcdef"


def test_a_reused_id_is_read_again() -> None:
    fake = cluster(version="24.11.5")
    fake.add_raw_jobs([plain(5)])
    reader = QueueReader(SlurmClient(runner=fake))
    reader.read()
    fake.add_raw_jobs([plain(5, submit=1_700_000_900, comment="dlsub:0123abcd")])  # after slurmctld forgot 5
    assert reader.read()[0].dlsub_id == "0123abcd"
    assert whole_reads(fake) == [{5}, {5}]


def test_a_long_queue_is_read_whole_newest_first_a_few_hundred_a_tick() -> None:
    fake = cluster(version="24.11.5")
    fake.add_raw_jobs([plain(100 + n, submit=1_700_000_000 + n) for n in range(25)])
    reader = QueueReader(SlurmClient(runner=fake), first_reads=10)
    jobs = reader.read()
    assert len(jobs) == 25 and reader.unseen == 15
    assert whole_reads(fake)[0] == set(range(115, 125)), "the newest ten"
    reader.read()
    reader.read()
    assert reader.unseen == 0 and whole_reads(fake)[2] == set(range(100, 105))
    reader.read()
    assert len(whole_reads(fake)) == 3, "nothing left to read whole"


def test_a_job_gone_between_the_two_reads_falls_back_to_one_whole_read() -> None:
    fake = cluster(version="24.11.5")
    fake.add_raw_jobs([plain(5), plain(6)])
    client = SlurmClient(runner=fake)
    reader = QueueReader(client)
    brief = client.queue()
    del fake._raw[5]  # slurmctld purges 5 after the brief read
    client.queue = lambda: brief  # type: ignore[method-assign]
    jobs = reader.read()
    assert [j.job_id for j in jobs] == [5, 6] and "brief" not in jobs[1].extra
    assert fake.calls[-1][:3] == ["squeue", "--json", "--states=all"] and "--jobs" not in fake.calls[-1]
