"""Integration (live Slurm testbed + rootless Podman + the agent service under ``policy = "goodput"`` with
``[goodput] across_gpu_types = true``, for this module only): elastic jobs end on the GPU kind that is
fastest for them (issue 33, item 4).

The testbed's gpu partition has gpu1 (GRES ``gpu:a100:4``) and gpu2 (``gpu:v100:4``). Its GPUs are fake, so
each job emulates its speed per kind with train_digits' ``--gpu-slowdown KIND=FACTOR`` (read against
``$DLSUB_GPU_TYPE``): the first command is four times slower on a100, the second four times slower on v100.

A kind a job has not run on is known to the agent only from what earlier runs of the same command measured
there (the one-GPU profile the typed policy bootstraps from, as Sia does; the agent keeps it in memory, so
the service is not restarted in between). So each command is first measured on its fast kind, then the two
jobs are started each on its slow kind. The first command is measured by ``dlsub estimate``, as a user would
before submitting: its profiling runs (one GPU of each kind) are fixed-size jobs the agent reads as they end.
The second is measured by an earlier elastic run on its fast kind. The agent learns a kind from either. An
estimate profiles the script with its arguments and the batch size, so the first command's jobs name the batch
size the estimate profiled, as ``dlsub submit --from-estimate`` does. Placements are made certain with
blockers (plain jobs holding the GPUs of one node), never by pinning dlsub's jobs: the first job starts on the
one GPU left of gpu1 (so it cannot grow there), the second waits until one GPU of gpu2 is freed for it (its
claim as a waiting job keeps the first from moving there first). Once the last blockers go, the agent moves
each job to its fast kind (checkpoint, requeue held onto ``gres:gpu:KIND:1``, release): a move is observed in
each job's attempts, training resumes from its checkpoint on the new kind, and ``dlsub why``
gives the measured and predicted figures.

Then a waiting job is placed: with every GPU taken (the two jobs at two GPUs each of their fast kinds,
blockers on the rest), a third run of the first command waits; the agent asks for it as v100 (``dlsub why``:
placed, with its speed per kind against the slowest), and the elastic worker that leaves for it is the first
job's on v100, not the newer second job's on a100 (as it would be for a job that takes any kind): it starts
on v100, its first attempt there.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from livebed import (
    EXAMPLES,
    GPU_TYPES,
    TestbedUser,
    agent_last_tick,
    agent_policy,
    attempts,
    hold_all,
    hold_gpus,
    job_output,
    progress_events,
    reports_on,
    wait_for,
)

TRAIN = str(EXAMPLES / "train_digits.py")
# Elastic in GPUs, one to two, one CPU and 1 GB: the main job takes one GPU.
SHAPE = ("--gpus", "1:2", "--cpus", "1", "--mem", "1G")
# The first command's arguments, as `dlsub estimate` is given them: it appends the batch size it profiles.
A100_ARGS = ("--epochs", "200", "--throttle-per-sample", "0.004", "--gpu-slowdown", "a100=4")
SLOW_ON_A100 = (TRAIN, *A100_ARGS, "--batch-size", "64")
SLOW_ON_V100 = (TRAIN, "--epochs", "200", "--throttle-per-sample", "0.004", "--gpu-slowdown", "v100=4")
KIND_NODE = {kind: node for node, kind in GPU_TYPES.items()}


@pytest.fixture
def typed_goodput_agent() -> Iterator[None]:
    """The agent service under goodput across GPU kinds (the testbed's file says fifo); restored after. A restart
    is told to cost 1 s (the file's 15 s and 5 s margin), so that the policy's rule that a change must pay for
    it over the time the job has lived (each restart counting again, ``keep_share``) lets these young jobs move
    and grow within seconds, not a minute: at 5 s, each job grew some 60 s after its move (CI: 85 s)."""
    with agent_policy("goodput", "[goodput]\nacross_gpu_types = true",
                      {"restart_cost_s": "1", "min_saving_s": "0"}):
        yield


def kind_now(job: dict[str, Any]) -> str | None:
    starts = progress_events(job["job_dir"], "start")
    return starts[-1].get("gpu_type") if starts else None


def world_size(job: dict[str, Any]) -> int | None:
    starts = progress_events(job["job_dir"], "start")
    return starts[-1].get("world_size") if starts else None


def most_reports_on(job: dict[str, Any], kind: str) -> int:
    """The most progress reports the job made in one start on GPUs of ``kind``, in any start: a loop that polls
    ``should_stop()`` saves when asked, so the agent may move it on before its first checkpoint."""
    most, current, count = 0, None, 0
    for event in progress_events(job["job_dir"]):
        if event.get("event") == "start":
            current, count = event.get("gpu_type"), 0
        elif event.get("event") == "progress" and current == kind and event.get("counted") is None:
            count += 1
            most = max(most, count)
    return most


def measured_on(job: dict[str, Any], kind: str) -> None:
    # Two reports in one start are a measured rate, what the agent moves a job on (it may then move at once).
    wait_for(f"job {job['id']} training on {kind}", lambda: most_reports_on(job, kind) >= 2, timeout=180)
    first = next((e.get("gpu_type") for e in progress_events(job["job_dir"], "start")), None)
    assert first == kind, f"setup: job {job['id']} started on {first}, not {kind}"


def read_after(user: TestbedUser, when: float, what: str) -> None:
    """Until a tick of the agent has begun after ``when`` (epoch seconds): the agent has read ``what``."""

    wait_for(f"a tick of the agent after {what}", lambda: agent_last_tick(user) > when, timeout=60)


def read_by_agent(user: TestbedUser, job: dict[str, Any]) -> None:
    """Until a tick of the agent has begun after the job's newest report: the agent has read it."""
    newest = max(float(e["time"]) for e in progress_events(job["job_dir"], "progress"))
    read_after(user, newest, f"job {job['id']}'s reports")


def cancel(*jobs: dict[str, Any]) -> None:
    for job in jobs:
        subprocess.run(["scancel", str(job["slurm_job_id"]), *([str(job["worker_array_id"])]
                                                              if job.get("worker_array_id") else [])], check=False)


def test_two_elastic_jobs_each_end_on_the_kind_that_is_faster_for_it(
    user: TestbedUser, workdir: Path, typed_goodput_agent: None
) -> None:
    jobs: list[dict[str, Any]] = []
    holds: list[int] = []
    try:
        # What the agent bootstraps the other kind from. The first command: `dlsub estimate` of the gpu
        # partition on one GPU, both kinds profiled at once (--parallel); --no-cache, since a profile from an
        # earlier run's cache runs no job and teaches the agent nothing. (With another batch size in the jobs
        # below, so another command, the first job never moved: timed out after 300 s.)
        estimated = user.run("dlsub", "estimate", "-p", "gpu", "--gpus", "1", "--cpus", "1", "--mem", "1G",
                             "--batch-sizes", "64", "--parallel", "--no-cache", "--json", TRAIN, *A100_ARGS,
                             cwd=workdir, timeout=300)
        assert estimated.returncode == 0, estimated.stderr
        est = json.loads(estimated.stdout)
        assert {(r["partition"], r["gpu_type"]) for r in est["rows"]} == {("gpu", "a100"), ("gpu", "v100")}, est
        assert est["profiled_now"] == 2, est
        read_after(user, time.time(), "the estimate's profiling runs")
        # The second command: an earlier elastic run on a100 (all of v100's node held, by two blockers: the
        # one-GPU one goes first, below).
        holds += hold_all(user, (KIND_NODE["v100"], 3), (KIND_NODE["v100"], 1))
        earlier = user.submit(*SHAPE, *SLOW_ON_V100, cwd=workdir)
        jobs.append(earlier)
        measured_on(earlier, "a100")
        read_by_agent(user, earlier)
        cancel(earlier)
        user.wait_until_ended(earlier["id"])
        # The two jobs, each on its slow kind: the first on gpu1's one free GPU (gpu2 still held), the second
        # waiting until gpu2's one-GPU blocker goes. Only one GPU of gpu2 is freed, so that each job's one
        # place is certain: the second job, waiting, has first claim on it, so the first is not moved there
        # before Slurm starts the second (with all four freed, a tick of the agent that came first moved the
        # first job to v100, and the second, placed on the a100 it left, never ran on v100: CI, once); then
        # neither kind has a GPU idle for the other's move until both big blockers go.
        holds.append(hold_gpus(user, KIND_NODE["a100"], 3))
        first = user.submit(*SHAPE, *SLOW_ON_A100, cwd=workdir)
        jobs.append(first)
        measured_on(first, "a100")
        second = user.submit(*SHAPE, *SLOW_ON_V100, cwd=workdir)
        jobs.append(second)
        subprocess.run(["scancel", str(holds.pop(1))], check=True)  # gpu2's one-GPU blocker
        measured_on(second, "v100")
        subprocess.run(["scancel", *map(str, holds)], check=True)  # gpu2's and gpu1's: room on both kinds now
        holds.clear()
        for job, fast in ((first, "v100"), (second, "a100")):
            wait_for(f"job {job['id']} moved to {fast} and training there",
                     lambda job=job, fast=fast: kind_now(job) == fast and reports_on(job["job_dir"], fast) >= 2,
                     timeout=300)
        for job, slow, fast in ((first, "a100", "v100"), (second, "v100", "a100")):
            runs = attempts(job["job_dir"])
            assert "move" in [a.get("action") for a in runs if a["event"] == "end"], runs
            assert [a["gpu_type"] for a in runs if a["event"] == "start"][-1] == fast, runs
            text = job_output(job["job_dir"])
            resumed = re.search(r"resumed from step (\d+)", text)
            assert resumed and int(resumed.group(1)) > 0, f"state intact: it resumed from its checkpoint\n{text}"
            assert f"on {fast} GPUs (throttle x1)" in text, text
            why = user.dlsub("why", job["id"]).stdout
            assert re.search(rf"moving to {fast} \(goodput policy across GPU kinds\): measured [\d.]+ samples/s "
                             rf"on {slow} \(\d GPUs?\), predicted [\d.]+ samples/s on {fast} \(\d GPUs?; "
                             r"bootstrapped", why), why
            assert "moved" in why, why
        # A third run of the first command, submitted while every GPU is taken (each job at two GPUs of its fast
        # kind, blockers on the rest): the agent places it on v100, where its command ran fastest, and the
        # elastic worker that leaves for it is the first job's on v100, not the newer second job's on a100
        # (which it would be for a job that takes any kind).
        holds += hold_all(user, ("gpu1", 2), ("gpu2", 2))
        for job, kind in ((first, "v100"), (second, "a100")):
            wait_for(f"job {job['id']} grown to 2 GPUs of {kind}",
                     lambda job=job, kind=kind: kind_now(job) == kind and world_size(job) == 2, timeout=240)
        third = user.submit(*SHAPE, *SLOW_ON_A100, cwd=workdir)
        jobs.append(third)
        wait_for(f"job {third['id']} training", lambda: kind_now(third) is not None, timeout=240)
        runs = attempts(third["job_dir"])
        assert [a["gpu_type"] for a in runs if a["event"] == "start"] == ["v100"], runs
        why = user.dlsub("why", third["id"]).stdout
        placed = r"waiting for v100 \(goodput policy across GPU kinds\): .*: v100 [\d.]+x, a100 1\.00x"
        assert re.search(placed, why), why
        assert "error" not in why, why
        assert "shrinking" in user.dlsub("why", first["id"]).stdout
        assert world_size(second) == 2, "the newer job on a100 kept its GPUs"
    finally:
        if holds:
            subprocess.run(["scancel", *map(str, holds)], check=False)
        cancel(*jobs)
