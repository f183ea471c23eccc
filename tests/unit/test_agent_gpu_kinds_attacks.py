"""Unit tests (fake Slurm behind the client's `_run` seam, the agent's real tick): what another user, or a
job's own figures, must not do to a job under ``[goodput] across_gpu_types`` (found by an attack review).

* Another user's claims never get a job moved to a kind where it can hold fewer GPUs than it has.
* In the tick a moved job is released onto its new kind, the GPUs it takes there are not given to
  another job's growth.
* A job moved on its figures (true or not) is not moved back before its time on the new kind has paid
  for another restart (Slurm's start time, not the job's word).
* What a user's earlier runs lend their next run is not pushed out by another user's jobs (with the key off
  too): a history per user, and a job that measured nothing makes no entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_world import ME, NOW, World
from test_agent_gpu_kinds import A, B, across, checkpointed, decisions, elastic, reports, typed

from dlsub.agent.live_models import HISTORY_COMMANDS_PER_USER, LiveModels
from dlsub.job_progress import MeasuredConfig, Progress
from dlsub.policies.actions.resize_rules import ElasticJob


def _alice_on_four_a100s(tmp_path: Path, bob: bool) -> tuple[World, int]:
    """Alice runs on 4 a100 GPUs (main job + 3 workers on gpu1); gpu2 is a 2-GPU v100 node. Her own figures
    say v100 is faster per GPU, but not at the 1 GPU she could hold there with Bob on the other one."""
    world = typed(World(tmp_path, across()))
    world.fake.nodes["gpu2"].gpus = 2
    main_a, array_a, dir_a = elastic(world, A, "gpu1", workers=3)
    for i in range(3):
        world.fake.start(world.fake.task(f"{array_a}_{i}").job_id, "gpu1", int(NOW - 500))
    reports(dir_a, main_a, [("v100", 1, 3.0), ("v100", 2, 5.8), ("a100", 4, 7.6)])
    checkpointed(dir_a, main_a)
    if bob:  # Bob's word: a hundred times faster on a100, so the policy would like him there and Alice away
        main_b, _, dir_b = elastic(world, B, "gpu2", uid=ME + 4242, user="bob", workers=3)
        reports(dir_b, main_b, [("a100", 1, 100.0), ("v100", 1, 1.0)])
        checkpointed(dir_b, main_b)
    return world, main_a


@pytest.mark.parametrize("bob", [False, True])
def test_another_users_claims_never_move_a_job_to_a_kind_with_room_for_fewer_of_its_gpus(
        tmp_path: Path, bob: bool) -> None:
    world, main_a = _alice_on_four_a100s(tmp_path, bob)
    agent = world.agent()
    agent.tick(NOW)
    agent.tick(NOW + 5)
    assert world.fake.jobs[main_a].signals == [], decisions(world, A)
    assert world.fake.jobs[main_a].options["gres"] == "gpu:1"


def test_the_gpus_a_released_kind_move_takes_are_not_given_to_another_jobs_growth(tmp_path: Path) -> None:
    world = typed(World(tmp_path, across()))
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    # Eight times faster on v100: the move is worth more than either job's growth, whatever the policy's
    # weighting of the two jobs' attained service.
    reports(job_dir, main, [("v100", 1, 16.0), ("a100", 1, 2.0)])
    checkpointed(job_dir, main)
    main_b, array_b, dir_b = elastic(world, B, "gpu2", uid=ME + 4242, user="bob", workers=3)
    reports(dir_b, main_b, [("a100", 1, 1.0), ("a100", 2, 2.0), ("v100", 1, 4.0), ("v100", 2, 8.0),
                            ("v100", 3, 12.0)])
    checkpointed(dir_b, main_b)
    agent = world.agent()
    agent.tick(NOW)
    assert world.fake.jobs[main].signals == ["USR2"], decisions(world, A)
    world.batch_script_moves(job_dir, main)

    def start_bobs_released_workers() -> None:  # Slurm starts them on the nodes they were pointed at
        for handle in (f"{array_b}_{i}" for i in range(3)):
            task = world.fake.task(handle)
            pointed = [c[-1].split("=")[1] for c in world.fake.calls if c[:2] == ["scontrol", "update"]
                       and f"jobid={handle}" in c and c[-1].startswith("ReqNodeList=")]
            if task.state == "PENDING" and task.reason == "None" and pointed:
                world.fake.start(task.job_id, pointed[-1], int(NOW + 3))

    start_bobs_released_workers()
    agent.tick(NOW + 5)  # Alice: retargeted onto gres:gpu:v100:1 and released
    start_bobs_released_workers()
    assert world.fake.jobs[main].options["gres"] == "gpu:v100:1"
    assert world.fake.nodes["gpu2"].gpus_used < 4, "no v100 left for the released main job"


def test_a_job_moved_between_kinds_is_not_moved_back_before_the_restart_pays(tmp_path: Path) -> None:
    world = typed(World(tmp_path, across()))
    main, _, job_dir = elastic(world, A, "gpu1", workers=1)
    reports(job_dir, main, [("v100", 1, 8.0), ("a100", 1, 2.0)], end=NOW)
    checkpointed(job_dir, main)
    agent = world.agent()
    agent.tick(NOW)
    assert world.fake.jobs[main].signals.count("USR2") == 1
    world.batch_script_moves(job_dir, main)
    agent.tick(NOW + 5)
    world.fake.start(main, "gpu2", int(NOW + 10))
    agent.tick(NOW + 10)
    # Its figures now say the opposite, as strongly: 20 s after it started on v100 it stays there.
    reports(job_dir, main, [("a100", 1, 8.0), ("v100", 1, 2.0)], end=NOW + 29)
    agent.tick(NOW + 30)
    assert world.fake.jobs[main].signals.count("USR2") == 1, decisions(world, A)[-3:]
    assert any("stays on v100" in d for d in decisions(world, A)), decisions(world, A)[-3:]


DIGEST = "0123456789abcdef0123456789abcdef"


def _job(dlsub_id: str, uid: int, gpu_type: str | None = "a100") -> ElasticJob:
    return ElasticJob(dlsub_id=dlsub_id, slurm_job_id=1, uid=uid, user="u", state="RUNNING", ended=False,
                      partition="gpu", gpus_per_node=1, min_members=1, max_members=4, submit_time=0.0,
                      worker_arrays=(), worker_gpus=1, gpu_type=gpu_type)


def _alice(sizes: list[int]) -> Progress:
    return Progress(step=10, configs=tuple(MeasuredConfig(1, n, 64, 1, 2.0 * n ** 0.9, 128.0 * n ** 0.9, "a100")
                                           for n in sizes), application=DIGEST, gpu_type="a100")


def test_another_users_jobs_never_push_out_what_a_users_earlier_runs_lend() -> None:
    models = LiveModels()
    models.scaled(_job("0000a001", 1000), _alice([1, 2, 4]), 1e9, None)  # Alice's first run
    for i in range(4 * HISTORY_COMMANDS_PER_USER):  # Bob: a new made-up kind in each start event, and commands
        models.scaled(_job("0000b001", 2000, gpu_type=None), Progress(application=DIGEST, gpu_type=f"k{i}"), 1e9,
                      None)
        models.scaled(_job(f"{i:08x}", 2000), Progress(step=1, configs=_alice([1]).configs,
                                                       application=f"{i:032x}", gpu_type="a100"), 1e9, None)
    assert models.scaled(_job("0000a002", 1000), _alice([1]), 1e9, None).borrowed > 0


def _measured(kind: str, samples_per_s: float) -> Progress:
    """One GPU at batch 64 on ``kind`` (its latest start there), ``samples_per_s`` samples a second."""
    return Progress(step=10, configs=(MeasuredConfig(1, 1, 64, 1, samples_per_s / 64, samples_per_s, kind),),
                    application=DIGEST, gpu_type=kind)


def test_a_job_moved_onto_another_kind_lends_its_next_run_nothing_of_the_old_kinds_speed_there() -> None:
    """A move's requeue onto gres:gpu:v100 is seen before the job's first start there: its latest start still
    names a100, and its a100 speed is not recorded as its command's speed on v100, what the command's next
    job is placed by (CI, once: a job 4x faster on v100 was told "a100 1.00x, v100 1.00x" and placed on a100)."""
    models = LiveModels()
    kinds = ("a100", "v100")
    models.scaled(_job("0000e001", 1000, gpu_type="v100"), _measured("v100", 240.0), 1e9, None, kinds)  # a profile
    moved = models.scaled(_job("0000a001", 1000, gpu_type="v100"), _measured("a100", 60.0), 1e9, None, kinds)
    assert moved.gpu_type == "v100" and moved.measured == {}, "nothing measured on v100 yet"
    nothing_yet = Progress(application=DIGEST)
    rates = models.scaled(_job("0000a002", 1000, gpu_type=None), nothing_yet, 1e9, None, kinds).view.type_rates
    assert rates is not None and rates["v100"] > 3 * rates["a100"], rates
