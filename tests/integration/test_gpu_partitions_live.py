"""Integration (live Slurm testbed, rootless Podman, PyTorch, the agent service): a site with a GPU partition
per model (issue 50 item 3, the admin guide's "A partition per model").

For this module's one test the testbed's gpu partition is cut to gpu1 (a100) and a second GPU partition,
gpu-v100, is made of gpu2 (``scontrol update`` / ``scontrol create``, as an admin would), declared a GPU
partition in the agent's policy file; both are put back after it, whatever happens. An immediate-mode job
starts on cpu while both are full (submit chooses gpu, the first by name, as its ideal partition). When
gpu-v100 frees first, the agent moves the job there, but only once Slurm would take the job there: while
gpu-v100's AllowGroups names none of the job user's groups, it stays on cpu.
"""

from __future__ import annotations

import grp
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from livebed import (
    EXAMPLES,
    TestbedUser,
    agent_last_tick,
    agent_policy,
    attempts,
    hold_gpus,
    progress_events,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")
SECOND = "gpu-v100"


def _scontrol(*argv: str) -> None:
    subprocess.run(["scontrol", *argv], check=True, capture_output=True, text=True, timeout=60)


@pytest.fixture
def partition_per_model(user2: TestbedUser) -> Iterator[None]:
    """gpu on gpu1 only, gpu-v100 on gpu2, open only to dltest2's group at first; the agent told gpu-v100 is a
    GPU partition. Put back after: gpu on both nodes, gpu-v100 gone, the policy file as it was."""
    _scontrol("update", "PartitionName=gpu", "Nodes=gpu1")
    try:
        _scontrol("create", f"PartitionName={SECOND}", "Nodes=gpu2", "MaxTime=INFINITE", "DefaultTime=01:00:00",
                  f"AllowGroups={grp.getgrgid(user2.gid).gr_name}", "State=UP")
        with agent_policy("fifo", f'[partitions.{SECOND}]\nrole = "gpu"\nspeed = 1.0\ncost_per_node_hour = 8.0'):
            yield
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={SECOND}"], check=False, capture_output=True)
        _scontrol("update", "PartitionName=gpu", "Nodes=gpu[1-2]")


def _ticks_after_now(user: TestbedUser) -> None:
    """Until a whole tick of the agent has run after this moment: one began after it, and a later one began
    (ticks run one after another), so the first has acted on what it saw."""

    start = agent_last_tick(user)
    first = wait_for("a tick of the agent", lambda: (t := agent_last_tick(user)) > start and t, timeout=60)
    wait_for("the tick after it", lambda: agent_last_tick(user) > first, timeout=60)


def test_a_cpu_job_moves_to_the_second_gpu_partition_when_it_frees_first_and_slurm_admits_it(
    user: TestbedUser, user2: TestbedUser, workdir: Path, partition_per_model: None
) -> None:
    blockers: list[int] = []
    job: dict[str, Any] = {}
    try:
        blockers.append(hold_gpus(user2, "gpu1", 4))  # one at a time: each is cancelled after, whatever fails
        blockers.append(hold_gpus(user2, "gpu2", 4, partition=SECOND))
        job = user.submit("--mode", "immediate", "--gpus", "1", TRAIN, "--epochs", "10", "--throttle", "0.05",
                          "--cpu-slowdown", "4", cwd=workdir)
        assert (job["partition"], job["ideal_partition"]) == ("cpu", "gpu"), job
        step_at_move = wait_for("a checkpoint on cpu", lambda: (s := user.status(job["id"]))["state"] == "RUNNING"
                                and s["last_checkpoint_step"], timeout=120)
        subprocess.run(["scancel", str(blockers.pop())], check=True)
        wait_for(f"{SECOND}'s GPUs idle", lambda: _idle_gpus(SECOND) == 4, timeout=60)
        # Slurm would refuse the job there (AllowGroups names dltest2's group only): it stays on cpu.
        _ticks_after_now(user)
        assert user.status(job["id"])["partition"] == "cpu"
        assert not re.search(rf"moving to {SECOND}", user.dlsub("why", job["id"]).stdout)
        _scontrol("update", f"PartitionName={SECOND}", "AllowGroups=ALL")

        def on_second() -> dict[str, Any] | None:
            status = user.status(job["id"])
            started = any(a["event"] == "start" and a["partition"] == SECOND for a in attempts(job["job_dir"]))
            # The status and the attempt records are two reads: the move is seen once both show it, the GPU's kind
            # included (a status read just before the new attempt's start record came has none).
            return status if (started and status["state"] == "RUNNING" and status["partition"] == SECOND
                              and status["gpu_type"]) else None

        moved = wait_for(f"the job to run on {SECOND}", on_second, timeout=120)
        assert moved["slurm_job_id"] == job["slurm_job_id"] and moved["gpu_type"] == "v100", moved
        wait_for(f"training resumed past its checkpoint on {SECOND}",
                 lambda: (user.status(job["id"])["step"] or 0) > step_at_move, timeout=60)
        why = user.dlsub("why", job["id"]).stdout
        assert re.search(rf"moving to {SECOND}: \d+ GPU\(s\) idle, checkpoint \d+ s old, est\. .* saved; gpu, "
                         r"where it was to go, has no room for it now", why), why
        ends = [a.get("action") for a in attempts(job["job_dir"]) if a["event"] == "end"]
        assert ends == ["move"], ends
    finally:
        subprocess.run(["scancel", *map(str, blockers), *([str(job["slurm_job_id"])] if job else [])], check=False)


@pytest.fixture
def typed_partition_per_model() -> Iterator[None]:
    """gpu on gpu1 (a100) only, gpu-v100 made of gpu2 (v100), open to all; the agent under goodput across GPU
    kinds, told gpu-v100 is a GPU partition (a restart told to cost 1 s, as test_gpu_kinds_live does, so that
    a young job may grow within seconds). Put back after, whatever happens."""
    _scontrol("update", "PartitionName=gpu", "Nodes=gpu1")
    try:
        _scontrol("create", f"PartitionName={SECOND}", "Nodes=gpu2", "MaxTime=INFINITE", "DefaultTime=01:00:00",
                  "State=UP")
        with agent_policy("goodput", f'[goodput]\nacross_gpu_types = true\n\n[partitions.{SECOND}]\nrole = "gpu"'
                          '\nspeed = 1.0\ncost_per_node_hour = 8.0', {"restart_cost_s": "1", "min_saving_s": "0"}):
            yield
    finally:
        subprocess.run(["scancel", "-p", SECOND], check=False, capture_output=True)
        subprocess.run(["scontrol", "delete", f"PartitionName={SECOND}"], check=False, capture_output=True)
        _scontrol("update", "PartitionName=gpu", "Nodes=gpu[1-2]")


# Four times slower on a100 than on v100 (the fake GPUs' emulated speed, test_gpu_kinds_live's first command).
FAST_ON_V100 = (TRAIN, "--epochs", "200", "--throttle-per-sample", "0.004", "--gpu-slowdown", "a100=4")


def test_an_elastic_job_waiting_on_one_models_partition_is_placed_on_the_faster_models_and_grows_there(
    user: TestbedUser, user2: TestbedUser, workdir: Path, typed_partition_per_model: None
) -> None:
    """The user's command was measured on one GPU of each model by two fixed-size runs (one per partition, as
    ``dlsub estimate``'s profiles are). With both partitions full, their elastic job of it (``--gpus 1:2``, no
    partition named) waits on gpu, submit's first choice by name. When gpu-v100 frees, the agent points the
    job at gpu-v100 as v100 (it is 4x as fast there): it starts there, its first attempt, and grows to two GPUs
    there, its held worker (submitted on gpu) pointed at gpu-v100 as it is released. `dlsub why` says which
    partition and why."""
    from test_gpu_kinds_live import most_reports_on, read_by_agent, world_size

    profiles: list[dict[str, Any]] = []
    blockers: list[int] = []
    job: dict[str, Any] = {}
    try:
        for partition in ("gpu", SECOND):
            profiles.append(user.submit("-p", partition, "--gpus", "1", "--cpus", "1", "--mem", "1G", *FAST_ON_V100,
                                        cwd=workdir))
        for profile, kind in zip(profiles, ("a100", "v100"), strict=True):
            wait_for(f"job {profile['id']} measured on {kind}", lambda p=profile, k=kind: most_reports_on(p, k) >= 2,
                     timeout=180)
            read_by_agent(user, profile)
        subprocess.run(["scancel", *(str(p["slurm_job_id"]) for p in profiles)], check=True)
        blockers.append(hold_gpus(user2, "gpu1", 4))
        blockers.append(hold_gpus(user2, "gpu2", 4, partition=SECOND))
        job = user.submit("--gpus", "1:2", "--cpus", "1", "--mem", "1G", *FAST_ON_V100, cwd=workdir)
        assert job["partition"] == "gpu", job
        _ticks_after_now(user)
        assert user.status(job["id"])["partition"] == "gpu", "placed while no GPU of v100 could be freed for it"
        subprocess.run(["scancel", str(blockers.pop())], check=True)
        wait_for("the job to train on v100, at two GPUs", lambda: world_size(job) == 2, timeout=180)
        starts = progress_events(job["job_dir"], "start")
        assert {e.get("gpu_type") for e in starts} == {"v100"}, starts
        assert [a["partition"] for a in attempts(job["job_dir"]) if a["event"] == "start"][:1] == [SECOND]
        why = user.dlsub("why", job["id"]).stdout
        assert re.search(r"waiting for v100 \(goodput policy across GPU kinds\): .* v100 \d\.\d\dx, a100 1\.00x; .*"
                         rf"on partition {SECOND}, the site's partition of v100 \(it waited on gpu\)", why), why
    finally:
        ids = [*blockers, *(p["slurm_job_id"] for p in profiles), job.get("slurm_job_id"), job.get("worker_array_id")]
        subprocess.run(["scancel", *(str(i) for i in ids if i)], check=False)


def _idle_gpus(partition: str) -> int:
    """The idle GPUs of ``partition``'s nodes, as Slurm counts them (configured less allocated)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-O", "Gres:40,GresUsed:60"], capture_output=True,
                         text=True, check=True).stdout
    idle = 0
    for line in out.splitlines():
        gres, used = line.split()
        total = re.search(r"gpu(?::[^:,(\s]+)?:(\d+)", gres)
        taken = re.search(r"gpu(?::[^:,(\s]+)?:(\d+)", used)
        idle += (int(total.group(1)) if total else 0) - (int(taken.group(1)) if taken else 0)
    return idle
