"""The Slurm client's parsers over real output recorded from each Slurm version the testbed runs.

Unit tests with a recorded (not stateful) fake: ``tests/fixtures/slurm/<version>/`` holds what
``testbed/record_slurm.py`` captured from a live testbed of that version, and what is known of
each job from how it was made (its manifest). Every test runs over every recorded version, and
a recording read with another version's dialect fails loudly, naming the field and the version.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dlsub.slurm_plugins.client import SlurmClient, SlurmError
from dlsub.slurm_plugins.dialects import (
    DataParserDialect,
    Dialect,
    SlurmParseError,
    SlurmVersion,
    dialect_for,
)
from dlsub.slurm_plugins.models import SlurmJob, expand_nodes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if (p / "manifest.json").is_file())


class RecordedSlurm:
    """Answers the argv the client runs with the output recorded for it (sacct filtered by ``-j``)."""

    def __init__(self, version: str) -> None:
        self.dir = FIXTURES / version
        self.manifest = json.loads((self.dir / "manifest.json").read_text())
        self.calls: list[list[str]] = []

    def output(self, name: str) -> str:
        return (self.dir / self.manifest["commands"][name]["file"]).read_text()

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        for name, taken in self.manifest["commands"].items():
            if taken["argv"] == argv:
                return subprocess.CompletedProcess(argv, 0, self.output(name), "")
        if argv[:5] == ["sacct", "-X", "-n", "-P", "-j"]:
            wanted = set(argv[5].split(","))
            lines = [ln for ln in self.output("sacct_text").splitlines() if ln.split("|")[0] in wanted]
            return subprocess.CompletedProcess(argv, 0, "".join(f"{ln}\n" for ln in lines), "")
        return subprocess.CompletedProcess(argv, 1, "", f"not recorded: {argv}")


@pytest.fixture(params=VERSIONS)
def recorded(request: pytest.FixtureRequest) -> RecordedSlurm:
    return RecordedSlurm(request.param)


def cases(rec: RecordedSlurm) -> dict[str, dict[str, Any]]:
    return dict(rec.manifest["cases"])


def jobs_by_id(rec: RecordedSlurm) -> dict[int, SlurmJob]:
    return {j.job_id: j for j in SlurmClient(runner=rec).jobs()}


def test_all_three_versions_are_recorded() -> None:
    assert {"22.05", "24.11", "26.05"} <= set(VERSIONS)


def test_the_client_picks_the_dialect_by_the_version_slurm_reports(recorded: RecordedSlurm) -> None:
    client = SlurmClient(runner=recorded)
    version = client.version()
    assert version.series == recorded.manifest["slurm_version"]
    assert str(version) == recorded.manifest["slurm_release"]
    expected = Dialect if (version.major, version.minor) < (23, 2) else DataParserDialect
    assert type(client.dialect()) is expected
    client.jobs()
    client.nodes()
    assert sum(1 for c in recorded.calls if c == ["scontrol", "--version"]) == 1  # asked once


def test_every_case_has_the_state_it_was_made_into(recorded: RecordedSlurm) -> None:
    jobs = jobs_by_id(recorded)
    for name, case in cases(recorded).items():
        if "state" not in case:
            continue
        job = jobs[case["job_id"]]
        assert job.state == case["state"], (recorded.manifest["slurm_version"], name)
        if "reason" in case:
            assert job.reason == case["reason"], name
        if "partition" in case:
            assert job.partition == case["partition"], name


def test_exit_codes_of_ended_jobs(recorded: RecordedSlurm) -> None:
    jobs = jobs_by_id(recorded)
    for name in ("completed", "failed"):
        case = cases(recorded)[name]
        assert jobs[case["job_id"]].exit_code == case["exit_code"], name
        assert jobs[case["job_id"]].terminal


def test_holds_and_the_requeue_after_exit_85(recorded: RecordedSlurm) -> None:
    jobs = jobs_by_id(recorded)
    for name in ("held_user", "held_admin"):
        assert jobs[cases(recorded)[name]["job_id"]].held, name
    requeued = jobs[cases(recorded)["requeued_held"]["job_id"]]
    assert requeued.state == "PENDING"
    assert requeued.restart_count == 1
    assert not jobs[cases(recorded)["running"]["job_id"]].held


def test_a_gang_on_two_gpu_nodes(recorded: RecordedSlurm) -> None:
    case = cases(recorded)["gang"]
    job = jobs_by_id(recorded)[case["job_id"]]
    assert job.node_count == 2
    assert expand_nodes(job.nodes) == case["nodes"]
    assert job.gpus_per_node == case["gpus_per_node"]
    assert job.cpus_per_node == 1
    assert job.memory_per_node_mb == 100
    assert job.time_limit_min == 60
    assert job.het_job_id is None and job.array_job_id is None


def test_the_comment_and_the_submit_record_come_through(recorded: RecordedSlurm) -> None:
    case = cases(recorded)["running"]
    job = jobs_by_id(recorded)[case["job_id"]]
    assert job.comment == case["comment"]
    assert job.user == recorded.manifest["user"]
    assert job.user_id is not None and job.user_id > 0
    assert job.start_time > 0 and job.submit_time > 0


def test_array_tasks_pending_held_running_and_ended(recorded: RecordedSlurm) -> None:
    case = cases(recorded)["array"]
    array = case["job_id"]
    tasks = {j.array_task_handle: j for j in jobs_by_id(recorded).values() if j.array_job_id == array}
    for task, state in case["tasks"].items():
        job = tasks[f"{array}_{task}"]
        assert job.state == state, task
    assert tasks[f"{array}_{case['held_task']}"].held


def test_a_hetjob_is_two_components_of_one_job(recorded: RecordedSlurm) -> None:
    case = cases(recorded)["hetjob"]
    components = [j for j in jobs_by_id(recorded).values() if j.het_job_id == case["job_id"]]
    assert len(components) == case["het_components"]
    assert {j.partition for j in components} == {"cpu", "gpu"}
    assert all(j.state == "RUNNING" for j in components)
    assert sorted(j.gpus_per_node for j in components) == [0, 1]


def test_node_failure_and_nodes(recorded: RecordedSlurm) -> None:
    case = cases(recorded)["node_fail"]
    job = jobs_by_id(recorded)[case["job_id"]]
    assert job.state == "NODE_FAIL" and expand_nodes(job.nodes) == case["nodes"]
    nodes = {n.name: n for n in SlurmClient(runner=recorded).nodes()}
    assert set(nodes) == {"cpu1", "cpu2", "gpu1", "gpu2"}
    assert not nodes["cpu2"].usable  # its slurmd was stopped when the snapshot was taken
    assert nodes["cpu1"].usable and nodes["gpu2"].usable
    assert nodes["gpu1"].gpus == 4 and nodes["cpu1"].gpus == 0
    assert nodes["gpu1"].partitions == ("gpu", "gpu-dev")
    assert nodes["gpu1"].cpus == 4 and nodes["gpu1"].real_memory_mb == 8000
    # The gang and the hetjob's GPU component hold one GPU each on gpu1.
    assert 1 <= nodes["gpu1"].gpus_used <= 4


def test_partitions(recorded: RecordedSlurm) -> None:
    parts = {p.name: p for p in SlurmClient(runner=recorded).partitions()}
    assert set(parts) == {"cpu", "gpu", "gpu-dev"}
    assert parts["cpu"].default and parts["gpu-dev"].max_time_min == 10
    assert parts["gpu"].max_gpus_per_node == 4
    assert all((p.allow_groups, p.allow_accounts, p.deny_accounts) == (None, None, ()) for p in parts.values()), \
        "AllowGroups=ALL, AllowAccounts=ALL as every version prints them: anyone"


def test_who_a_partition_takes_as_scontrol_prints_it() -> None:
    """Unit with the fake Slurm: AllowGroups and AllowAccounts lists (a site's model partitions), as Slurm's
    oneliner prints them."""
    from dlsub.slurm_plugins.fake import testbed_cluster

    fake = testbed_cluster()
    fake.partitions["gpu"].allow_groups = "a100-users,staff"
    fake.partitions["gpu-dev"].allow_accounts = "physics"
    parts = {p.name: p for p in SlurmClient(runner=fake).partitions()}
    assert parts["gpu"].allow_groups == ("a100-users", "staff") and parts["gpu"].allow_accounts is None
    assert parts["gpu-dev"].allow_accounts == ("physics",) and parts["gpu-dev"].allow_groups is None


def test_accounting_reads_ended_jobs(recorded: RecordedSlurm) -> None:
    c = cases(recorded)
    ids = [c[n]["job_id"] for n in ("completed", "failed", "timeout")]
    found = {j.job_id: j for j in SlurmClient(runner=recorded).accounting(ids)}
    assert found[c["failed"]["job_id"]].exit_code == 3
    assert found[c["failed"]["job_id"]].state == "FAILED"
    assert found[c["timeout"]["job_id"]].state == "TIMEOUT"


@pytest.mark.parametrize("version", VERSIONS)
def test_another_versions_dialect_fails_naming_field_and_version(version: str) -> None:
    """Swap the dialect for the other generation's: the records are refused, not misread."""
    rec = RecordedSlurm(version)
    own = dialect_for(SlurmVersion.parse(rec.output("version")))
    wrong: Dialect = (Dialect if isinstance(own, DataParserDialect) else DataParserDialect)(own.version)
    raw = json.loads(rec.output(own_jobs_file(own)))["jobs"]
    with pytest.raises(SlurmParseError) as err:
        for record in raw:
            wrong.job(record)
    assert str(own.version) in str(err.value)
    assert "field" in str(err.value)


def own_jobs_file(dialect: Dialect) -> str:
    return "squeue_states_all_json" if dialect.all_states else "squeue_json"


def test_a_parse_error_reaches_the_caller_as_a_slurm_error() -> None:
    """One malformed record: a SlurmError that names the field and the version (recorded 24.11 shape)."""
    rec = RecordedSlurm("24.11")

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        result = rec(argv)
        if argv[:2] == ["squeue", "--json"]:
            data = json.loads(result.stdout)
            data["jobs"][0]["exit_code"] = 85  # 22.05's shape inside 24.11's output
            return subprocess.CompletedProcess(list(argv), 0, json.dumps(data), "")
        return result

    with pytest.raises(SlurmError) as err:
        SlurmClient(runner=runner).jobs()
    assert "exit_code" in str(err.value) and "24.11" in str(err.value)


@pytest.mark.parametrize("version", ["24.11.5", "26.05.5"])
def test_the_stateful_fake_answers_in_each_versions_shape(version: str, tmp_path: Path) -> None:
    """Unit test with the stateful fake: the same jobs and nodes read the same through 22.05's and a
    newer version's shapes (and the newer shape is the one recorded: objects, state lists)."""
    from dlsub.slurm_plugins.fake import testbed_cluster

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --partition=gpu\n#SBATCH --gres=gpu:2\n#SBATCH --time=30\ntrue\n")
    seen = []
    for v in ("22.05.8", version):
        fake = testbed_cluster(version=v)
        client = SlurmClient(runner=fake)
        running, failed, held = (client.submit(script) for _ in range(3))
        fake.start(running, "gpu1", 1_800_000_000)
        fake.set_job_state(failed, "FAILED", exit_code=3)
        fake.start(held, "gpu2", 1_800_000_000)
        fake.requeue_held(held)
        jobs = {j.job_id: (j.state, j.exit_code, j.held, j.gpus_per_node, j.time_limit_min, j.restart_count,
                           j.nodes) for j in client.jobs()}
        nodes = [(n.name, n.state, n.gpus, n.gpus_used, n.usable) for n in client.nodes()]
        seen.append((jobs, nodes))
        if v == version:
            raw = json.loads(fake(["squeue", "--json", "--states=all"]).stdout)["jobs"][0]
            assert isinstance(raw["job_state"], list) and isinstance(raw["time_limit"], dict)
    assert seen[0] == seen[1]
    jobs = seen[1][0]
    assert [v[1] for v in jobs.values()] == [0, 3, 0]  # exit codes
    assert [v[2] for v in jobs.values()] == [False, False, True]  # the requeued-held one is held
